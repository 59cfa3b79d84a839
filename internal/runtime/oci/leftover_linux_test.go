package oci

import (
	"context"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestSweepTellsLeftover: the sweep of a dead instance tells
// Config.Leftover of each of its sandboxes with a reading of its cgroup
// taken while it still exists (its counters at least what they were
// before its engine died), before it destroys it.
func TestSweepTellsLeftover(t *testing.T) {
	cfg := testConfig(t, "dead")
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Create(context.Background(), runtime.Spec{ID: "orphan", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	before, err := crashed.Usage(context.Background(), "orphan")
	if err != nil || before.CPUNanos == 0 {
		t.Fatalf("the orphan's usage before its engine dies: %+v, %v", before, err)
	}
	die(crashed)

	var mu sync.Mutex
	type told struct {
		u       runtime.Usage
		err     error
		cgroups int
	}
	var got []told
	cfg.Instance = "survivor"
	cfg.Leftover = func(_ context.Context, id string, u runtime.Usage, err error) {
		mu.Lock()
		defer mu.Unlock()
		if id != "orphan" {
			t.Errorf("told of %q", id)
		}
		got = append(got, told{u, err, len(crashed.cg.dirs(id))})
	}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	assertGone(t, crashed, "orphan")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].err != nil || got[0].cgroups == 0 || got[0].u.CPUNanos < before.CPUNanos ||
		got[0].u.MemoryLimit != 64<<20 {
		t.Fatalf("told %+v; want once, read from its cgroup while it existed, the counter at least %d", got, before.CPUNanos)
	}
}
