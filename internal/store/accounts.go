package store

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"
)

// ErrExists reports a record whose unique name or key is taken.
var ErrExists = errors.New("store: already exists")

// Key roles.
const (
	RoleUser  = "user"  // uses the API for its account
	RoleAdmin = "admin" // also manages accounts (/v1/admin)
)

// Account owns keys, sandboxes, usage, credits and alerts. Its ID is the
// Owner of its keys and sandboxes.
type Account struct {
	ID        string
	Name      string
	CreatedAt time.Time
	// Limits are the account's overrides of the server's default limits,
	// a JSON object (internal/account.Limits); nil is {}.
	Limits json.RawMessage
	// Runtime is the runtime of the account's sandboxes whose request
	// and template name none ("" the server's default), and
	// RuntimeLocked makes it the only one they may run under. Set by
	// admin keys alone (SetAccountRuntime).
	Runtime       string
	RuntimeLocked bool
}

// UsageDelta is metered usage of one sandbox in one hour, added to what
// is stored (DiskPeakBytes is a high-water mark: the larger one stays).
type UsageDelta struct {
	SandboxID         string
	Account           string
	Template          string
	Hour              time.Time // the start of the hour, UTC
	WallNanos         int64
	CPUNanos          int64
	GBSecondsReserved float64
	GBSecondsUsed     float64
	DiskPeakBytes     int64
	Executions        int64
	Commands          int64
	EgressRequests    int64 // connections and plain HTTP requests through the egress gateway
	EgressBytesIn     int64 // bytes the egress gateway carried to the sandbox
	EgressBytesOut    int64 // bytes the egress gateway carried from the sandbox
	// StorageGBSeconds is what the account kept in the store over time
	// (StorageStore.StorageUsage): a report adds it, with no sandbox;
	// usage_hours has no such column.
	StorageGBSeconds float64
	// PausedGBSeconds is what the sandbox's checkpoint and kept disk
	// held while it was paused, over time (internal/metering).
	PausedGBSeconds float64
	// DeviceSeconds are the seconds the sandbox held devices, summed
	// over its devices (two GPUs for a second are two).
	DeviceSeconds float64
}

// Add adds d's figures to u's (the disk figure is a high-water mark);
// u's keys stay as they are.
func (u *UsageDelta) Add(d UsageDelta) {
	u.WallNanos += d.WallNanos
	u.CPUNanos += d.CPUNanos
	u.GBSecondsReserved += d.GBSecondsReserved
	u.GBSecondsUsed += d.GBSecondsUsed
	u.DiskPeakBytes = max(u.DiskPeakBytes, d.DiskPeakBytes)
	u.Executions += d.Executions
	u.Commands += d.Commands
	u.EgressRequests += d.EgressRequests
	u.EgressBytesIn += d.EgressBytesIn
	u.EgressBytesOut += d.EgressBytesOut
	u.StorageGBSeconds += d.StorageGBSeconds
	u.DeviceSeconds += d.DeviceSeconds
	u.PausedGBSeconds += d.PausedGBSeconds
}

// UsageRow is usage summed over a group: Key is the group's value (an
// hour or a day in RFC 3339, a sandbox id, a template name, an account).
type UsageRow struct {
	Key string
	UsageDelta
}

// Usage groupings.
const (
	GroupHour     = "hour"
	GroupDay      = "day"
	GroupSandbox  = "sandbox"
	GroupTemplate = "template"
	GroupAccount  = "account"
	GroupNone     = ""
)

// UsageFilter selects usage buckets: hours in [From, To).
type UsageFilter struct {
	Account   string // "" for every account
	SandboxID string // "" for every sandbox
	From, To  time.Time
	GroupBy   string
}

// Ledger kinds.
const (
	LedgerFree  = "free"  // free credits of a new account
	LedgerGrant = "grant" // an operator's grant
	LedgerUsage = "usage" // metered cost (negative)
)

// LedgerEntry is one grant or deduction of credits, in micro-units.
type LedgerEntry struct {
	ID           int64
	Account      string
	CreatedAt    time.Time
	Kind         string
	AmountMicros int64
	Reason       string
}

// CreditTotals sums an account's ledger by kind; the balance is their sum.
type CreditTotals struct {
	FreeMicros    int64
	GrantedMicros int64
	SpentMicros   int64 // positive: what usage cost
}

// Balance is what is left, stopping at the ends of int64 as the sums
// themselves do (SumMicros).
func (c CreditTotals) Balance() int64 {
	spent := -c.SpentMicros
	if c.SpentMicros == math.MinInt64 {
		spent = math.MaxInt64
	}
	return SumMicros(c.FreeMicros, c.GrantedMicros, spent)
}

// SumMicros adds amounts of money, stopping at the ends of int64 instead
// of wrapping: a ledger's sums never fail nor turn their sign, however
// large the entries a store was given (stores sum them in SQL the same
// way; the server bounds every amount it takes, internal/bound).
func SumMicros(v ...int64) int64 {
	var s int64
	for _, x := range v {
		switch t := s + x; {
		case s > 0 && x > 0 && t < 0:
			s = math.MaxInt64
		case s < 0 && x < 0 && t >= 0:
			s = math.MinInt64
		default:
			s = t
		}
	}
	return s
}

// Alert is something an account should look at.
type Alert struct {
	ID             string
	Account        string
	Severity       string
	Kind           string
	Message        string
	SandboxID      string
	SessionID      string
	DedupeKey      string // non-empty: at most one alert per account and key
	CreatedAt      time.Time
	AcknowledgedAt *time.Time
}

// AccountStore persists accounts, metered usage, the credit ledger and
// alerts.
type AccountStore interface {
	// CreateAccount fails with ErrExists when the id or name is taken.
	CreateAccount(ctx context.Context, a Account) error
	Account(ctx context.Context, id string) (Account, error)
	AccountByName(ctx context.Context, name string) (Account, error)
	ListAccounts(ctx context.Context) ([]Account, error)
	SetAccountLimits(ctx context.Context, id string, limits json.RawMessage) error
	// SetAccountRuntime sets an account's Runtime and RuntimeLocked;
	// ErrNotFound for an unknown account.
	SetAccountRuntime(ctx context.Context, id, runtime string, locked bool) error
	// CreateAccountKey creates an account (when it does not exist) and a
	// key of it, in one transaction; free credits, when positive, are the
	// new account's first ledger row.
	CreateAccountKey(ctx context.Context, a Account, k Key, freeMicros int64) error

	// AddUsage adds usage deltas and ledger entries in one transaction.
	AddUsage(ctx context.Context, deltas []UsageDelta, ledger []LedgerEntry) error
	QueryUsage(ctx context.Context, f UsageFilter) ([]UsageRow, error)

	AddLedger(ctx context.Context, e LedgerEntry) error
	CreditTotals(ctx context.Context, account string) (CreditTotals, error)
	// Balances returns every account's balance, by account id.
	Balances(ctx context.Context) (map[string]int64, error)

	// CreateAlert stores an alert; one with a DedupeKey the account already
	// has is not stored and reports false.
	CreateAlert(ctx context.Context, a Alert) (bool, error)
	ListAlerts(ctx context.Context, account string, unackedOnly bool) ([]Alert, error)
	AckAlert(ctx context.Context, account, id string, at time.Time) (Alert, error)
}
