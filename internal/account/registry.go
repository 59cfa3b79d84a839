package account

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/ratelimit"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Config is the server's account settings. Zero fields take the defaults
// in brackets.
type Config struct {
	// Defaults are the limits of every account that does not override
	// them [unlimited, except what the engine bounds].
	Defaults Limits `toml:"defaults"`
	// FreeCreditsMicros are the credits a new account starts with, in
	// micro-units of the operator's currency [0].
	FreeCreditsMicros int64 `toml:"free_credits_micros"`
	// EnforceCredits refuses new sandboxes, executions and commands of an
	// account whose balance is zero or less, and stops its running
	// sandboxes after CreditsGrace [off].
	EnforceCredits bool `toml:"enforce_credits"`
	// CreditsGrace is how long an account's sandboxes keep running once
	// its credits are exhausted [5m].
	CreditsGrace time.Duration `toml:"credits_grace"`
	// CreditsLowMicros raises a "credits low" alert when a balance falls
	// under it (with EnforceCredits) [1000000: one unit].
	CreditsLowMicros int64 `toml:"credits_low_micros"`
	// SecurityAlertSeverity is the least severity of a security_violation
	// that raises an alert: low, medium, high or critical; "none" turns
	// them off [high].
	SecurityAlertSeverity string `toml:"security_alert_severity"`
	// SharedStore says other servers share the store (PostgreSQL): the
	// concurrent cap and the monthly executions quota are then counted
	// in the store too, one transaction each, and the per-minute
	// requests and executions in the store only (store.RateStore, one
	// statement each). A store of one server (SQLite) leaves them to
	// this server's exact in-memory counts, off the request's path.
	SharedStore bool `toml:"-"`
}

// Validate checks the settings, naming the field at fault.
func (c *Config) Validate() error {
	if err := c.Defaults.Validate(); err != nil {
		return err
	}
	if c.FreeCreditsMicros < 0 {
		return errors.New("free_credits_micros must not be negative")
	}
	if c.CreditsGrace < 0 {
		return errors.New("credits_grace must not be negative")
	}
	if c.CreditsGrace == 0 {
		c.CreditsGrace = 5 * time.Minute
	}
	if c.CreditsLowMicros < 0 {
		return errors.New("credits_low_micros must not be negative")
	}
	if c.CreditsLowMicros == 0 {
		c.CreditsLowMicros = 1e6
	}
	switch c.SecurityAlertSeverity {
	case "":
		c.SecurityAlertSeverity = "high"
	case "none", "low", "medium", "high", "critical":
	default:
		return errors.New("security_alert_severity must be low, medium, high, critical or none")
	}
	return nil
}

// Usage is what an account used in a month (or a sandbox in its life).
type Usage struct {
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	GBSeconds      float64 `json:"gb_seconds"` // memory reserved (limit × time)
	Executions     int64   `json:"executions"`
}

func (u *Usage) add(d Usage) {
	u.SandboxSeconds += d.SandboxSeconds
	u.CPUSeconds += d.CPUSeconds
	u.GBSeconds += d.GBSeconds
	u.Executions += d.Executions
}

// Store is what the registry reads and counts in: accounts, usage and
// credits, and the admissions and rates every server sharing the store
// must see.
type Store interface {
	store.AccountStore
	store.AdmissionStore
	store.RateStore
}

// storeTimeout bounds an admission's round trip to the store.
const storeTimeout = 10 * time.Second

// Registry holds every account the server has seen.
type Registry struct {
	cfg Config
	st  Store
	now func() time.Time

	// mu guards accounts.
	mu       sync.RWMutex
	accounts map[string]*Account
}

// NewRegistry returns a Registry over a store; cfg must be valid.
func NewRegistry(cfg Config, st Store) *Registry {
	return &Registry{cfg: cfg, st: st, now: time.Now, accounts: map[string]*Account{}}
}

// Config returns the settings.
func (r *Registry) Config() Config { return r.cfg }

