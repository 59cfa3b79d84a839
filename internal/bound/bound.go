// Package bound checks the numbers callers give: amounts of money,
// limits, timeouts, counts and rates. Each check takes the caller's name
// for the field ("timeout", "limits.max_timeout", "timeout_seconds",
// "--account-max-timeout") and refuses a value out of its range with
// ERR_BAD_REQUEST whose message starts with that name (and whose
// Details["field"] is it), so that every surface (/v1, E2B, MCP, the CLI
// and the config) refuses alike.
//
// The maxima are chosen so that no accepted value can overflow the
// arithmetic it later goes through: a duration in int64 nanoseconds added
// to now or to another such duration, megabytes shifted to bytes, a
// token bucket's float count turned back into an integer, and amounts of
// money summed in int64 micro-units (by the account registry, and by the
// stores' SQL sums, which also saturate rather than fail: package store).
//
// # Where it is called
//
// internal/bound holds the ranges of the numbers callers give (durations,
// amounts of money, counts, rates, sizes, CPUs, prices) and refuses one out
// of range as `ERR_BAD_REQUEST` whose message begins with the field's name
// (`Details["field"]`). Each surface calls it where it parses the number,
// under its own name for the field: internal/server (/v1), internal/e2b,
// internal/mcpserver, internal/account (limits, amounts, account names),
// internal/llm (the providers' config) and cmd/sheepfold (flags, as
// `--flag`). Its maxima keep what is accepted from overflowing what follows
// (durations in nanoseconds, MiB in bytes, token buckets, money summed in
// int64); the stores' sums of money and usage stop at int64's ends besides
// (docs/security.md, "Bounded numbers").
//
// Imports: internal/apierr and the standard library.
package bound

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// The largest values any field may hold, whatever the server's own
// (smaller) settings. Each is far above any real use and far below
// overflowing what it is later multiplied or summed into.
const (
	// MaxDuration is the longest duration a field may name (ten years):
	// now plus two of them stays far inside time.Duration's 292 years.
	MaxDuration = 10 * 365 * 24 * time.Hour
	// MaxAmountMicros is the largest amount of money (a grant, a
	// balance, free credits), in micro-units: 1,000,000,000.000000. Over
	// 9,000 of them sum inside int64.
	MaxAmountMicros int64 = 1_000_000_000 * 1_000_000
	// MaxCount bounds counts and monthly quotas (executions, seconds,
	// tokens): 10^15, exact in a float64 and summed 9,000 times in an
	// int64.
	MaxCount int64 = 1_000_000_000_000_000
	// MaxRate bounds per-minute rates (a token bucket of this many
	// tokens refills one every 60 ns).
	MaxRate int64 = 1_000_000_000
	// MaxMB bounds sizes in MiB (memory, disk): 1 PiB, so that the
	// bytes (<< 20) stay far inside int64 (which overflows at 2^43 MiB).
	MaxMB int64 = 1 << 30
	// MaxCPUs bounds CPU counts.
	MaxCPUs = 1024
	// MaxSandboxes bounds counts of sandboxes (an account's cap).
	MaxSandboxes int64 = 1_000_000
	// MaxPrice bounds a price per unit of usage (a CPU-second, a
	// GB-second, an execution), in micro-units: a thousand units of
	// currency. What is charged is cut to MaxAmountMicros anyway.
	MaxPrice = 1e9
)

// Error is the refusal of a field's value: ERR_BAD_REQUEST, the message
// starting with the field's name, Details["field"] the name.
func Error(field, format string, args ...any) *apierr.Error {
	return &apierr.Error{Code: apierr.BadRequest, Message: field + " " + fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field}}
}

// Int checks that v lies in [lo, hi].
func Int(field string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return Error(field, "must be an integer from %d to %d", lo, hi)
	}
	return nil
}

// Float checks that v is a finite number in [lo, hi].
func Float(field string, v, lo, hi float64) error {
	if math.IsNaN(v) || v < lo || v > hi {
		return Error(field, "must be a number from %s to %s", show(lo), show(hi))
	}
	return nil
}

// ParseInt reads a decimal integer (a query parameter, a header) in
// [lo, hi].
func ParseInt(field, s string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, Error(field, "must be an integer from %d to %d", lo, hi)
	}
	return n, nil
}

// Seconds converts a positive number of seconds (a fraction allowed) of
// at most hi to a duration. hi above MaxDuration is cut to it.
func Seconds(field string, v float64, hi time.Duration) (time.Duration, error) {
	hi = min(hi, MaxDuration)
	if math.IsNaN(v) || v <= 0 || v > hi.Seconds() {
		return 0, Error(field, "must be a positive number of seconds, at most %s", show(hi.Seconds()))
	}
	return time.Duration(v * float64(time.Second)), nil
}

// WholeSeconds converts a whole number of seconds from lo to hi (each cut
// to MaxDuration) to a duration.
func WholeSeconds(field string, v int64, lo, hi time.Duration) (time.Duration, error) {
	lo, hi = min(lo, MaxDuration), min(hi, MaxDuration)
	if v < int64(lo/time.Second) || v > int64(hi/time.Second) {
		return 0, Error(field, "must be a whole number of seconds from %d to %d", int64(lo/time.Second), int64(hi/time.Second))
	}
	return time.Duration(v) * time.Second, nil
}

// Millis converts a number of milliseconds from lo to hi (each cut to
// MaxDuration) to a duration.
func Millis(field string, v int64, lo, hi time.Duration) (time.Duration, error) {
	lo, hi = min(lo, MaxDuration), min(hi, MaxDuration)
	if v < lo.Milliseconds() || v > hi.Milliseconds() {
		return 0, Error(field, "must be a number of milliseconds from %d to %d", lo.Milliseconds(), hi.Milliseconds())
	}
	return time.Duration(v) * time.Millisecond, nil
}

// Duration checks a duration given as a duration (a flag, a config
// value) lies in [lo, hi], hi cut to MaxDuration.
func Duration(field string, d, lo, hi time.Duration) error {
	hi = min(hi, MaxDuration)
	if d < lo || d > hi {
		return Error(field, "must be from %s to %s", lo, hi)
	}
	return nil
}

// Add is a + b, saturating at the ends of int64 instead of wrapping: the
// sum of amounts of money already checked never gets here, but a sum that
// did must not turn a balance's sign.
func Add(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// Clamp is v cut to [lo, hi]: what a value stored before its bound
// existed is taken as.
func Clamp[T int64 | float64](v, lo, hi T) T {
	if v != v { // NaN
		return lo
	}
	return min(max(v, lo), hi)
}

func show(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
