// Package backoff is the one wait between the tries of a retry loop:
// exponential (doubling from a base up to a cap) with jitter, so that
// loops that failed together (a provider's outage, a full descriptor
// table, a node gone) do not all retry at the same instants. Each wait is
// drawn in [d/2, d] of the doubled d ("equal jitter"): never longer than
// the plain doubling, never shorter than half of it.
//
// Why not a library: github.com/cenkalti/backoff is the usual one, but
// its ExponentialBackOff gives up after 15 minutes unless told not to,
// has no way to compute the wait of a numbered attempt (a webhook
// delivery counts its own), and brings its retry framework to the agent,
// which stays a small static binary. What is needed is twenty lines.
//
// Imports: the standard library only.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a retry loop's waits: Next returns the wait before the next
// try, Reset starts again from Base after a success. Base must be above
// zero; Max at or above Base caps the doubling (0: no cap). A Backoff is
// one loop's: it is not safe for concurrent use.
type Backoff struct {
	Base, Max time.Duration
	n         int // waits since the last Reset
}

// Next returns the wait before the next try: Delay of one more attempt.
func (b *Backoff) Next() time.Duration {
	b.n++
	return Delay(b.Base, b.Max, b.n)
}

// Reset makes the next wait Base's again.
func (b *Backoff) Reset() { b.n = 0 }

// Wait waits Next, or until ctx ends: false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Delay is the wait before retry number attempt (1 for the first) of a
// loop that keeps its own count: base doubled attempt-1 times, capped at
// max (0: no cap; it saturates rather than overflow), then jittered into
// [d/2, d].
func Delay(base, max time.Duration, attempt int) time.Duration {
	const ceiling = 1 << 62 // about 146 years: no doubling overflows
	if max <= 0 || max > ceiling {
		max = ceiling
	}
	d := min(base, max)
	for i := 1; i < attempt && d < max; i++ {
		d = min(2*d, max)
	}
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
