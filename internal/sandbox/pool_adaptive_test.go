package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// waitPool waits until the pool's stats satisfy ok.
func waitPool(t *testing.T, m *sandbox.Manager, what string, ok func(sandbox.PoolStats) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok(m.PoolStats()) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool never %s: %+v", what, m.PoolStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// members counts the runtime's sandboxes still in a pool (not handed out).
func members(t *testing.T, rt *fake.Runtime, m *sandbox.Manager) int {
	t.Helper()
	held, err := rt.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, h := range held {
		if h.Pool {
			if _, err := m.Get(h.ID); err != nil {
				n++
			}
		}
	}
	return n
}

// burst creates n default sandboxes at once, as n callers would.
func burst(t *testing.T, m *sandbox.Manager, n int, opt sandbox.CreateOptions) (hits int) {
	t.Helper()
	type res struct {
		s   *sandbox.Sandbox
		err error
	}
	out := make(chan res, n)
	for range n {
		go func() {
			s, err := m.Create(context.Background(), opt)
			out <- res{s, err}
		}()
	}
	for range n {
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.s.FromPool() {
			hits++
		}
	}
	return hits
}

// TestPoolGrowsWithBurstsAndShrinksWhenIdle: a burst of four creates
// against a pool of one grows it by the three that found it empty, so
// that the next burst of four is served from it; once no create has asked
// for PoolShrinkAfter it goes back to its floor and its extra members are
// destroyed. The control: a fixed pool (PoolMax 0) serves the second
// burst with one sandbox as it served the first.
func TestPoolGrowsWithBurstsAndShrinksWhenIdle(t *testing.T) {
	t.Parallel()
	for _, adaptive := range []bool{false, true} {
		cfg := poolConfig(1)
		cfg.PoolShrinkAfter = 5 * time.Second // longer than filling takes under load
		cfg.PoolMemory = 1 << 40
		if adaptive {
			cfg.PoolMax = 4
		}
		m, rt := fakeEngine(t, cfg)
		waitReady(t, m, 1)
		if hits := burst(t, m, 4, sandbox.CreateOptions{}); hits != 1 {
			t.Fatalf("adaptive %v: the first burst had %d hits, want the one member", adaptive, hits)
		}
		want := 1
		if adaptive {
			want = 4
		}
		waitPool(t, m, "filled", func(st sandbox.PoolStats) bool { return st.Wanted == want && st.Ready == want })
		if hits := burst(t, m, 4, sandbox.CreateOptions{}); hits != want {
			t.Fatalf("adaptive %v: the second burst had %d hits, want %d", adaptive, hits, want)
		}
		if !adaptive {
			continue
		}
		// Kept at 4 while asked for, back to 1 once idle.
		waitPool(t, m, "refilled", func(st sandbox.PoolStats) bool { return st.Ready == 4 })
		waitPool(t, m, "shrank", func(st sandbox.PoolStats) bool { return st.Wanted == 1 && st.Ready == 1 })
		waitPool(t, m, "destroyed the extra members", func(sandbox.PoolStats) bool { return members(t, rt, m) == 1 })
	}
}

// TestPoolShapeOfItsOwn: a create with limits other than the defaults
// misses; a second one of that shape grows a pool of it, whose member the
// third takes, with the limits asked for. A shape asked for once starts no
// member, and the shape's pool, unused, shrinks to nothing.
func TestPoolShapeOfItsOwn(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(1)
	cfg.PoolMax, cfg.PoolMemory, cfg.PoolShrinkAfter = 2, 1<<40, 5*time.Second
	m, rt := fakeEngine(t, cfg)
	waitReady(t, m, 1)
	shape := sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 300 << 20}}
	once := sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 200 << 20}}
	for i, opt := range []sandbox.CreateOptions{once, shape, shape} {
		s, err := m.Create(context.Background(), opt)
		if err != nil {
			t.Fatal(err)
		}
		if s.FromPool() {
			t.Fatalf("create %d of a shape not pooled yet was a hit", i)
		}
	}
	waitPool(t, m, "made a pool of the shape", func(st sandbox.PoolStats) bool { return st.Wanted == 2 && st.Ready == 2 })
	s, err := m.Create(context.Background(), shape)
	if err != nil {
		t.Fatal(err)
	}
	if !s.FromPool() || s.Limits.MemoryBytes != 300<<20 {
		t.Fatalf("the shape's create: pooled %v, limits %+v", s.FromPool(), s.Limits)
	}
	waitPool(t, m, "dropped the unused shape", func(st sandbox.PoolStats) bool { return st.Wanted == 1 && st.Ready == 1 })
	waitPool(t, m, "destroyed the shape's member", func(sandbox.PoolStats) bool { return members(t, rt, m) == 1 })
}

// TestPoolMemoryBudget: the members above the floors are bounded by
// PoolMemory (128 MiB each): a burst that would grow the pool by three
// grows it by one.
func TestPoolMemoryBudget(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(1)
	cfg.PoolMax, cfg.PoolMemory = 4, 128<<20
	m, rt := fakeEngine(t, cfg)
	waitReady(t, m, 1)
	burst(t, m, 4, sandbox.CreateOptions{})
	waitPool(t, m, "refilled", func(st sandbox.PoolStats) bool { return st.Wanted == 2 && st.Ready == 2 })
	// Two members started after the burst, and no third was begun: by
	// the time the second was ready, an unbounded filler (two starts at
	// once while the pool is less than half full) had started a third.
	if n := members(t, rt, m); n != 2 {
		t.Fatalf("%d members in the runtime, want the floor's and the budget's one", n)
	}
}
