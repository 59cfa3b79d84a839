package pidfd

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threads is this process's count of OS threads.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: in /proc/self/status")
	return 0
}

// parked counts the goroutines parked on the poller in AwaitExit.
func parked() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "[IO wait") && strings.Contains(g, "pidfd.AwaitExit") {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or a minute has passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestAwaitExitHoldsNoThread waits for many children at once: with
// AwaitExit the process's thread count stays where it was; waiting in
// waitid, as before (the control), takes a thread for each child.
func TestAwaitExitHoldsNoThread(t *testing.T) {
	const n = 24
	for _, tc := range []struct {
		name  string
		await func(pid int) error
		holds bool
	}{
		{"pidfd", AwaitExit, false},
		{"blocking_waitid", func(pid int) error {
			var info unix.Siginfo
			return unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := threads(t)
			var cmds []*exec.Cmd
			for range n {
				c := exec.Command("sleep", "60")
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				cmds = append(cmds, c)
			}
			var started, done sync.WaitGroup
			errs := make(chan error, n)
			for _, c := range cmds {
				started.Add(1)
				done.Go(func() {
					started.Done()
					errs <- tc.await(c.Process.Pid)
				})
			}
			started.Wait()
			if tc.holds {
				// Idle threads left from before count too.
				waitFor(t, "a thread for each waiting goroutine", func() bool { return threads(t) >= n })
			} else {
				// Every goroutine waits, parked on the poller.
				waitFor(t, "every goroutine parked", func() bool { return parked() == n })
				if got := threads(t); got >= before+n/2 {
					t.Errorf("%d threads while waiting for %d children, %d before", got, n, before)
				}
			}
			for _, c := range cmds {
				c.Process.Kill()
			}
			done.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("await: %v", err)
				}
			}
			for _, c := range cmds {
				// Not reaped by the wait: Wait reaps it and sees the kill.
				if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Errorf("wait after await: %v", err)
				}
			}
		})
	}
}

// TestAwaitExitReturnsAtExit: AwaitExit returns when the child exits by
// itself, and fails for a pid that is not a child.
func TestAwaitExitReturnsAtExit(t *testing.T) {
	c := exec.Command("sh", "-c", "exit 3")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := AwaitExit(c.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); c.ProcessState == nil || c.ProcessState.ExitCode() != 3 {
		t.Fatalf("wait: %v %v", c.ProcessState, err)
	}
	if err := AwaitExit(1 << 30); err == nil {
		t.Error("a pid that does not exist was awaited")
	}
}
