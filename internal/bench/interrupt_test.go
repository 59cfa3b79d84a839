package bench

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterruptRunsStops: a bench stopped by SIGTERM runs the stops
// registered then (its servers' shutdown), not those unregistered, and
// exits with 128+15. The bench is this test's binary, run again.
func TestInterruptRunsStops(t *testing.T) {
	if dir := os.Getenv("SHEEPFOLD_TEST_INTERRUPT_DIR"); dir != "" {
		onInterrupt(func() {
			time.Sleep(100 * time.Millisecond) // the exit waits for it
			os.WriteFile(filepath.Join(dir, "stopped"), nil, 0o644)
		})
		onInterrupt(func() { os.WriteFile(filepath.Join(dir, "also"), nil, 0o644) })
		onInterrupt(func() { os.WriteFile(filepath.Join(dir, "unregistered"), nil, 0o644) })()
		os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644)
		time.Sleep(time.Minute)
		t.Fatal("not stopped by the signal")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptRunsStops$")
	cmd.Env = append(os.Environ(), "SHEEPFOLD_TEST_INTERRUPT_DIR="+dir)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the child never got ready: %s", out.String())
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit: %v, want status %d: %s", err, 128+int(syscall.SIGTERM), out.String())
	}
	for name, want := range map[string]bool{"stopped": true, "also": true, "unregistered": false} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: ran %v, want %v", name, err == nil, want)
		}
	}
}
