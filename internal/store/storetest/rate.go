package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Rates checks store.RateStore through a and b, two handles on one store
// (two servers sharing it): a key's bucket is one for both.
func Rates(t *testing.T, a, b store.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	const every = 20 * time.Second // limit 3: a minute's worth
	take := func(t *testing.T, st store.Store, key string, n int64, at time.Time) store.RateTake {
		t.Helper()
		r, err := st.TakeRate(ctx, key, n, 3, every, at)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	expect := func(t *testing.T, got store.RateTake, allowed bool, full time.Time) {
		t.Helper()
		if got.Allowed != allowed || !got.Full.Equal(full) || got.Full.Location() != time.UTC {
			t.Fatalf("take = %+v, want allowed %v, full at %v (UTC)", got, allowed, full)
		}
	}

	t.Run("a bucket shared by two handles", func(t *testing.T) {
		// Full at first: three tokens, each pushing the time it is full
		// again one interval further.
		expect(t, take(t, a, "k", 1, t0), true, t0.Add(every))
		expect(t, take(t, b, "k", 1, t0), true, t0.Add(2*every))
		expect(t, take(t, a, "k", 1, t0), true, t0.Add(3*every))
		expect(t, take(t, b, "k", 1, t0), false, t0.Add(3*every)) // empty; unchanged
		expect(t, take(t, a, "k", 1, t0.Add(every-time.Nanosecond)), false, t0.Add(3*every))
		// One token back after an interval.
		expect(t, take(t, a, "k", 1, t0.Add(every)), true, t0.Add(4*every))
		expect(t, take(t, b, "k", 1, t0.Add(every)), false, t0.Add(4*every))
		// Two intervals later two tokens are back: a take of two.
		expect(t, take(t, b, "k", 2, t0.Add(3*every)), true, t0.Add(6*every))
		expect(t, take(t, a, "k", 1, t0.Add(3*every)), false, t0.Add(6*every))
		// Long after it filled up, it is full, and no fuller.
		later := t0.Add(time.Hour)
		expect(t, take(t, a, "k", 3, later), true, later.Add(3*every))
		expect(t, take(t, b, "k", 1, later), false, later.Add(3*every))
		// Another key is another bucket.
		expect(t, take(t, b, "k2", 1, t0), true, t0.Add(every))
		// More than the bucket holds: never, and nothing taken.
		expect(t, take(t, a, "k3", 4, t0), false, t0)
		expect(t, take(t, b, "k3", 3, t0), true, t0.Add(3*every))
	})

	t.Run("bad arguments", func(t *testing.T) {
		for _, c := range []struct {
			key      string
			n, limit int64
			interval time.Duration
		}{
			{"", 1, 3, every}, {"k", 0, 3, every}, {"k", 1, 0, every}, {"k", 1, 3, 0}, {"k", -1, 3, every},
			{"k", 1, 1 << 40, time.Hour}, {"k", 1 << 40, 3, time.Hour},
		} {
			if _, err := a.TakeRate(ctx, c.key, c.n, c.limit, c.interval, t0); !errors.Is(err, store.ErrBadRate) {
				t.Errorf("TakeRate(%q, %d, %d, %v): %v, want ErrBadRate", c.key, c.n, c.limit, c.interval, err)
			}
		}
	})

	t.Run("full buckets are deleted", func(t *testing.T) {
		take(t, a, "old", 1, t0)            // full again at t0+20s
		take(t, a, "new", 3, t0.Add(every)) // full again at t0+80s
		n, err := b.DeleteRatesBefore(ctx, t0.Add(2*every))
		if err != nil {
			t.Fatal(err)
		}
		// "old", and "k2" of the first test (full at t0+20s); not "new",
		// nor "k" and "k3", full later.
		if n != 2 {
			t.Fatalf("deleted %d buckets, want 2", n)
		}
		if n, err := b.DeleteRatesBefore(ctx, t0.Add(2*every)); err != nil || n != 0 {
			t.Fatalf("deleting again: %d, %v", n, err)
		}
		// "new" kept its count (one token back); "old" is a full bucket.
		expect(t, take(t, b, "new", 2, t0.Add(2*every)), false, t0.Add(4*every))
		expect(t, take(t, b, "old", 3, t0.Add(2*every)), true, t0.Add(5*every))
	})

	t.Run("goroutines hammering one key at one instant", func(t *testing.T) {
		const limit, workers, rounds = 10, 8, 30
		allowed := hammer(t, a, b, "burst", limit, time.Minute/limit, workers, func(int) (time.Time, bool) { return t0, true }, rounds)
		if allowed != limit {
			t.Fatalf("%d takes allowed at one instant, want the limit %d", allowed, limit)
		}
	})

	t.Run("goroutines hammering one key over time", func(t *testing.T) {
		// 20 tokens, one back every 25 ms. Eight workers take at once,
		// four takes each, in rounds 100 ms apart (four tokens back),
		// each round over before the next begins: the first round takes
		// the 20, each other one the four that came back, never more.
		// The rounds' time is the test's own: with the wall clock a run
		// of 300 ms under load made fewer takes than the limit ("13 takes
		// allowed in 483ms, want 20 to 39"), and a take that waited for
		// the database came after later ones, its now older than theirs.
		const limit, every, step = 20, 25 * time.Millisecond, 100 * time.Millisecond
		for r := range 10 {
			at := t0.Add(time.Duration(r) * step)
			allowed := hammer(t, a, b, "flow", limit, every, 8, func(int) (time.Time, bool) { return at, true }, 4)
			want := int64(step / every)
			if r == 0 {
				want = limit
			}
			if allowed != want {
				t.Fatalf("round %d (%v on): %d takes allowed, want %d", r, at.Sub(t0), allowed, want)
			}
		}
	})
}

// hammer has workers take from key through a and b in turn, each while
// clock says go (at most rounds times), and returns how many were allowed.
func hammer(t *testing.T, a, b store.Store, key string, limit int64, every time.Duration, workers int,
	clock func(round int) (time.Time, bool), rounds int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		st := a
		if w%2 == 1 {
			st = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				now, ok := clock(r)
				if !ok {
					return
				}
				res, err := st.TakeRate(context.Background(), key, 1, limit, every, now)
				if err != nil {
					errs <- fmt.Errorf("worker %d, take %d: %w", w, r, err)
					return
				}
				if res.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return allowed.Load()
}
