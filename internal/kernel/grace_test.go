package kernel

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestGraceBoundsTheStopOnly: the interrupt's grace bounds how long the
// interpreter takes to stop, not how long the kernel takes to forward
// what it wrote before it stopped. When the kernel's client took output
// slowly (here an emit that holds the first output the cell printed once
// interrupted until the driver has finished and the grace is over), the
// output queued behind it, the driver's markers among it, outlasted the
// grace: the kernel killed an interpreter that had stopped in time, and
// the context's state was lost (TestPythonInterruptedImport and
// TestRuncInterruptedPandasImport check that state under load). Three
// rounds: the kill was a random pick among ready channels.
func TestGraceBoundsTheStopOnly(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	k, err := Start(context.Background(), agentproto.ContextSpec{Language: "python", Cwd: t.TempDir()},
		Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}, InterruptGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	if r := run(t, k, code("keep = 7")); r.done.Status != agentproto.StatusOK {
		t.Fatalf("keep = 7: %+v", r.done)
	}
	const cell = `import time
try:
    print("waiting", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    for i in range(300):
        print(i, flush=True)
    raise`
	for round := range 3 {
		var stdout strings.Builder
		var execErr *agentproto.ExecError
		held, idle := false, false
		done := k.Execute(context.Background(), agentproto.ExecuteSpec{Code: cell, TimeoutMS: 200}, func(ev agentproto.Event) error {
			switch ev.Type {
			case agentproto.EventStdout:
				if !held && strings.HasPrefix(stdout.String(), "waiting\n") {
					// The first output printed once interrupted: the
					// SIGINT, and the grace, began before it. Hold it
					// until the driver has finished (it waits for its
					// next request) and the grace is over.
					held = true
					since := time.Now()
					for !idle || time.Since(since) < grace {
						idle = waitsForRequest(k.p.cmd.Process.Pid)
						if !idle && time.Since(since) > 30*time.Second {
							break
						}
						time.Sleep(time.Millisecond)
					}
				}
				stdout.Write(ev.Data)
			case agentproto.EventError:
				execErr = ev.Error
			}
			return nil
		})
		if !held || !idle {
			t.Fatalf("round %d: the driver did not finish after the interrupt (output %q)", round, stdout.String())
		}
		if done.Status != agentproto.StatusTimeout || execErr == nil || strings.Contains(execErr.Value, "killed") {
			t.Fatalf("round %d: an interpreter that stopped within its grace: %s %+v", round, done.Status, execErr)
		}
		if !strings.HasSuffix(stdout.String(), "\n298\n299\n") {
			t.Fatalf("round %d: output cut: ...%q", round, stdout.String()[max(0, stdout.Len()-40):])
		}
		if r := run(t, k, code("keep")); main(r) != "7" {
			t.Fatalf("round %d: state lost: %+v %+v", round, r.done, r.err)
		}
	}
}

// waitsForRequest reports whether the Python driver of pid is blocked
// reading its request pipe (fd 3): it has sent its done.
func waitsForRequest(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
	return err == nil && strings.HasPrefix(string(b), "0 0x3 ") // read(3, ...)
}
