package sandbox_test

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// autoNotice is the auto-pause notice of the tests' engines: short, so
// that a test waits seconds, and long enough for several samples.
const autoNotice = time.Second

// autoEngine is pauseEngine with a short auto-pause notice; opts adjust
// its Config further.
func autoEngine(t *testing.T, opts ...func(*sandbox.Config)) (*sandbox.Manager, *typeLog) {
	t.Helper()
	m, _, log := pauseEngine(t, append([]func(*sandbox.Config){func(c *sandbox.Config) { c.AutoPauseNotice = autoNotice }}, opts...)...)
	return m, log
}

// waitLong is waitFor with a longer bound, for what takes a few
// lifetimes and notices on a loaded machine.
func waitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (l *typeLog) of(id string) []events.Type {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.types[id])
}

// TestAutoPauseIdle: an idle auto-pause sandbox is paused, not stopped,
// when its lifetime ends; sandbox.pausing comes before sandbox.paused; a
// request resumes it, with its Python variable, its lifetime that of its
// create again, also when resumed long past the lifetime it was paused
// with (the agent's own deadline must not end it at the restore). A
// sandbox without auto-pause, the control, still stops at its end.
func TestAutoPauseIdle(t *testing.T) {
	m, log := autoEngine(t)
	const life = 3 * time.Second
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: life, AutoPause: true})
	plain := newSandbox(t, m, sandbox.CreateOptions{Timeout: life})
	run(t, s, "python", "x = 41 + 1")
	waitLong(t, "the auto-pause", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	pausedAt := time.Now()
	typs := log.of(s.ID)
	ip, ipd := slices.Index(typs, events.SandboxPausing), slices.Index(typs, events.SandboxPaused)
	if ip < 0 || ipd < 0 || ip > ipd {
		t.Fatalf("events %v: want sandbox.pausing before sandbox.paused", typs)
	}
	if n := log.count(s.ID, events.SandboxStopped); n != 0 {
		t.Fatalf("the auto-pause sandbox was stopped: %v", typs)
	}
	waitLong(t, "the plain sandbox's end", func() bool { return plain.State() == sandbox.StateStopped })
	if n := log.count(plain.ID, events.SandboxPaused) + log.count(plain.ID, events.SandboxPausing); n != 0 {
		t.Errorf("the sandbox without auto-pause was paused or warned: %v", log.of(plain.ID))
	}
	if r := plain.Info().StopReason; r != "timed out" {
		t.Errorf("plain sandbox stop reason %q, want timed out", r)
	}
	// Paused for longer than the lifetime (and the agent's grace) it had.
	for time.Since(pausedAt) < life+3*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if got := stdout(run(t, s, "python", "print(x)")); strings.TrimSpace(got) != "42" {
		t.Fatalf("after the auto-resume x printed %q, want 42", got)
	}
	if left := time.Until(s.Deadline()); left < life-time.Second || left > life {
		t.Errorf("lifetime after the resume: %v left, want about %v", left, life)
	}
	// Idle again: paused again.
	waitLong(t, "the second auto-pause", func() bool { return log.count(s.ID, events.SandboxPaused) == 2 })
}

// TestAutoPauseNotWhileActive: an auto-pause sandbox whose lifetime ends
// while it works is not paused: not during a long execution, nor while
// its CPU is busy with a background loop, nor while a preview connection
// carries bytes. Its pause is put off (sandbox.pausing again) until the
// work ends; then it is paused.
func TestAutoPauseNotWhileActive(t *testing.T) {
	m, log := autoEngine(t)
	const life = 2 * time.Second
	ctx := context.Background()
	// putOff waits until s's pause has been put off twice (three
	// notices) and checks it still runs.
	putOff := func(t *testing.T, s *sandbox.Sandbox) {
		t.Helper()
		waitLong(t, "the pause put off", func() bool {
			return log.count(s.ID, events.SandboxPausing) >= 3 || s.State() != sandbox.StateRunning
		})
		if st := s.State(); st != sandbox.StateRunning {
			t.Fatalf("the active sandbox is %s: %v", st, log.of(s.ID))
		}
	}
	t.Run("execution", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Timeout: life, AutoPause: true})
		done := make(chan string, 1)
		go func() {
			ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Language: "python",
				Code: "import time, os\nwhile not os.path.exists('/tmp/stop'): time.sleep(0.05)\nprint('done')"}, nil)
			if err != nil {
				done <- err.Error()
				return
			}
			done <- stdout(ex)
		}()
		putOff(t, s)
		if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "touch", Args: []string{"/tmp/stop"}}); err != nil {
			t.Fatal(err)
		}
		if got := <-done; strings.TrimSpace(got) != "done" {
			t.Fatalf("the long execution ended with %q", got)
		}
		waitLong(t, "the pause once idle", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	})
	t.Run("cpu", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Timeout: life, AutoPause: true})
		pid, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", "while True: pass"}})
		if err != nil {
			t.Fatal(err)
		}
		putOff(t, s)
		if err := s.Signal(ctx, pid, 9); err != nil {
			t.Fatal(err)
		}
		waitLong(t, "the pause once idle", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	})
	t.Run("preview", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Timeout: life, AutoPause: true})
		// An echo server: each line sent comes back.
		if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", `
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", 8766)); l.listen()
c, _ = l.accept()
while True:
    b = c.recv(64)
    if not b: break
    c.sendall(b)
