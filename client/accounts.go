package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"
)

// AccountLimits are an account's limits. In Account.Limits every field is
// set (0 means unlimited); in Account.Overrides and SetAccountLimits only
// the account's own ones are: nil takes (or keeps) the server's default.
type AccountLimits struct {
	MaxSandboxes          *int64   `json:"max_sandboxes,omitempty"`
	RequestsPerMinute     *int64   `json:"requests_per_minute,omitempty"`
	ExecutionsPerMinute   *int64   `json:"executions_per_minute,omitempty"`
	MonthlySandboxSeconds *int64   `json:"monthly_sandbox_seconds,omitempty"`
	MonthlyCPUSeconds     *int64   `json:"monthly_cpu_seconds,omitempty"`
	MonthlyGBSeconds      *int64   `json:"monthly_gb_seconds,omitempty"`
	MonthlyExecutions     *int64   `json:"monthly_executions,omitempty"`
	MaxCPUs               *float64 `json:"max_cpus,omitempty"`
	MaxMemoryMB           *int64   `json:"max_memory_mb,omitempty"`
	MaxDiskMB             *int64   `json:"max_disk_mb,omitempty"`
	MaxTimeout            *int64   `json:"max_timeout,omitempty"` // seconds
}

// Int makes an *int64 for AccountLimits.
func Int(v int64) *int64 { return &v }

// Float makes a *float64 for AccountLimits.MaxCPUs.
func Float(v float64) *float64 { return &v }

// MonthUsage is an account's usage this month, which its quotas count.
type MonthUsage struct {
	Start   time.Time `json:"start"`
	ResetAt time.Time `json:"reset_at"`
	Usage   struct {
		SandboxSeconds float64 `json:"sandbox_seconds"`
		CPUSeconds     float64 `json:"cpu_seconds"`
		GBSeconds      float64 `json:"gb_seconds"`
		Executions     int64   `json:"executions"`
	} `json:"usage"`
}

// Credits are an account's credits in micro-units of the operator's
// currency; BalanceMicros is the ledger's sum.
type Credits struct {
	Balance         string `json:"balance"`
	BalanceMicros   int64  `json:"balance_micros"`
	FreeMicros      int64  `json:"free_micros"`
	FreeLeftMicros  int64  `json:"free_left_micros"`
	GrantedMicros   int64  `json:"granted_micros"`
	SpentMicros     int64  `json:"spent_micros"`
	PendingMicros   int64  `json:"pending_micros"`
	AvailableMicros int64  `json:"available_micros"`
	Enforced        bool   `json:"enforced"`
}

// AccountKey is a key of an account (never its secret).
type AccountKey struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Account is an account as the server describes it.
type Account struct {
	ID               string        `json:"id"`
	Name             string        `json:"name"`
	CreatedAt        time.Time     `json:"created_at"`
	Limits           AccountLimits `json:"limits"`
	Overrides        AccountLimits `json:"overrides"`
	RunningSandboxes int64         `json:"running_sandboxes"`
	Month            MonthUsage    `json:"month"`
	Credits          *Credits      `json:"credits,omitempty"`
	Storage          *Storage      `json:"storage,omitempty"`
	Keys             []AccountKey  `json:"keys,omitempty"`
}

// Storage is what an account keeps in the server's database: records and
// bytes (a record's text plus 128) in all, and by kind ("sandboxes",
// "executions", "events", "alerts", "deliveries") with the most the
// account may keep of each (0: no bound). Past a bound the account loses
// its own oldest records of that kind; a new alert with none
// acknowledged is ErrStorageQuotaExceeded.
type Storage struct {
	Records int64                   `json:"records"`
	Bytes   int64                   `json:"bytes"`
	Kinds   map[string]StoredAmount `json:"kinds"`
}

// StoredAmount is one kind of an account's records and its bounds.
type StoredAmount struct {
	Records    int64 `json:"records"`
	Bytes      int64 `json:"bytes"`
	MaxRecords int64 `json:"max_records"`
	MaxBytes   int64 `json:"max_bytes"`
}

// Account returns the caller's own account.
func (c *Client) Account(ctx context.Context) (*Account, error) {
	var a Account
	return &a, c.call(ctx, request{method: "GET", path: "/v1/account"}, &a)
}

