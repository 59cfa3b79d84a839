// Package account keeps what the server knows about accounts while it
// runs: each account's effective limits (the server's defaults overridden
// per account), its request and execution token buckets, its running
// sandboxes, its usage this month and its credit balance. On a server
// alone with its store (SQLite) every check on the request path is in
// memory; the store is the record, read at start and refreshed in the
// background. Servers sharing a store (Config.SharedStore) count what
// must hold across them there too: the concurrent cap and the monthly
// executions (store.AdmissionStore), and the requests and executions per
// minute (store.RateStore; ratelimit.Stored gives their results).
//
// # Accounts and the request path
//
// An account (internal/store `accounts`, migration 0003) owns keys, sandboxes,
// usage, credits and alerts; its id is the `owner` keys and sandboxes already
// carried, so the migration only made one account per existing owner. Keys
// have a role: `user`, or `admin` (also `/v1/admin/...`).
// internal/account holds each account's live state in memory: effective limits
// (server defaults from `serve --account-*` flags, overridden per account),
// a token bucket (internal/ratelimit, the same bucket a sandbox's policy
// `rate_limiting.requests_per_minute` uses before each of its executions)
// for requests and one for executions, the count of running
// sandboxes, this month's usage and the credit balance. The request path only
// touches that memory (on a server alone with its store; servers sharing
// one count rate limits and caps there too, internal/store): the auth middleware takes one token (and sets the
// `X-RateLimit-*` headers), `create` grants the sandbox its resources (sandbox.Manager.Grant, "One ceiling" in internal/sandbox) and takes a slot of the concurrent cap before
// the engine starts anything and the engine's `Stopping` hook gives it back,
// and the engine's `Admit` hook (before every execution and command, /v1 and
// E2B alike) checks the executions budget, monthly quotas and credits. The
// store is the record: accounts are read on first use and refreshed after
// every metering flush (the CLI writes the database directly).
//
// # Credits and alerts
//
// Credits are a ledger (`credit_ledger`: free credits of a new account,
// grants, and metered cost written with each flush); the balance is always
// the ledger's sum, and the in-memory balance also subtracts cost accrued
// since the last flush. With `--enforce-credits`, an account at zero gets
// `ERR_SESSION_QUOTA_EXCEEDED` "credits exhausted" for new sandboxes,
// executions and commands, and its running sandboxes stop after
// `--credits-grace` (checked after each flush). Alerts (`alerts` table,
// `/v1/alerts`) are raised by callers and by rules run after each flush
// (monthly quotas at 80 % and 100 %, credits low or exhausted; a dedupe key
// makes each fire once per month or day) and by a bus hook on stored
// `security_violation` events at or above `--security-alert-severity`; each
// new alert is emitted as an `alert.created` event, so webhooks carry it.
//
// Imports: api (the wire's AccountLimits, whose fields Overrides has),
// internal/store, internal/apierr, internal/bound (the ranges of limits
// and amounts), internal/ratelimit (the token buckets) and the standard
// library.
package account

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/bound"
)

// Limits bound what an account may do. Zero means unlimited.
type Limits struct {
	MaxSandboxes          int64   `json:"max_sandboxes" toml:"max_sandboxes"`                     // running at once
	RequestsPerMinute     int64   `json:"requests_per_minute" toml:"requests_per_minute"`         // API requests
	ExecutionsPerMinute   int64   `json:"executions_per_minute" toml:"executions_per_minute"`     // executions and commands
	MonthlySandboxSeconds int64   `json:"monthly_sandbox_seconds" toml:"monthly_sandbox_seconds"` // wall seconds of sandboxes alive
	MonthlyCPUSeconds     int64   `json:"monthly_cpu_seconds" toml:"monthly_cpu_seconds"`
	MonthlyGBSeconds      int64   `json:"monthly_gb_seconds" toml:"monthly_gb_seconds"` // memory reserved
	MonthlyExecutions     int64   `json:"monthly_executions" toml:"monthly_executions"`
	MaxCPUs               float64 `json:"max_cpus" toml:"max_cpus"` // per sandbox
	MaxMemoryMB           int64   `json:"max_memory_mb" toml:"max_memory_mb"`
	MaxDiskMB             int64   `json:"max_disk_mb" toml:"max_disk_mb"`
	MaxTimeout            int64   `json:"max_timeout" toml:"max_timeout"` // a sandbox's lifetime, seconds
	MaxDevices            int64   `json:"max_devices" toml:"max_devices"` // held by its live sandboxes at once
}

// Overrides are an account's own limits; nil fields take the server's
// defaults. This is what the store keeps (store.Account.Limits).
//
// Its fields are the API's AccountLimits (api), which shows them: a type
// of its own for its methods, of the same fields and JSON names.
type Overrides api.AccountLimits

// ints lists the integer fields with their JSON names and largest
// values, for validation and merging in one place.
func (o *Overrides) ints() []struct {
	name string
	p    **int64
	most int64
} {
	return []struct {
		name string
		p    **int64
		most int64
	}{
		{"max_sandboxes", &o.MaxSandboxes, bound.MaxSandboxes}, {"requests_per_minute", &o.RequestsPerMinute, bound.MaxRate},
		{"executions_per_minute", &o.ExecutionsPerMinute, bound.MaxRate}, {"monthly_sandbox_seconds", &o.MonthlySandboxSeconds, bound.MaxCount},
		{"monthly_cpu_seconds", &o.MonthlyCPUSeconds, bound.MaxCount}, {"monthly_gb_seconds", &o.MonthlyGBSeconds, bound.MaxCount},
		{"monthly_executions", &o.MonthlyExecutions, bound.MaxCount}, {"max_memory_mb", &o.MaxMemoryMB, bound.MaxMB},
		{"max_disk_mb", &o.MaxDiskMB, bound.MaxMB}, {"max_timeout", &o.MaxTimeout, int64(bound.MaxDuration / time.Second)},
		{"max_devices", &o.MaxDevices, bound.MaxSandboxes},
	}
}

