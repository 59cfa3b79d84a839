package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// stubSnapshotter plays a runtime that snapshots over the fake: its
// Snapshot fails the first fail calls and then "snapshots" by making
// the directory; Clone creates a fresh sandbox.
type stubSnapshotter struct {
	*fake.Runtime
	mu    sync.Mutex
	fail  int
	calls int
}

func (c *stubSnapshotter) Snapshot(_ context.Context, id, dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= c.fail {
		return errors.New("criu: unseizable task")
	}
	return os.MkdirAll(dir, 0o700)
}

func (c *stubSnapshotter) Clone(ctx context.Context, s runtime.Spec, _ string) (*runtime.Instance, error) {
	return c.Runtime.Create(ctx, s)
}

// TestSnapshotRetriesAFailedDump: a snapshot whose dump fails once is
// tried again; one that fails twice is ERR_INTERNAL. Either way the
// sandbox runs on as it was, its agent reached again, its lifetime
// running, and a paused sandbox is refused (ERR_SANDBOX_STATE).
func TestSnapshotRetriesAFailedDump(t *testing.T) {
	ctx := context.Background()
	for _, fail := range []int{1, 2} {
		rt := &stubSnapshotter{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}, fail: fail}
		m := startEngine(t, sandbox.Config{Runtime: rt,
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt.Runtime)
		if !m.CanSnapshot() {
			t.Fatal("a Snapshotter runtime: the engine says it cannot snapshot")
		}
		s := newSandbox(t, m, sandbox.CreateOptions{})
		run(t, s, "python", "x = 5")
		dir := filepath.Join(testutil.ShortTempDir(t), "snap")
		err := s.Snapshot(ctx, dir)
		rt.mu.Lock()
		calls := rt.calls
		rt.mu.Unlock()
		if calls != 2 {
			t.Errorf("fail %d: %d snapshots tried, want 2", fail, calls)
		}
		if fail == 2 && apierr.CodeOf(err) != apierr.Internal {
			t.Fatalf("two failed dumps: %v, want ERR_INTERNAL", err)
		}
		if fail == 1 && err != nil {
			t.Fatalf("a dump that failed once: %v", err)
		}
		if st := s.State(); st != sandbox.StateRunning {
			t.Fatalf("fail %d: state %s after the snapshot, want running", fail, st)
		}
		if got := mainText(run(t, s, "python", "x + 1")); got != "6" {
			t.Fatalf("fail %d: after the snapshot x + 1 is %q", fail, got)
		}
	}
}

// TestSnapshotNotSupported: a runtime that cannot snapshot (the fake)
// refuses with ERR_NOT_SUPPORTED, the sandbox running on, and so does a
// create from a snapshot.
func TestSnapshotNotSupported(t *testing.T) {
	ctx := context.Background()
	m, _ := fakeEngine(t, sandbox.Config{})
	if m.CanSnapshot() {
		t.Error("the fake runtime says it can snapshot")
	}
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "x = 5")
	if err := s.Snapshot(ctx, filepath.Join(testutil.ShortTempDir(t), "s")); apierr.CodeOf(err) != apierr.NotSupported {
		t.Fatalf("snapshot: %v, want ERR_NOT_SUPPORTED", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: "/nowhere"}); apierr.CodeOf(err) != apierr.NotSupported {
		t.Fatalf("create from a snapshot: %v, want ERR_NOT_SUPPORTED", err)
	}
	if got := mainText(run(t, s, "python", "x + 1")); got != "6" {
		t.Fatalf("after the refused snapshot x + 1 is %q", got)
	}
}
