package sandbox_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// spawnLoop runs /bin/true without pause through Python's subprocess
// (which vforks) and writes how many it ran to /tmp/spawned every 20.
const spawnLoop = `
import subprocess
n = 0
while True:
    subprocess.run(["/bin/true"])
    n += 1
    if n % 20 == 0:
        open("/tmp/spawned", "w").write(str(n))
`

// spawned reads /tmp/spawned (0: not yet).
func spawned(s *sandbox.Sandbox) int {
	var b strings.Builder
	if _, err := s.ReadFile(context.Background(), "/tmp/spawned", &b, 64); err != nil {
		return 0
	}
	n, _ := strconv.Atoi(b.String())
	return n
}

// waitSpawning waits until spawnLoop has spawned more than it had.
func waitSpawning(t *testing.T, s *sandbox.Sandbox) {
	t.Helper()
	before := spawned(s)
	for deadline := time.Now().Add(10 * time.Second); spawned(s) <= before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the loop spawns nothing")
		}
	}
}

// TestPauseWhileVforking: a sandbox whose background process spawns
// commands without pause (Python's subprocess, which vforks, as Go's
// os/exec does) pauses in well under CRIU's 10 s freeze timeout every
// time. The freezer used to catch a vfork parent waiting for its child's
// exec (state D in kernel_clone); CRIU then stopped the child before the
// exec and waited out its timeout on the parent ("Unseizable non-zombie
// ... state D"): about one dump in four with this loop. The runtime now
// freezes the sandbox itself at a moment when no task is in a vfork
// (internal/runtime/oci quiesce).
func TestPauseWhileVforking(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	run(t, s, "python", "x = 0")
	if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", spawnLoop}}); err != nil {
		t.Fatal(err)
	}
	const rounds = 12
	var took []time.Duration
	for round := 1; round <= rounds; round++ {
		waitSpawning(t, s)
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

// TestSnapshotWhileVforking: a snapshot's dump of such a sandbox never
// waits out CRIU's freeze timeout either, and the sandbox runs on (its
// loop goes on spawning) after each.
func TestSnapshotWhileVforking(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", spawnLoop}}); err != nil {
		t.Fatal(err)
	}
	dir := testutil.ShortTempDir(t)
	var took []time.Duration
	for round := 1; round <= 12; round++ {
		waitSpawning(t, s)
		began := time.Now()
		if err := s.Snapshot(ctx, filepath.Join(dir, strconv.Itoa(round))); err != nil {
			t.Fatalf("round %d: snapshot: %v", round, err)
		}
		took = append(took, time.Since(began).Round(time.Millisecond))
	}
	t.Logf("snapshots: %v", took)
	for i, d := range took {
		if d > 8*time.Second {
			t.Errorf("snapshot %d took %v: the dump waited out CRIU's freeze timeout", i+1, d)
		}
	}
}
