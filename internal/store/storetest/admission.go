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

// Admission checks store.AdmissionStore through a and b, two handles on
// one store (two servers sharing it): caps hold across them.
func Admission(t *testing.T, a, b store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, id := range []string{"acct-1", "acct-2", "acct-3"} {
		if err := a.CreateAccount(ctx, store.Account{ID: id, Name: id, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("reserve, confirm, drop, stop", func(t *testing.T) {
		if err := a.ReserveSandbox(ctx, "acct-1", "h1", 2, now); err != nil {
			t.Fatal(err)
		}
		if err := b.ReserveSandbox(ctx, "acct-1", "h2", 2, now); err != nil {
			t.Fatal(err)
		}
		if err := a.ReserveSandbox(ctx, "acct-1", "h3", 2, now); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("third reservation at a cap of 2: %v", err)
		}
		if err := b.ReserveSandbox(ctx, "acct-2", "h4", 2, now); err != nil {
			t.Fatalf("another account: %v", err)
		}
		// The slot passes from the reservation to the record: still full.
		sb := store.Sandbox{ID: "sb-1", Owner: "acct-1", Template: "python", State: store.SandboxRunning, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := a.ConfirmSandbox(ctx, "h1", sb); err != nil {
			t.Fatal(err)
		}
		if got, err := b.GetSandbox(ctx, "sb-1"); err != nil || got.State != store.SandboxRunning {
			t.Fatalf("confirmed record: %+v, %v", got, err)
		}
		if err := b.ReserveSandbox(ctx, "acct-1", "h3", 2, now); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("after confirming: %v", err)
		}
		if err := b.DropReservation(ctx, "h2"); err != nil {
			t.Fatal(err)
		}
		if err := b.DropReservation(ctx, "never-held"); err != nil {
			t.Fatalf("dropping an unknown holder: %v", err)
		}
		if err := a.ReserveSandbox(ctx, "acct-1", "h3", 2, now); err != nil {
			t.Fatalf("after a drop: %v", err)
		}
		if err := a.ReserveSandbox(ctx, "acct-1", "h5", 2, now); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("full again: %v", err)
		}
		if err := b.StopSandbox(ctx, "sb-1", "killed", now); err != nil {
			t.Fatal(err)
		}
		if err := a.ReserveSandbox(ctx, "acct-1", "h5", 2, now); err != nil {
			t.Fatalf("after the sandbox stopped: %v", err)
		}
	})

	t.Run("a stale reservation no longer counts", func(t *testing.T) {
		if err := a.ReserveSandbox(ctx, "acct-2", "old", 2, now.Add(-store.ReservationTTL-time.Second)); err != nil {
			t.Fatal(err)
		}
		// acct-2 holds h4 and the stale one: the stale one is gone.
		if err := b.ReserveSandbox(ctx, "acct-2", "new", 2, now); err != nil {
			t.Fatalf("a stale reservation still counted: %v", err)
		}
		if err := b.ReserveSandbox(ctx, "acct-2", "newer", 2, now); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("fresh ones count: %v", err)
		}
	})

	t.Run("two replicas hammering one account", func(t *testing.T) {
		const max, workers, rounds = 3, 8, 25
		var held, most atomic.Int64
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
					h := fmt.Sprintf("w%d-r%d", w, r)
					err := st.ReserveSandbox(ctx, "acct-3", h, max, time.Now())
					if errors.Is(err, store.ErrLimit) {
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					n := held.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					held.Add(-1)
					if err := st.DropReservation(ctx, h); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if m := most.Load(); m > max || m == 0 {
			t.Fatalf("at most %d held at once, cap %d", m, max)
		}
	})

	t.Run("monthly executions", func(t *testing.T) {
		month := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		// Two executions of November are already in the usage.
		if err := a.AddUsage(ctx, []store.UsageDelta{{SandboxID: "sb-x", Account: "acct-1", Hour: month.Add(50 * time.Hour), Executions: 2}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := b.CountExecution(ctx, "acct-1", month, 3); err != nil {
			t.Fatal(err)
		}
		if err := a.CountExecution(ctx, "acct-1", month, 3); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("fourth execution at a quota of 3: %v", err)
		}
		dec := month.AddDate(0, 1, 0)
		for i := range 3 {
			st := a
			if i%2 == 1 {
				st = b
			}
			if err := st.CountExecution(ctx, "acct-1", dec, 3); err != nil {
				t.Fatalf("December, execution %d: %v", i+1, err)
			}
		}
		if err := b.CountExecution(ctx, "acct-1", dec, 3); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("December, fourth: %v", err)
		}
		if err := b.CountExecution(ctx, "acct-1", dec, 5); err != nil {
			t.Fatalf("a raised quota: %v", err)
		}
	})
}