`}}); err != nil {
			t.Fatal(err)
		}
		var nc io.ReadWriteCloser
		waitLong(t, "the echo server", func() bool {
			c, err := s.DialPort(ctx, 8766)
			if err == nil {
				nc = c
			}
			return err == nil
		})
		stop := make(chan struct{})
		talked := make(chan error, 1)
		go func() {
			buf := make([]byte, 5)
			for {
				select {
				case <-stop:
					talked <- nc.Close()
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := nc.Write([]byte("ping\n")); err != nil {
					talked <- err
					return
				}
				if _, err := io.ReadFull(nc, buf); err != nil {
					talked <- err
					return
				}
			}
		}()
		putOff(t, s)
		close(stop)
		if err := <-talked; err != nil {
			t.Fatalf("the preview connection failed while the sandbox was active: %v", err)
		}
		waitLong(t, "the pause once idle", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	})
}

// TestAutoPauseBoundedPutOff: the attack is a tenant who keeps an
// auto-pause sandbox busy (a CPU loop) so that its pause is put off for
// ever, past the longest lifetime a sandbox may have. Put-offs end
// MaxTimeout after the pause was first due: it is then paused as it is,
// its loop included (and resumed with it). The control is
// TestAutoPauseNotWhileActive/cpu, where the same loop puts the pause off.
func TestAutoPauseBoundedPutOff(t *testing.T) {
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: auto-pause is refused (TestGVisorSandbox)")
	testutil.RequireRoot(t)
	const maxTimeout = 4 * time.Second
	m, log := autoEngine(t, func(c *sandbox.Config) { c.MaxTimeout = maxTimeout })
	ctx := context.Background()
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 2 * time.Second, AutoPause: true})
	if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "sh", Args: []string{"-c", "while :; do :; done"}}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	waitLong(t, "the overdue pause", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	if took := time.Since(began); took < maxTimeout {
		t.Errorf("paused after %v: the busy sandbox's pause was not put off", took)
	}
	if n := log.count(s.ID, events.SandboxPausing); n < 3 {
		t.Errorf("%d sandbox.pausing events: the pause was not put off", n)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestAutoPauseIdleTimeout: with the engine's idle timeout, an idle
// auto-pause sandbox is paused (not stopped) once the timeout passes,
// long before its lifetime ends, after sandbox.pausing; the control, a
// sandbox without auto-pause, is stopped "idle".
func TestAutoPauseIdleTimeout(t *testing.T) {
	m, log := autoEngine(t, func(c *sandbox.Config) { c.IdleTimeout = 2 * time.Second })
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute, AutoPause: true})
	plain := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	run(t, s, "python", "x = 42")
	waitLong(t, "the idle auto-pause", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	if typs := log.of(s.ID); slices.Index(typs, events.SandboxPausing) < 0 || slices.Index(typs, events.SandboxPausing) > slices.Index(typs, events.SandboxPaused) ||
		slices.Contains(typs, events.SandboxStopped) {
		t.Fatalf("events %v: want sandbox.pausing, then sandbox.paused, no sandbox.stopped", typs)
	}
	waitLong(t, "the plain sandbox's idle stop", func() bool { return plain.State() == sandbox.StateStopped })
	if r := plain.Info().StopReason; r != "idle" {
		t.Errorf("plain sandbox stop reason %q, want idle", r)
	}
	if got := stdout(run(t, s, "python", "print(x)")); strings.TrimSpace(got) != "42" {
		t.Fatalf("after the resume x printed %q", got)
	}
	if err := m.Kill(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestAutoPauseAfterRestart: an auto-paused sandbox left by its engine's
// Close (KeepPaused) is taken back by the next engine still auto-pause:
// a request resumes it with its variable and the lifetime of its create,
// and idle again it is paused again, not stopped.
func TestAutoPauseAfterRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs, rcfg, rt, state, cgroup, dir := restartRig(t)
	log := &typeLog{}
	cfg := sandbox.Config{Runtime: rt, CheckpointDir: filepath.Join(dir, "checkpoints"), KeepPaused: true, Events: log, AutoPauseNotice: autoNotice,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}
	first, err := sandbox.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const life = 3 * time.Second
	s, err := first.Create(ctx, sandbox.CreateOptions{Timeout: life, AutoPause: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s, "python", "x = 41 + 1")
	waitLong(t, "the auto-pause", func() bool { return log.count(s.ID, events.SandboxPaused) == 1 })
	if err := first.Close(ctx); err != nil {
		t.Fatalf("close the first engine: %v", err)
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("close the first runtime: %v", err)
	}
	m, _ := nextEngine(t, rcfg, cfg, state, cgroup)
	s2, err := m.Get(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill(ctx, s.ID)
	if !s2.AutoPause() {
		t.Fatal("the sandbox taken back is no longer auto-pause")
	}
	if got := stdout(run(t, s2, "python", "print(x)")); strings.TrimSpace(got) != "42" {
		t.Fatalf("after the restart and resume x printed %q", got)
	}
	if left := time.Until(s2.Deadline()); left < life-time.Second || left > life {
		t.Errorf("lifetime after the resume: %v left, want about %v", left, life)
	}
	waitLong(t, "the auto-pause under the second engine", func() bool { return log.count(s.ID, events.SandboxPaused) == 2 })
	if n := log.count(s.ID, events.SandboxStopped); n != 0 {
		t.Fatalf("the sandbox was stopped: %v", log.of(s.ID))
	}
}