// Validate reports the first bad value, naming its field: a limit is
// from 0 (unlimited) to its largest value (internal/bound), beyond which
// it would overflow what it bounds (a lifetime in nanoseconds, a bucket
// of tokens, megabytes in bytes).
func (o Overrides) Validate() error {
	for _, f := range o.ints() {
		switch v := *f.p; {
		case v == nil:
		case *v < 0:
			return bound.Error(f.name, "must not be negative (0 means unlimited)")
		case *v > f.most:
			return bound.Error(f.name, "must be at most %d (0 means unlimited)", f.most)
		}
	}
	if o.MaxCPUs != nil && (*o.MaxCPUs < 0 || math.IsNaN(*o.MaxCPUs) || math.IsInf(*o.MaxCPUs, 0)) {
		return bound.Error("max_cpus", "must not be negative (0 means unlimited)")
	}
	if o.MaxCPUs != nil && *o.MaxCPUs > bound.MaxCPUs {
		return bound.Error("max_cpus", "must be at most %d (0 means unlimited)", bound.MaxCPUs)
	}
	return nil
}

// Merge returns o with the fields set in n replacing its own.
func (o Overrides) Merge(n Overrides) Overrides {
	out := o
	src := n
	dst := out.ints()
	for i, f := range src.ints() {
		if *f.p != nil {
			*dst[i].p = *f.p
		}
	}
	if n.MaxCPUs != nil {
		out.MaxCPUs = n.MaxCPUs
	}
	return out
}

// Known reports whether name is the JSON name of a limit.
func (o *Overrides) Known(name string) bool {
	if name == "max_cpus" {
		return true
	}
	for _, f := range o.ints() {
		if f.name == name {
			return true
		}
	}
	return false
}

// Clear unsets the field of that JSON name (back to the default); an
// unknown name is ignored.
func (o *Overrides) Clear(name string) {
	if name == "max_cpus" {
		o.MaxCPUs = nil
	}
	for _, f := range o.ints() {
		if f.name == name {
			*f.p = nil
		}
	}
}

// Apply returns the defaults with o's fields in their place, each cut to
// the range Validate allows: limits stored before a bound existed act as
// its largest value.
func (o Overrides) Apply(def Limits) Limits {
	out := def.overrides() // points into a copy of def
	own := o.ints()
	for i, f := range out.ints() {
		if v := *own[i].p; v != nil {
			**f.p = *v
		}
		**f.p = bound.Clamp(**f.p, 0, f.most)
	}
	if o.MaxCPUs != nil {
		*out.MaxCPUs = *o.MaxCPUs
	}
	*out.MaxCPUs = bound.Clamp(*out.MaxCPUs, 0, bound.MaxCPUs)
	return out.limits()
}

// ParseOverrides reads stored overrides; an empty text is none.
func ParseOverrides(b []byte) (Overrides, error) {
	var o Overrides
	if len(b) == 0 {
		return o, nil
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return o, fmt.Errorf("account limits: %w", err)
	}
	return o, nil
}

// Validate checks server defaults, naming the field.
func (l Limits) Validate() error { return l.overrides().Validate() }

// overrides are the limits as overrides, every field set, pointing into
// a copy of l.
func (l Limits) overrides() Overrides {
	return Overrides{
		MaxSandboxes: &l.MaxSandboxes, RequestsPerMinute: &l.RequestsPerMinute, ExecutionsPerMinute: &l.ExecutionsPerMinute,
		MonthlySandboxSeconds: &l.MonthlySandboxSeconds, MonthlyCPUSeconds: &l.MonthlyCPUSeconds,
		MonthlyGBSeconds: &l.MonthlyGBSeconds, MonthlyExecutions: &l.MonthlyExecutions, MaxCPUs: &l.MaxCPUs,
		MaxMemoryMB: &l.MaxMemoryMB, MaxDiskMB: &l.MaxDiskMB, MaxTimeout: &l.MaxTimeout, MaxDevices: &l.MaxDevices,
	}
}

// limits are the values o points to (every field set).
func (o Overrides) limits() Limits {
	return Limits{MaxSandboxes: *o.MaxSandboxes, RequestsPerMinute: *o.RequestsPerMinute, ExecutionsPerMinute: *o.ExecutionsPerMinute,
		MonthlySandboxSeconds: *o.MonthlySandboxSeconds, MonthlyCPUSeconds: *o.MonthlyCPUSeconds,
		MonthlyGBSeconds: *o.MonthlyGBSeconds, MonthlyExecutions: *o.MonthlyExecutions, MaxCPUs: *o.MaxCPUs,
		MaxMemoryMB: *o.MaxMemoryMB, MaxDiskMB: *o.MaxDiskMB, MaxTimeout: *o.MaxTimeout, MaxDevices: *o.MaxDevices}
}

// MonthStart is the start (UTC) of the month t is in; quotas reset then.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// NextMonth is when the monthly quotas of t's month reset.
func NextMonth(t time.Time) time.Time { return MonthStart(t).AddDate(0, 1, 0) }
