package ratelimit

import (
	"testing"
	"time"
)

// TestBucket: a minute's tokens at once, then one every 60/limit seconds.
func TestBucket(t *testing.T) {
	t.Parallel()
	var b Bucket
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 60; i++ {
		if r := b.Take(t0, 60); !r.Allowed || r.Remaining != int64(59-i) {
			t.Fatalf("take %d: %+v", i, r)
		}
	}
	r := b.Take(t0, 60)
	if r.Allowed || r.RetryAfter != time.Second || r.Reset != time.Minute {
		t.Fatalf("empty bucket: %+v", r)
	}
	if r := b.Take(t0.Add(999*time.Millisecond), 60); r.Allowed {
		t.Fatalf("a token before its second: %+v", r)
	}
	if r := b.Take(t0.Add(time.Second), 60); !r.Allowed {
		t.Fatalf("no token after a second: %+v", r)
	}
}

func TestUnlimited(t *testing.T) {
	t.Parallel()
	var b Bucket
	for i := 0; i < 1000; i++ {
		if r := b.Take(time.Time{}, 0); !r.Allowed {
			t.Fatalf("take %d refused with no limit: %+v", i, r)
		}
	}
}

// gcra is the store's take (store.RateStore; the SQL of
// internal/store/sqlite/rate.go and postgres/rate.go) in Go.
type gcra struct{ full time.Time }

func (g *gcra) take(now time.Time, perMinute, n int64) Result {
	every := Interval(perMinute)
	next := g.full
	if next.Before(now) {
		next = now
	}
	next = next.Add(time.Duration(n) * every)
	allowed := !next.After(now.Add(time.Duration(perMinute) * every))
	if allowed {
		g.full = next
	}
	return Stored(now, g.full, allowed, perMinute, n)
}

// TestStoredMatchesBucket: a bucket kept as the time it is full again
// gives Bucket's results, take for take. The steps are quarter tokens
// and the limits powers of two times 60, so that Bucket's float tokens
// are exact.
func TestStoredMatchesBucket(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, perMinute := range []int64{60, 120, 240} {
		var b Bucket
		var g gcra
		now := t0
		seed := uint64(perMinute)
		refused := 0
		step := 250 * time.Millisecond * 60 / time.Duration(perMinute) // a quarter token
		for i := range 5000 {
			// A burst of takes at one instant, then a pause, in turn.
			seed = seed*6364136223846793005 + 1442695040888963407
			if seed>>60 < 2 {
				now = now.Add(time.Duration(seed>>40%40) * step)
			}
			want, got := b.Take(now, perMinute), g.take(now, perMinute, 1)
			if got != want {
				t.Fatalf("%d a minute, take %d at %v: stored %+v, bucket %+v", perMinute, i, now.Sub(t0), got, want)
			}
			if !got.Allowed {
				refused++
			}
		}
		if refused == 0 || refused == 5000 {
			t.Fatalf("%d a minute: %d of 5000 refused; the sequence does not test both", perMinute, refused)
		}
	}
}

func TestInterval(t *testing.T) {
	t.Parallel()
	for perMinute, want := range map[int64]time.Duration{1: time.Minute, 60: time.Second, 7: 8571428571, 1e12: time.Nanosecond} {
		if got := Interval(perMinute); got != want {
			t.Errorf("Interval(%d) = %v, want %v", perMinute, got, want)
		}
		if n := time.Duration(perMinute); perMinute < 1e10 && n*Interval(perMinute) > time.Minute {
			t.Errorf("%d intervals of %v are more than a minute", perMinute, Interval(perMinute))
		}
	}
}
