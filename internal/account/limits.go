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
// Imports: internal/store, internal/apierr, internal/ratelimit (the token
// buckets) and the standard library.
package account

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
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
}

// Overrides are an account's own limits; nil fields take the server's
// defaults. This is what the store keeps (store.Account.Limits).
type Overrides struct {
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
	MaxTimeout            *int64   `json:"max_timeout,omitempty"`
}

// ints lists the integer fields with their JSON names, for validation and
// merging in one place.
func (o *Overrides) ints() []struct {
	name string
	p    **int64
} {
	return []struct {
		name string
		p    **int64
	}{
		{"max_sandboxes", &o.MaxSandboxes}, {"requests_per_minute", &o.RequestsPerMinute},
		{"executions_per_minute", &o.ExecutionsPerMinute}, {"monthly_sandbox_seconds", &o.MonthlySandboxSeconds},
		{"monthly_cpu_seconds", &o.MonthlyCPUSeconds}, {"monthly_gb_seconds", &o.MonthlyGBSeconds},
		{"monthly_executions", &o.MonthlyExecutions}, {"max_memory_mb", &o.MaxMemoryMB},
		{"max_disk_mb", &o.MaxDiskMB}, {"max_timeout", &o.MaxTimeout},
	}
}

// Validate reports the first bad value, naming its field.
func (o Overrides) Validate() error {
	for _, f := range o.ints() {
		if *f.p != nil && **f.p < 0 {
			return apierr.New(apierr.BadRequest, "%s must not be negative (0 means unlimited)", f.name)
		}
	}
	if o.MaxCPUs != nil && (*o.MaxCPUs < 0 || math.IsNaN(*o.MaxCPUs) || math.IsInf(*o.MaxCPUs, 0)) {
		return apierr.New(apierr.BadRequest, "max_cpus must not be negative (0 means unlimited)")
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

// Apply returns the defaults with o's fields in their place.
func (o Overrides) Apply(def Limits) Limits {
	l := def
	set := func(p *int64, v *int64) {
		if v != nil {
			*p = *v
		}
	}
	set(&l.MaxSandboxes, o.MaxSandboxes)
	set(&l.RequestsPerMinute, o.RequestsPerMinute)
	set(&l.ExecutionsPerMinute, o.ExecutionsPerMinute)
	set(&l.MonthlySandboxSeconds, o.MonthlySandboxSeconds)
	set(&l.MonthlyCPUSeconds, o.MonthlyCPUSeconds)
	set(&l.MonthlyGBSeconds, o.MonthlyGBSeconds)
	set(&l.MonthlyExecutions, o.MonthlyExecutions)
	set(&l.MaxMemoryMB, o.MaxMemoryMB)
	set(&l.MaxDiskMB, o.MaxDiskMB)
	set(&l.MaxTimeout, o.MaxTimeout)
	if o.MaxCPUs != nil {
		l.MaxCPUs = *o.MaxCPUs
	}
	return l
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
func (l Limits) Validate() error {
	o := Overrides{
		MaxSandboxes: &l.MaxSandboxes, RequestsPerMinute: &l.RequestsPerMinute, ExecutionsPerMinute: &l.ExecutionsPerMinute,
		MonthlySandboxSeconds: &l.MonthlySandboxSeconds, MonthlyCPUSeconds: &l.MonthlyCPUSeconds,
		MonthlyGBSeconds: &l.MonthlyGBSeconds, MonthlyExecutions: &l.MonthlyExecutions, MaxCPUs: &l.MaxCPUs,
		MaxMemoryMB: &l.MaxMemoryMB, MaxDiskMB: &l.MaxDiskMB, MaxTimeout: &l.MaxTimeout,
	}
	return o.Validate()
}

// MonthStart is the start (UTC) of the month t is in; quotas reset then.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// NextMonth is when the monthly quotas of t's month reset.
func NextMonth(t time.Time) time.Time { return MonthStart(t).AddDate(0, 1, 0) }