// Account is one account's live state.
type Account struct {
	ID string
	r  *Registry

	// mu guards the fields below.
	mu          sync.Mutex
	overrides   Overrides
	limits      Limits
	runtime     string // the default runtime of its sandboxes ("" the server's)
	locked      bool   // runtime is the only one they may run under
	requests    ratelimit.Bucket
	executions  ratelimit.Bucket
	running     int64 // sandboxes counted against MaxSandboxes
	month       time.Time
	used        Usage     // this month, unflushed included
	ledger      int64     // the ledger's sum as last read, plus grants since
	owed        float64   // cost accrued and not yet in the ledger, micro-units
	held        float64   // cost reserved by work running (HoldCredits), micro-units
	exhaustedAt time.Time // when the balance last reached zero; zero while positive
	// changes counts the changes made here (SetOverrides, Granted): a
	// Refresh that read the store before one of them must not undo it.
	changes uint64
}

// Get returns the account's live state, reading the account from the
// store the first time. An unknown account is store.ErrNotFound.
func (r *Registry) Get(ctx context.Context, id string) (*Account, error) {
	r.mu.RLock()
	a := r.accounts[id]
	r.mu.RUnlock()
	if a != nil {
		return a, nil
	}
	rec, err := r.st.Account(ctx, id)
	if err != nil {
		return nil, err
	}
	ct, err := r.st.CreditTotals(ctx, id)
	if err != nil {
		return nil, err
	}
	now := r.now()
	rows, err := r.st.QueryUsage(ctx, store.UsageFilter{Account: id, From: MonthStart(now), GroupBy: store.GroupNone})
	if err != nil {
		return nil, err
	}
	a = &Account{ID: id, r: r, month: MonthStart(now), ledger: ct.Balance(), runtime: rec.Runtime, locked: rec.RuntimeLocked}
	if err := a.setOverridesJSON(rec.Limits); err != nil {
		return nil, err
	}
	for _, row := range rows {
		a.used.add(usageOf(row.UsageDelta))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.accounts[id]; b != nil {
		return b, nil // loaded concurrently
	}
	r.accounts[id] = a
	return a, nil
}

func usageOf(d store.UsageDelta) Usage {
	return Usage{SandboxSeconds: float64(d.WallNanos) / 1e9, CPUSeconds: float64(d.CPUNanos) / 1e9,
		GBSeconds: d.GBSecondsReserved, Executions: d.Executions}
}

// Refresh re-reads every known account's limits and balance from the
// store (the CLI changes the database directly). The meter calls it
// right after a flush, so that no cost is both in the ledger and owed.
// An account changed through this registry while the store was being read
// keeps its newer state (the next Refresh reads it from the store).
func (r *Registry) Refresh(ctx context.Context) error {
	before := map[*Account]uint64{}
	r.Each(func(a *Account) {
		a.mu.Lock()
		before[a] = a.changes
		a.mu.Unlock()
	})
	accts, err := r.st.ListAccounts(ctx)
	if err != nil {
		return err
	}
	bal, err := r.st.Balances(ctx)
	if err != nil {
		return err
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, rec := range accts {
		a := r.accounts[rec.ID]
		seen, ok := before[a]
		if a == nil || !ok {
			continue // loaded from the store after the snapshot: current
		}
		o, err := ParseOverrides(rec.Limits)
		if err != nil {
			return err
		}
		a.mu.Lock()
		if a.changes == seen {
			a.overrides, a.limits = o, o.Apply(r.cfg.Defaults)
			a.ledger = bal[rec.ID]
			a.runtime, a.locked = rec.Runtime, rec.RuntimeLocked
		}
		a.mu.Unlock()
	}
	return nil
}

// Each calls f for every loaded account.
func (r *Registry) Each(f func(a *Account)) {
	r.mu.RLock()
	all := make([]*Account, 0, len(r.accounts))
	for _, a := range r.accounts {
		all = append(all, a)
	}
	r.mu.RUnlock()
	for _, a := range all {
		f(a)
	}
}

func (a *Account) setOverridesJSON(b []byte) error {
	o, err := ParseOverrides(b)
	if err != nil {
		return err
	}
	a.SetOverrides(o)
	return nil
}

// Runtime is the default runtime of the account's sandboxes ("" the
// server's) and whether it is the only one they may run under
// (store.Account.Runtime).
func (a *Account) Runtime() (name string, locked bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runtime, a.locked
}

// SetRuntime replaces the account's runtime (after the store has).
func (a *Account) SetRuntime(name string, locked bool) {
	a.mu.Lock()
	a.runtime, a.locked = name, locked
	a.changes++
	a.mu.Unlock()
}

// SetOverrides replaces the account's own limits (after the store has).
func (a *Account) SetOverrides(o Overrides) {
	a.mu.Lock()
	a.overrides = o
	a.limits = o.Apply(a.r.cfg.Defaults)
	a.changes++
	a.mu.Unlock()
}

// Limits returns the account's effective limits and its own overrides.
func (a *Account) Limits() (Limits, Overrides) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limits, a.overrides
}

// RateResult is the outcome of one request against the account's
// per-minute budget.
type RateResult = ratelimit.Result

// AllowRequest takes one API request from the account's budget: the
// result says whether it is allowed, and the error is the store's when
// the budget is counted there (Config.SharedStore) and could not be (see
// rateError).
func (a *Account) AllowRequest(ctx context.Context) (RateResult, error) {
	now := a.r.now()
	a.mu.Lock()
	limit := a.limits.RequestsPerMinute
	if !a.r.cfg.SharedStore || limit <= 0 {
		res := a.requests.Take(now, limit)
		a.mu.Unlock()
		return res, nil
	}
	a.mu.Unlock()
	return a.takeShared(ctx, "requests", limit, now)
}

// takeShared takes one token from the account's what bucket of limit a
// minute in the store, which every server sharing it counts in.
//
// A take the store cannot count fails closed: the request or execution is
// refused with the store's error, which the server answers as any other
// it cannot reach its store for (ERR_STORAGE_UNAVAILABLE, 503, Retry-After
// 1, when the database is busy or unreachable; ERR_INTERNAL otherwise).
// Its key was read from the same store a moment before (internal/auth),
// so a server that fails here could not have served it anyway, and
// failing open would lift the limit for every server exactly when the
// database is under strain.
func (a *Account) takeShared(ctx context.Context, what string, limit int64, now time.Time) (RateResult, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	t, err := a.r.st.TakeRate(ctx, what+"/"+a.ID, 1, limit, ratelimit.Interval(limit), now)
	if err != nil {
		return RateResult{}, rateError(parent, what, err)
	}
	return ratelimit.Stored(now, t.Full, t.Allowed, limit, 1), nil
}

// rateError is the error of a per-minute budget the store could not count.
func rateError(parent context.Context, what string, err error) error {
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil {
		// The database is busy, failing or out of reach (storeTimeout).
		return &apierr.Error{Code: apierr.StorageUnavailable, RetryAfter: time.Second, Err: err,
			Message: fmt.Sprintf("the %s per minute could not be counted: the server's database is busy or unavailable; retry later", what)}
	}
	return fmt.Errorf("count %s per minute: %w", what, err)
}

// RateLimitError is the error of a refused request.
func RateLimitError(res RateResult, what string) error {
	return &apierr.Error{Code: apierr.RateLimited, RetryAfter: res.RetryAfter,
		Message: fmt.Sprintf("rate limit of %d %s per minute reached; retry in %.1f s", res.Limit, what, res.RetryAfter.Seconds())}
}

// rollMonth starts a new month's totals when the month has changed; a.mu
// is held.
func (a *Account) rollMonth(now time.Time) {
	if m := MonthStart(now); !m.Equal(a.month) {
		a.month, a.used = m, Usage{}
	}
}

func quotaError(what string, limit int64, now time.Time) error {
	return apierr.New(apierr.SessionQuotaExceeded, "monthly %s quota of %d reached; it resets at %s",
		what, limit, NextMonth(now).Format(time.RFC3339))
}

// checkMonthly refuses when a monthly quota is used up; a.mu is held.
func (a *Account) checkMonthly(now time.Time, executions bool) error {
	a.rollMonth(now)
	l, u := a.limits, a.used
	switch {
	case l.MonthlySandboxSeconds > 0 && u.SandboxSeconds >= float64(l.MonthlySandboxSeconds):
		return quotaError("sandbox-seconds", l.MonthlySandboxSeconds, now)
	case l.MonthlyCPUSeconds > 0 && u.CPUSeconds >= float64(l.MonthlyCPUSeconds):
		return quotaError("cpu-seconds", l.MonthlyCPUSeconds, now)
	case l.MonthlyGBSeconds > 0 && u.GBSeconds >= float64(l.MonthlyGBSeconds):
		return quotaError("gb-seconds", l.MonthlyGBSeconds, now)
	case executions && l.MonthlyExecutions > 0 && u.Executions >= l.MonthlyExecutions:
		return quotaError("executions", l.MonthlyExecutions, now)
	}
	return nil
}

// checkWork refuses work when credits or a monthly quota are used up; a.mu
// is held.
func (a *Account) checkWork(now time.Time, execution bool) error {
	if err := a.checkCredits(); err != nil {
		return err
	}
	return a.checkMonthly(now, execution)
}

// checkCredits refuses when credits are enforced and used up, counting
// what work running holds; a.mu is held.
func (a *Account) checkCredits() error {
	if a.r.cfg.EnforceCredits && a.balanceLocked()-int64(math.Ceil(a.held)) <= 0 {
		return apierr.New(apierr.SessionQuotaExceeded, "credits exhausted: the account's balance is %s; ask the operator for a grant",
			FormatMicros(a.balanceLocked()))
	}
	return nil
}

// HoldCredits admits work whose cost is known only when it ends (a model
// completion) when credits are enforced: it refuses, as checkCredits,
// when the balance less what work already running holds is used up, and
// else holds micros of it until release is called (once the work's
// cost is accrued). Concurrent work thus passes the balance by at most
// one holding. Without enforcement it holds nothing.
func (a *Account) HoldCredits(micros float64) (release func(), err error) {
	if !a.r.cfg.EnforceCredits {
		return func() {}, nil
	}
	micros = max(micros, 0)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkCredits(); err != nil {
		return nil, err
	}
	a.held += micros
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.held = max(a.held-micros, 0)
			a.mu.Unlock()
		})
	}, nil
}

