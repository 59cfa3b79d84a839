// Package ratelimit is the token bucket behind Sheepfold's per-minute
// limits: an account's API requests and executions (internal/account) and
// a sandbox's executions under its policy's rate_limiting
// (internal/sandbox). It does no locking and reads no clock: callers hold
// their own lock and pass the time, so tests drive it with a fake clock.
//
// Bucket counts in memory, for one server. Servers sharing a store count
// an account's buckets there (store.RateStore): the same bucket, kept as
// the time it is full again (the generic cell rate algorithm), which
// Stored turns into the Result that Bucket.Take gives. The two differ
// only in rounding (Bucket counts float tokens, the store whole
// nanoseconds of Interval) and when a limit changes: Bucket keeps its
// tokens (cut to the new limit), the store its time to full (so the same
// wait leaves fewer tokens under a lower limit).
package ratelimit

import (
	"math"
	"time"
)

// Result is the outcome of taking one token.
type Result struct {
	Allowed    bool
	Limit      int64         // tokens per minute; 0: unlimited
	Remaining  int64         // whole tokens left
	Reset      time.Duration // until the bucket is full again
	RetryAfter time.Duration // until one token is back, when refused
}

// Bucket holds up to a minute's worth of tokens and refills continuously.
// The zero Bucket is full.
type Bucket struct {
	tokens float64
	last   time.Time
}

// Take takes one token at now from a bucket refilled at perMinute tokens
// a minute. perMinute <= 0 means unlimited: always allowed.
func (b *Bucket) Take(now time.Time, perMinute int64) Result {
	if perMinute <= 0 {
		return Result{Allowed: true}
	}
	capacity := float64(perMinute)
	rate := capacity / 60 // tokens per second
	if b.last.IsZero() {
		b.tokens, b.last = capacity, now
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens += el * rate
		b.last = now
	}
	b.tokens = min(b.tokens, capacity)
	res := Result{Limit: perMinute}
	if b.tokens >= 1 {
		b.tokens--
		res.Allowed = true
	} else {
		res.RetryAfter = time.Duration((1 - b.tokens) / rate * float64(time.Second))
	}
	res.Remaining = int64(math.Floor(b.tokens))
	res.Reset = time.Duration((capacity - b.tokens) / rate * float64(time.Second))
	return res
}

// Interval is the time a bucket of perMinute tokens takes to get one
// back, in whole nanoseconds, rounded down so that perMinute intervals fit
// in a minute (a full bucket holds perMinute tokens); at least 1 ns.
// perMinute must be positive.
func Interval(perMinute int64) time.Duration {
	return max(time.Minute/time.Duration(perMinute), time.Nanosecond)
}

// Stored is the Result of taking n tokens at now from a bucket of
// perMinute tokens (perMinute > 0) kept as the time it is full again:
// full and allowed as the store's take gave them (store.RateStore), full
// after the take. Each Interval(perMinute) between now and full is one
// token missing.
func Stored(now, full time.Time, allowed bool, perMinute, n int64) Result {
	every := Interval(perMinute)
	span := time.Duration(perMinute) * every // empty to full
	missing := max(full.Sub(now), 0)
	res := Result{Allowed: allowed, Limit: perMinute, Reset: missing,
		Remaining: max(int64((span-missing)/every), 0)}
	if !allowed {
		// Until n tokens are back.
		res.RetryAfter = max(missing+time.Duration(n)*every-span, 0)
	}
	return res
}
