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

// TestPauseNotSupported: an engine whose runtime cannot checkpoint (the
// fake), or that keeps no checkpoints, refuses a pause with
// ERR_NOT_SUPPORTED and the sandbox runs on as it was; a resume of a
// running sandbox is no error.
func TestPauseNotSupported(t *testing.T) {
	ctx := context.Background()
	for _, dir := range []string{"", "checkpoints"} {
		cfg := sandbox.Config{}
		if dir != "" {
			cfg.CheckpointDir = testutil.ShortTempDir(t)
		}
		m, _ := fakeEngine(t, cfg)
		if m.CanPause() {
			t.Errorf("CheckpointDir %q: the fake runtime says it can pause", dir)
		}
		s := newSandbox(t, m, sandbox.CreateOptions{})
		run(t, s, "python", "x = 5")
		if err := s.Pause(ctx); apierr.CodeOf(err) != apierr.NotSupported {
			t.Fatalf("CheckpointDir %q: pause: %v, want ERR_NOT_SUPPORTED", dir, err)
		}
		if st := s.State(); st != sandbox.StateRunning {
			t.Fatalf("state %s after a refused pause", st)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("resume of a running sandbox: %v", err)
		}
		if got := mainText(run(t, s, "python", "x")); got != "5" {
			t.Fatalf("after the refused pause x is %q", got)
		}
	}
}

// stubCheckpointer plays a runtime that checkpoints over the fake: its
// Checkpoint fails the first fail calls and then "checkpoints" by
// leaving the sandbox as it is; Restore gives back the sandbox's
// Instance.
type stubCheckpointer struct {
	*fake.Runtime
	mu    sync.Mutex
	fail  int
	calls int
	insts map[string]*runtime.Instance
}

func (c *stubCheckpointer) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	inst, err := c.Runtime.Create(ctx, s)
	if err == nil {
		c.mu.Lock()
		c.insts[s.ID] = inst
		c.mu.Unlock()
	}
	return inst, err
}

func (c *stubCheckpointer) Checkpoint(_ context.Context, id, dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= c.fail {
		return errors.New("criu: unseizable task")
	}
	return os.MkdirAll(dir, 0o700)
}

func (c *stubCheckpointer) Restore(_ context.Context, id, _ string) (*runtime.Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.insts[id], nil
}

// TestPauseRetriesAFailedDump: a dump that fails once is tried again;
// one that fails twice leaves the sandbox running as it was, its agent
// reached again (ERR_INTERNAL). The state machine around it: paused,
// resumed by a request, events, the checkpoint's directory removed.
func TestPauseRetriesAFailedDump(t *testing.T) {
	ctx := context.Background()
	for _, fail := range []int{1, 2} {
		rt := &stubCheckpointer{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
			fail: fail, insts: map[string]*runtime.Instance{}}
		dir := filepath.Join(testutil.ShortTempDir(t), "checkpoints")
		m := startEngine(t, sandbox.Config{Runtime: rt, CheckpointDir: dir,
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt.Runtime)
		s := newSandbox(t, m, sandbox.CreateOptions{})
		run(t, s, "python", "x = 5")
		err := s.Pause(ctx)
		rt.mu.Lock()
		calls := rt.calls
		rt.mu.Unlock()
		if calls != 2 {
			t.Errorf("fail %d: %d checkpoints tried, want 2", fail, calls)
		}
		if fail == 2 {
			if apierr.CodeOf(err) != apierr.Internal || s.State() != sandbox.StateRunning {
				t.Fatalf("two failed dumps: %v, state %s; want ERR_INTERNAL and running", err, s.State())
			}
		} else {
			if err != nil || s.State() != sandbox.StatePaused {
				t.Fatalf("a dump that failed once: %v, state %s; want paused", err, s.State())
			}
			if _, err := os.Stat(filepath.Join(dir, s.ID)); err != nil {
				t.Fatalf("no checkpoint directory while paused: %v", err)
			}
		}
		if got := mainText(run(t, s, "python", "x + 1")); got != "6" {
			t.Fatalf("fail %d: after the pause x + 1 is %q", fail, got)
		}
		if st := s.State(); st != sandbox.StateRunning {
			t.Fatalf("fail %d: state %s after an execution", fail, st)
		}
		if _, err := os.Stat(filepath.Join(dir, s.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("fail %d: the checkpoint's directory after the resume: %v", fail, err)
		}
	}
}