func (a *Account) balanceLocked() int64 { return bound.Add(a.ledger, -int64(math.Ceil(a.owed))) }

// CheckStart refuses what would refuse any new sandbox of the account
// now, whatever its concurrent cap: exhausted credits or a monthly quota
// reached. A batch checks it before its first item (its items wait for
// a slot of the cap instead).
func (a *Account) CheckStart() error {
	now := a.r.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkCredits(); err != nil {
		return err
	}
	return a.checkMonthly(now, false)
}

// AcquireSandbox counts a new sandbox against the account's limits:
// credits, monthly quotas and the concurrent cap. Release it with
// ReleaseSandbox once the sandbox has stopped (or failed to start).
//
// The cap is counted here, for this server, and, when the account has
// one and the store is shared (Config.SharedStore), in the store too: reserved says a slot was
// reserved there under holder, which the caller passes to its sandbox's
// record (store.ConfirmSandbox) or drops (store.DropReservation).
func (a *Account) AcquireSandbox(ctx context.Context, holder string) (reserved bool, err error) {
	now := a.r.now()
	a.mu.Lock()
	if err := a.checkCredits(); err != nil {
		a.mu.Unlock()
		return false, err
	}
	if err := a.checkMonthly(now, false); err != nil {
		a.mu.Unlock()
		return false, err
	}
	max := a.limits.MaxSandboxes
	if max > 0 && a.running >= max {
		a.mu.Unlock()
		return false, capError(max)
	}
	a.running++
	a.mu.Unlock()
	if max <= 0 || !a.r.cfg.SharedStore {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := a.r.st.ReserveSandbox(ctx, a.ID, holder, max, now); err != nil {
		a.ReleaseSandbox()
		if errors.Is(err, store.ErrLimit) {
			return false, capError(max) // another server's sandboxes fill it
		}
		return false, err
	}
	return true, nil
}

// ErrConcurrentCap is the cause (apierr.Error.Err, never sent) of a
// create refused because the account holds its concurrent sandboxes: it
// passes once one of them ends (internal/batch waits on it).
var ErrConcurrentCap = errors.New("account: concurrent sandbox limit reached")

func capError(max int64) error {
	return apierr.Wrap(ErrConcurrentCap, apierr.SessionQuotaExceeded, "concurrent sandbox limit of %d reached", max)
}

// ReleaseSandbox undoes one AcquireSandbox; on nil it does nothing.
func (a *Account) ReleaseSandbox() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.running--
	a.mu.Unlock()
}

