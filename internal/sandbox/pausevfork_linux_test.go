package sandbox_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestPauseWhileVforking: a sandbox whose background process spawns
// commands without pause (Python's subprocess, which vforks, as a shell
// loop or Go's os/exec do) pauses in well under CRIU's 10 s freeze
// timeout every time. The freezer used to catch a vfork parent waiting
// for its child's exec (state D in kernel_clone), CRIU then stopped the
// child before the exec and waited out its timeout on the parent
// ("Unseizable non-zombie ... state D"): about one dump in four with this
// loop, one in twelve in ordinary sandboxes. The runtime now freezes the
// sandbox itself at a moment when no task is in a vfork
// (internal/runtime/oci quiesce).
func TestPauseWhileVforking(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	run(t, s, "python", "x = 0")
	if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", `
import subprocess
n = 0
while True:
    subprocess.run(["/bin/true"])
    n += 1
    if n % 20 == 0:
        open("/tmp/spawned", "w").write(str(n))
`}}); err != nil {
		t.Fatal(err)
	}
	// The loop spawns before the first pause, and after each resume.
	spawned := func() int {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var b strings.Builder
			if _, err := s.ReadFile(ctx, "/tmp/spawned", &b, 64); err == nil {
				if n, err := strconv.Atoi(b.String()); err == nil && n > 0 {
					return n
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("the loop spawns nothing")
			}
		}
	}
	const rounds = 12
	var took []time.Duration
	for round := 1; round <= rounds; round++ {
		before := spawned()
		for deadline := time.Now().Add(10 * time.Second); spawned() <= before; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the loop spawns nothing after the resume", round)
			}
		}
		began := time.Now()
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		took = append(took, time.Since(began).Round(time.Millisecond))
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		if got := stdout(run(t, s, "python", "x += 1\nprint(x)")); got != strconv.Itoa(round)+"\n" {
			t.Fatalf("round %d: the kernel says %q after the resume", round, got)
		}
	}
	t.Logf("pauses: %v", took)
	for i, d := range took {
		// CRIU's freeze timeout is 10 s: a dump that waited it out took
		// longer (and was tried again).
		if d > 8*time.Second {
			t.Errorf("pause %d took %v: the dump waited out CRIU's freeze timeout", i+1, d)
		}
	}
}
