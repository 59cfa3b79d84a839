package sandbox_test

import (
	"context"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
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