// HoldSandbox counts a sandbox this server did not admit: one another
// server created in a store they share, served here now (ReleaseSandbox
// gives it back). The store's count, which admitted it, is unchanged.
func (a *Account) HoldSandbox() {
	a.mu.Lock()
	a.running++
	a.mu.Unlock()
}

// Running is how many sandboxes are counted against the concurrent cap.
func (a *Account) Running() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running
}

// AdmitWork checks an execution or a command against the account's
// per-minute budget, its monthly quotas and its credits, and counts an
// admitted execution against the monthly executions quota (the meter
// records it per sandbox; Accrue does not count executions again).
//
// With a shared store (Config.SharedStore) the per-minute budget is
// counted there (failing closed: takeShared), and with a monthly
// executions quota the store counts the execution too: both hold across
// servers.
func (a *Account) AdmitWork(execution bool) error {
	now := a.r.now()
	a.mu.Lock()
	if err := a.checkWork(now, execution); err != nil {
		a.mu.Unlock()
		return err
	}
	if limit := a.limits.ExecutionsPerMinute; limit > 0 && a.r.cfg.SharedStore {
		// The store's bucket, without holding a.mu; then the checks
		// again, and the count, in one step.
		a.mu.Unlock()
		res, err := a.takeShared(context.Background(), "executions", limit, now)
		if err != nil {
			return err
		}
		if !res.Allowed {
			return RateLimitError(res, "executions")
		}
		a.mu.Lock()
		if err := a.checkWork(now, execution); err != nil {
			a.mu.Unlock()
			return err
		}
	} else if limit > 0 {
		if res := a.executions.Take(now, limit); !res.Allowed {
			a.mu.Unlock()
			return RateLimitError(res, "executions")
		}
	}
	quota, month := a.limits.MonthlyExecutions, a.month
	if execution {
		a.used.Executions++ // counted here, so that the quota is exact under concurrency
	}
	a.mu.Unlock()
	if !execution || quota <= 0 || !a.r.cfg.SharedStore {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	err := a.r.st.CountExecution(ctx, a.ID, month, quota)
	if err == nil {
		return nil
	}
	a.mu.Lock()
	if a.month.Equal(month) {
		a.used.Executions--
	}
	a.mu.Unlock()
	if errors.Is(err, store.ErrLimit) {
		return quotaError("executions", quota, now) // other servers' executions used it up
	}
	return err
}

// CheckResources refuses a sandbox that asks for more than the account
// may have, naming the field. Zero arguments are not asked for.
func (a *Account) CheckResources(cpus float64, memoryMB, diskMB int64, timeout time.Duration) error {
	l, _ := a.Limits()
	switch {
	case l.MaxCPUs > 0 && cpus > l.MaxCPUs:
		return apierr.New(apierr.BadRequest, "resources.cpus of %g is above this account's max_cpus of %g", cpus, l.MaxCPUs)
	case l.MaxMemoryMB > 0 && memoryMB > l.MaxMemoryMB:
		return apierr.New(apierr.BadRequest, "resources.memory_mb of %d is above this account's max_memory_mb of %d", memoryMB, l.MaxMemoryMB)
	case l.MaxDiskMB > 0 && diskMB > l.MaxDiskMB:
		return apierr.New(apierr.BadRequest, "resources.disk_mb of %d is above this account's max_disk_mb of %d", diskMB, l.MaxDiskMB)
	case l.MaxTimeout > 0 && timeout > time.Duration(l.MaxTimeout)*time.Second:
		return apierr.New(apierr.BadRequest, "timeout of %g s is above this account's max_timeout of %d s", timeout.Seconds(), l.MaxTimeout)
	}
	return nil
}

// Accrue adds metered usage and its cost (micro-units) to the account;
// d.Executions is ignored (AdmitWork counted them).
func (a *Account) Accrue(d Usage, costMicros float64) {
	now := a.r.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rollMonth(now)
	d.Executions = 0
	a.used.add(d)
	// A cost is at most the largest amount (and never negative nor NaN):
	// the owed whole micro-units must fit the ledger's int64.
	a.owed = min(a.owed+bound.Clamp(costMicros, 0, float64(bound.MaxAmountMicros)), float64(bound.MaxAmountMicros))
	if a.balanceLocked() <= 0 {
		if a.exhaustedAt.IsZero() {
			a.exhaustedAt = now
		}
	} else {
		a.exhaustedAt = time.Time{}
	}
}

// TakeOwed returns the whole micro-units of cost accrued since the last
// call (the rest stays owed); the caller writes them to the ledger and
// calls Settled once it has.
func (a *Account) TakeOwed() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(math.Floor(a.owed))
}

