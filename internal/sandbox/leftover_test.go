package sandbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestLeftoverToldBeforeDestroy: New tells Config.Leftover of every
// sandbox left over from a crash, with its usage read while it still
// exists, before it destroys it, and once only: a leftover whose destroy
// fails and is retried is not told again.
func TestLeftoverToldBeforeDestroy(t *testing.T) {
	t.Parallel()
	rt := newStubborn(t)
	for _, id := range []string{"failing", "plain"} {
		if _, err := rt.Runtime.Create(context.Background(), runtime.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	rt.SetUsed(runtime.Usage{CPUNanos: 4_200_000_000, MemoryBytes: 64 << 20})
	rt.failures["failing"] = 2
	var mu sync.Mutex
	told := map[string][]runtime.Usage{}
	m := stubbornEngine(t, rt, sandbox.Config{Leftover: func(_ context.Context, id string, u runtime.Usage, err error) {
		if err != nil {
			t.Errorf("leftover %s told without a reading: %v", id, err)
		}
		if !slices.Contains(ids(t, rt), id) {
			t.Errorf("leftover %s told after its destroy", id)
		}
		mu.Lock()
		told[id] = append(told[id], u)
		mu.Unlock()
	}})
	waitFor(t, "every leftover destroyed", func() bool { return len(m.Leftovers()) == 0 && len(ids(t, rt)) == 0 })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"failing", "plain"} {
		if len(told[id]) != 1 || told[id][0].CPUNanos != 4_200_000_000 {
			t.Errorf("leftover %s told %+v; want once, with its reading", id, told[id])
		}
	}
	// A sandbox of this engine is no leftover.
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := told[s.ID]; ok {
		t.Errorf("a sandbox of this engine was told as a leftover")
	}
}