// Credits returns the caller's credits.
func (c *Client) Credits(ctx context.Context) (*Credits, error) {
	var cr Credits
	return &cr, c.call(ctx, request{method: "GET", path: "/v1/account/credits"}, &cr)
}

// UsageFigures are metered usage with its estimated cost.
type UsageFigures struct {
	SandboxSeconds    float64 `json:"sandbox_seconds"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	GBSecondsReserved float64 `json:"gb_seconds_reserved"`
	GBSecondsUsed     float64 `json:"gb_seconds_used"`
	DiskPeakBytes     int64   `json:"disk_peak_bytes"`
	Executions        int64   `json:"executions"`
	Commands          int64   `json:"commands"`
	EgressRequests    int64   `json:"egress_requests"`  // through the egress gateway
	EgressBytesIn     int64   `json:"egress_bytes_in"`  // carried by the egress gateway to the sandbox
	EgressBytesOut    int64   `json:"egress_bytes_out"` // and from it
	// StorageGBSeconds is what the account kept in the server's
	// database over time (in the total, and in groups by hour or day).
	StorageGBSeconds float64 `json:"storage_gb_seconds"`
	// PausedGBSeconds is what paused sandboxes' checkpoints and kept
	// disks held over time, charged at the storage price.
	PausedGBSeconds float64 `json:"paused_gb_seconds"`
	CostMicros      int64   `json:"cost_micros"`
	Cost            string  `json:"cost"`
}

// StorageFigures are an account's storage in a usage report.
type StorageFigures struct {
	GBSeconds  float64 `json:"gb_seconds"`
	CostMicros int64   `json:"cost_micros"`
	Cost       string  `json:"cost"`
}

// UsageGroup is one group of a usage report.
type UsageGroup struct {
	Key       string `json:"key"` // a day, an hour, a sandbox id or a template
	Template  string `json:"template,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	UsageFigures
}

// Prices are the operator's price table, in micro-units.
type Prices struct {
	CPUSecondMicros float64 `json:"cpu_second_micros"`
	GBSecondMicros  float64 `json:"gb_second_micros"`
	ExecutionMicros float64 `json:"execution_micros"`
	StorageGBSecond float64 `json:"storage_gb_second_micros"` // records kept in the server's database
}

// UsageReport is GET /v1/account/usage.
type UsageReport struct {
	From    time.Time    `json:"from"`
	To      time.Time    `json:"to"`
	GroupBy string       `json:"group_by"`
	Groups  []UsageGroup `json:"groups"`
	Total   UsageFigures `json:"total"`
	Prices  Prices       `json:"prices"`
	// Storage is what the account kept in the server's database in the
	// period (its records), in Total too.
	Storage StorageFigures `json:"storage"`
	// Model tokens in the period; TokensLimit is the configured models'
	// monthly quotas summed (nil: some model has none).
	TokensUsed  int64        `json:"tokens_used"`
	TokensLimit *int64       `json:"tokens_limit"`
	Models      []ModelUsage `json:"models"`
}

// ModelUsage is the account's tokens of one model.
type ModelUsage struct {
	Model            string `json:"model"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	MonthlyLimit     *int64 `json:"monthly_limit"`
	CostMicros       int64  `json:"cost_micros"`
	Cost             string `json:"cost"`
}

// UsageQuery selects a usage report; zero fields take the server's
// defaults (this month, by day).
type UsageQuery struct {
	From, To time.Time
	GroupBy  string // day, hour, sandbox or template
}

// Usage returns the caller's account's metered usage.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (*UsageReport, error) {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339))
	}
	if q.GroupBy != "" {
		v.Set("group_by", q.GroupBy)
	}
	var r UsageReport
	return &r, c.call(ctx, request{method: "GET", path: "/v1/account/usage", query: v}, &r)
}

// SandboxUsage is one sandbox's usage; Live while it runs.
type SandboxUsage struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	Live      bool   `json:"live"`
	UsageFigures
}

// SandboxUsage returns one sandbox's usage so far.
func (c *Client) SandboxUsage(ctx context.Context, id string) (*SandboxUsage, error) {
	var u SandboxUsage
	return &u, c.call(ctx, request{method: "GET", path: sandboxPath(id, "usage")}, &u)
}

// Alert is something an account should look at.
type Alert struct {
	ID             string     `json:"id"`
	Severity       string     `json:"severity"` // low, medium, high, critical
	Kind           string     `json:"kind"`     // manual, quota, credits, security_violation
	Message        string     `json:"message"`
	SandboxID      string     `json:"sandbox_id,omitempty"`
	SessionID      string     `json:"session_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	Acknowledged   bool       `json:"acknowledged"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
}