// Settled records that micros of owed cost are now in the ledger.
func (a *Account) Settled(micros int64) {
	a.mu.Lock()
	a.owed -= float64(micros)
	a.ledger = bound.Add(a.ledger, -micros)
	a.mu.Unlock()
}

// Granted adds credits recorded in the ledger.
func (a *Account) Granted(micros int64) {
	a.mu.Lock()
	a.ledger = bound.Add(a.ledger, micros)
	a.changes++
	if a.balanceLocked() > 0 {
		a.exhaustedAt = time.Time{}
	}
	a.mu.Unlock()
}

// Balance is the account's credit balance now, in micro-units.
func (a *Account) Balance() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.balanceLocked()
}

// Exhausted reports whether credits are enforced and the account has had
// none for longer than the grace period: its sandboxes are to stop.
func (a *Account) Exhausted() bool {
	if !a.r.cfg.EnforceCredits {
		return false
	}
	now := a.r.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.balanceLocked() <= 0 && !a.exhaustedAt.IsZero() && now.Sub(a.exhaustedAt) >= a.r.cfg.CreditsGrace
}

// Month returns this month's usage so far and the limits.
func (a *Account) Month() (Usage, Limits) {
	now := a.r.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rollMonth(now)
	return a.used, a.limits
}

// FormatMicros renders micro-units as a decimal amount ("25.000000").
func FormatMicros(m int64) string {
	sign, u := "", uint64(m)
	if m < 0 {
		sign, u = "-", -u // also of math.MinInt64
	}
	return fmt.Sprintf("%s%d.%06d", sign, u/1e6, u%1e6)
}

