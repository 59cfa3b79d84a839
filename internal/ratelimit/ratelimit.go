// Package ratelimit is the token bucket behind Sheepfold's per-minute
// limits: an account's API requests and executions (internal/account) and
// a sandbox's executions under its policy's rate_limiting
// (internal/sandbox). It does no locking and reads no clock: callers hold
// their own lock and pass the time, so tests drive it with a fake clock.
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
