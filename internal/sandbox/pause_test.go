package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

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

// TestCloseKeepsPaused: with KeepPaused, Close leaves a paused sandbox in
// the runtime (for the next engine) and destroys the running ones; a
// resume that comes after Close is refused (ERR_CAPACITY) and the
// sandbox stays paused, never restored under an engine that has ended.
// Without KeepPaused, Close destroys the paused sandbox too.
func TestCloseKeepsPaused(t *testing.T) {
	ctx := context.Background()
	for _, keep := range []bool{true, false} {
		rt := &stubCheckpointer{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
			insts: map[string]*runtime.Instance{}}
		dir := filepath.Join(testutil.ShortTempDir(t), "checkpoints")
		m, err := sandbox.New(ctx, sandbox.Config{Runtime: rt, CheckpointDir: dir, KeepPaused: keep,
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
		if err != nil {
			t.Fatal(err)
		}
		paused, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		running, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := paused.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatalf("keep %v: close: %v", keep, err)
		}
		ids, _ := rt.List(ctx)
		if keep {
			if len(ids) != 1 || ids[0] != paused.ID {
				t.Errorf("after Close the runtime holds %v, want the paused sandbox %s alone", ids, paused.ID)
			}
			if err := paused.Resume(ctx); apierr.CodeOf(err) != apierr.Capacity || paused.State() != sandbox.StatePaused {
				t.Errorf("a resume after Close: %v, state %s; want ERR_CAPACITY and paused", err, paused.State())
			}
			if _, err := os.Stat(filepath.Join(dir, paused.ID)); err != nil {
				t.Errorf("the kept sandbox's checkpoint: %v", err)
			}
			if err := rt.Destroy(ctx, paused.ID); err != nil {
				t.Fatal(err)
			}
		} else if len(ids) != 0 {
			t.Errorf("without KeepPaused the runtime holds %v after Close", ids)
		}
		if st := running.State(); st != sandbox.StateStopped {
			t.Errorf("keep %v: the running sandbox is %s after Close", keep, st)
		}
	}
}

// TestAdmitPauseRefuses: a pause the AdmitPause hook refuses returns the
// hook's error as is, sees the sandbox counted as paused, and leaves it
// running with the lifetime it had, nothing checkpointed and the Pausing
// hook never called; admitted, the same pause goes through.
func TestAdmitPauseRefuses(t *testing.T) {
	ctx := context.Background()
	rt := &stubCheckpointer{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
		insts: map[string]*runtime.Instance{}}
	dir := filepath.Join(testutil.ShortTempDir(t), "checkpoints")
	m := startEngine(t, sandbox.Config{Runtime: rt, CheckpointDir: dir,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt.Runtime)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "x = 5")
	refusal := apierr.New(apierr.SessionQuotaExceeded, "too many paused")
	var mu sync.Mutex
	refuse, seen, pausing := true, sandbox.State(""), 0
	m.SetHooks(sandbox.Hooks{
		AdmitPause: func(s *sandbox.Sandbox) error {
			mu.Lock()
			defer mu.Unlock()
			seen = s.State()
			if refuse {
				return refusal
			}
			return nil
		},
		Pausing: func(*sandbox.Sandbox) { mu.Lock(); pausing++; mu.Unlock() },
	})
	deadline := s.Deadline()
	if err := s.Pause(ctx); !errors.Is(err, refusal) {
		t.Fatalf("a refused pause: %v, want the hook's error", err)
	}
	mu.Lock()
	if seen != sandbox.StatePaused || pausing != 0 {
		t.Errorf("the hook saw %s, Pausing called %d times; want paused and none", seen, pausing)
	}
	refuse = false
	mu.Unlock()
	if st := s.State(); st != sandbox.StateRunning {
		t.Fatalf("state %s after a refused pause", st)
	}
	if d := s.Deadline().Sub(deadline); d < -time.Second || d > time.Second {
		t.Errorf("deadline moved by %v with a refused pause", d)
	}
	if _, err := os.Stat(filepath.Join(dir, s.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a checkpoint of a refused pause: %v", err)
	}
	if got := mainText(run(t, s, "python", "x + 1")); got != "6" {
		t.Fatalf("after a refused pause x + 1 is %q", got)
	}
	if err := s.Pause(ctx); err != nil || s.State() != sandbox.StatePaused {
		t.Fatalf("an admitted pause: %v, state %s", err, s.State())
	}
}
