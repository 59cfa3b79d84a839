//go:build linux

package osthread

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// sleeper is a child that runs until killed, with a Pdeathsig of SIGKILL.
func sleeper() *exec.Cmd {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// endThread starts cmd (through start) on a thread that ends as soon as
// it has (Discarded: never the main thread, which Go does not end).
func endThread(t *testing.T, start func(*exec.Cmd) error, cmd *exec.Cmd) {
	t.Helper()
	if err := Discarded(func() error { return start(cmd) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// killedWithin reports whether cmd ended (by a signal) within d.
func killedWithin(cmd *exec.Cmd, d time.Duration) bool {
	done := make(chan struct{})
	go func() { cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// TestKeptOutlivesThreads: a child with a Pdeathsig started through Kept
// lives on when the thread of the goroutine that asked for it ends. The
// control: the same child started by that goroutine itself is killed as
// its thread ends (what killed the fake runtime's agents at random in
// the engine's tests: TestEventsCoalesced's "sandbox agent is gone").
func TestKeptOutlivesThreads(t *testing.T) {
	control := sleeper()
	endThread(t, (*exec.Cmd).Start, control)
	if !killedWithin(control, 10*time.Second) {
		t.Fatal("the control lives on after its thread ended: the test does not end threads")
	}
	kept := sleeper()
	endThread(t, func(c *exec.Cmd) error { return Kept(c.Start) }, kept)
	if killedWithin(kept, 2*time.Second) {
		t.Fatal("a child started through Kept was killed when the asking thread ended")
	}
}
