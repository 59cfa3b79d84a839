package sandbox_test

import (
	"context"
	"errors"
	"fmt"
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

// roomCheckpointer is stubCheckpointer whose Restore fails with
// runtime.ErrCapacity while full is set, and counts the restores it made.
type roomCheckpointer struct {
	*stubCheckpointer
	mu       sync.Mutex
	full     bool
	restores int
}

func (c *roomCheckpointer) Restore(ctx context.Context, id, dir string) (*runtime.Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.full {
		return nil, fmt.Errorf("no id range left: %w", runtime.ErrCapacity)
	}
	c.restores++
	return c.stubCheckpointer.Restore(ctx, id, dir)
}

// TestResumeRefusedStaysPaused: a resume the AdmitResume hook refuses
// (the server: the account's credits, the host's memory) returns the
// hook's error as is, restores nothing, and leaves the sandbox paused
// with its checkpoint; a request that would resume it is refused the
// same way. A restore the runtime has no room for is ERR_CAPACITY, the
// sandbox paused too. Admitted, with room, the same sandbox resumes with
// its variable.
func TestResumeRefusedStaysPaused(t *testing.T) {
	ctx := context.Background()
	rt := &roomCheckpointer{stubCheckpointer: &stubCheckpointer{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
		insts: map[string]*runtime.Instance{}}}
	dir := filepath.Join(testutil.ShortTempDir(t), "checkpoints")
	m := startEngine(t, sandbox.Config{Runtime: rt, CheckpointDir: dir,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt.Runtime)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "x = 5")
	refusal := apierr.New(apierr.SessionQuotaExceeded, "credits exhausted")
	var mu sync.Mutex
	refuse := true
	m.SetHooks(sandbox.Hooks{AdmitResume: func(*sandbox.Sandbox) error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return refusal
		}
		return nil
	}})
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	stillPaused := func(what string, err error, want error, code apierr.Code) {
		t.Helper()
		if want != nil && !errors.Is(err, want) || want == nil && apierr.CodeOf(err) != code {
			t.Fatalf("%s: %v, want %v %s", what, err, want, code)
		}
		if st := s.State(); st != sandbox.StatePaused {
			t.Fatalf("%s: state %s, want paused", what, st)
		}
		if _, err := os.Stat(filepath.Join(dir, s.ID)); err != nil {
			t.Fatalf("%s: the checkpoint is gone: %v", what, err)
		}
		rt.mu.Lock()
		defer rt.mu.Unlock()
		if rt.restores != 0 {
			t.Fatalf("%s: %d restores made", what, rt.restores)
		}
	}
	stillPaused("a refused resume", s.Resume(ctx), refusal, "")
	_, err := s.Execute(ctx, sandbox.ExecuteRequest{Language: "python", Code: "x"}, nil)
	stillPaused("an execution that would resume", err, refusal, "")

	mu.Lock()
	refuse = false
	mu.Unlock()
	rt.mu.Lock()
	rt.full = true
	rt.mu.Unlock()
	stillPaused("a resume the host has no room for", s.Resume(ctx), nil, apierr.Capacity)

	rt.mu.Lock()
	rt.full = false
	rt.mu.Unlock()
	if got := mainText(run(t, s, "python", "x + 1")); got != "6" {
		t.Fatalf("after the admitted resume x + 1 is %q", got)
	}
	if st := s.State(); st != sandbox.StateRunning {
		t.Fatalf("state %s after the admitted resume", st)
	}
}
