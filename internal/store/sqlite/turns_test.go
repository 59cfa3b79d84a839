package sqlite

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// waiting is how many writers of name wait.
func (t *turns) waiting(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue[name])
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestTurnsRoundTheNames: ten writes of one account queue before one of
// another: the other's goes second, not eleventh (a plain queue, or the
// write handle's pool, would serve it after all ten), and within a name
// the writes keep their order. A writer whose context ends while it
// waits leaves the queue and holds up no one.
func TestTurnsRoundTheNames(t *testing.T) {
	tr := newTurns()
	give, err := tr.take(context.Background(), "holder")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	enqueue := func(ctx context.Context, name, label string) {
		n := tr.waiting(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := tr.take(ctx, name)
			if err != nil {
				return
			}
			mu.Lock()
			order = append(order, label)
			mu.Unlock()
			g()
		}()
		waitUntil(t, label+" queued", func() bool { return tr.waiting(name) == n+1 })
	}
	for i := range 10 {
		enqueue(context.Background(), "a", "a"+string(rune('0'+i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	enqueue(ctx, "c", "c-cancelled")
	enqueue(context.Background(), "b", "b")
	cancel()
	waitUntil(t, "the cancelled writer gone", func() bool { return tr.waiting("c") == 0 })
	give()
	wg.Wait()
	want := []string{"a0", "b", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9"}
	if !slices.Equal(order, want) {
		t.Fatalf("turns in order %v, want %v", order, want)
	}
	// All given back: the next take is at once.
	g, err := tr.take(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	g()
	// A take whose context has ended while the turn is held fails.
	g, _ = tr.take(context.Background(), "x")
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := tr.take(ctx, "y"); !errors.Is(err, context.Canceled) {
		t.Fatalf("take with an ended context: %v", err)
	}
	g()
}