// AmountRange says which amounts ParseAmount reads, for messages.
var AmountRange = fmt.Sprintf("a decimal amount with at most 6 decimals, from -%s to %s, such as \"25.00\"",
	FormatMicros(bound.MaxAmountMicros), FormatMicros(bound.MaxAmountMicros))

// ParseAmount reads a decimal amount ("25", "25.5", "0.000001", "-3") as
// micro-units: at most six decimals, and at most bound.MaxAmountMicros
// either way, so that no amount taken can overflow the sums it joins.
func ParseAmount(s string) (int64, error) {
	bad := fmt.Errorf("amount %.40q must be %s", s, AmountRange)
	var whole, frac int64
	intPart, fracPart, hasFrac := cut(s, '.')
	if intPart == "" && !hasFrac || len(fracPart) > 6 || hasFrac && fracPart == "" {
		return 0, bad
	}
	neg := false
	if len(intPart) > 0 && intPart[0] == '-' {
		neg, intPart = true, intPart[1:]
		if intPart == "" && !hasFrac {
			return 0, bad
		}
	}
	for _, c := range intPart {
		if c < '0' || c > '9' {
			return 0, bad
		}
		if whole = whole*10 + int64(c-'0'); whole > bound.MaxAmountMicros/1e6 {
			return 0, bad
		}
	}
	for i := 0; i < 6; i++ {
		frac *= 10
		if i < len(fracPart) {
			c := fracPart[i]
			if c < '0' || c > '9' {
				return 0, bad
			}
			frac += int64(c - '0')
		}
	}
	v := whole*1e6 + frac
	if v > bound.MaxAmountMicros {
		return 0, bad
	}
	if neg {
		v = -v
	}
	return v, nil
}

// CheckGrant refuses a grant of micros (ParseAmount's) that would take a
// balance of balance outside ±bound.MaxAmountMicros, naming field.
func CheckGrant(field string, balance, micros int64) error {
	if after := bound.Add(balance, micros); after > bound.MaxAmountMicros || after < -bound.MaxAmountMicros {
		return bound.Error(field, "would take the balance from %s to %s: a balance stays within ±%s",
			FormatMicros(balance), FormatMicros(after), FormatMicros(bound.MaxAmountMicros))
	}
	return nil
}

func cut(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// CheckCredits refuses work of an account without credits when credits
// are enforced (model completions check it; sandboxes use AdmitWork).
func (a *Account) CheckCredits() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checkCredits()
}