// AlertRequest raises an alert.
type AlertRequest struct {
	Severity  string `json:"severity"`
	Message   string `json:"message"`
	SandboxID string `json:"sandbox_id,omitempty"`
	SessionID string `json:"session_id,omitempty"`
}

// CreateAlert raises an alert on the caller's account.
func (c *Client) CreateAlert(ctx context.Context, req AlertRequest) (*Alert, error) {
	var a Alert
	return &a, c.call(ctx, request{method: "POST", path: "/v1/alerts", json: req}, &a)
}

// Alerts lists the account's alerts, newest first.
func (c *Client) Alerts(ctx context.Context, unacknowledgedOnly bool) ([]Alert, error) {
	var out struct {
		Alerts []Alert `json:"alerts"`
	}
	v := url.Values{"unacknowledged": {strconv.FormatBool(unacknowledgedOnly)}}
	return out.Alerts, c.call(ctx, request{method: "GET", path: "/v1/alerts", query: v}, &out)
}

// AckAlert acknowledges an alert.
func (c *Client) AckAlert(ctx context.Context, id string) (*Alert, error) {
	var a Alert
	return &a, c.call(ctx, request{method: "POST", path: "/v1/alerts/" + url.PathEscape(id) + "/ack"}, &a)
}

// Admin calls: they need an admin key.

// CreateAccount creates an account with its own limits (nil: defaults).
func (c *Client) CreateAccount(ctx context.Context, name string, limits *AccountLimits) (*Account, error) {
	var a Account
	body := map[string]any{"name": name}
	if limits != nil {
		body["limits"] = limits
	}
	return &a, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts", json: body}, &a)
}

// ListAccounts lists every account.
func (c *Client) ListAccounts(ctx context.Context) ([]Account, error) {
	var out struct {
		Accounts []Account `json:"accounts"`
	}
	return out.Accounts, c.call(ctx, request{method: "GET", path: "/v1/admin/accounts"}, &out)
}

// GetAccount returns an account (by name or id) with its keys.
func (c *Client) GetAccount(ctx context.Context, account string) (*Account, error) {
	var a Account
	return &a, c.call(ctx, request{method: "GET", path: "/v1/admin/accounts/" + url.PathEscape(account)}, &a)
}

// SetAccountLimits sets the given limits of an account; the names in
// reset ("max_cpus", ...) go back to the server's defaults.
func (c *Client) SetAccountLimits(ctx context.Context, account string, set AccountLimits, reset ...string) (*Account, error) {
	body := map[string]any{}
	b, err := jsonObject(set)
	if err != nil {
		return nil, err
	}
	for k, v := range b {
		body[k] = v
	}
	for _, r := range reset {
		body[r] = nil
	}
	var a Account
	return &a, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts/" + url.PathEscape(account) + "/limits", json: body}, &a)
}

// CreditAccount grants credits (a decimal amount such as "25.00";
// negative takes them back).
func (c *Client) CreditAccount(ctx context.Context, account, amount, reason string) (*Credits, error) {
	var cr Credits
	return &cr, c.call(ctx, request{method: "POST", path: "/v1/admin/accounts/" + url.PathEscape(account) + "/credits",
		json: map[string]any{"amount": amount, "reason": reason}}, &cr)
}

// KeyRequest describes a new key of an account.
type KeyRequest struct {
	Account string `json:"account"`
	Name    string `json:"name,omitempty"`
	Admin   bool   `json:"admin,omitempty"`
	E2B     bool   `json:"e2b,omitempty"`
}

// NewKey is a created key; Key is its secret, shown only here.
type NewKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Account   string    `json:"account"`
	AccountID string    `json:"account_id"`
	Role      string    `json:"role"`
	CreatedAt time.Time `json:"created_at"`
	Key       string    `json:"key"`
}

// CreateKey creates a key of an account.
func (c *Client) CreateKey(ctx context.Context, req KeyRequest) (*NewKey, error) {
	var k NewKey
	return &k, c.call(ctx, request{method: "POST", path: "/v1/admin/keys", json: req}, &k)
}

// jsonObject turns a struct into its JSON object's fields.
func jsonObject(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}
