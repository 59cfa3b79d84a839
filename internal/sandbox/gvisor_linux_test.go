package sandbox_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// gvisorEngine is a Manager whose runtime offers gVisor beside runc (the
// default stays runc unless the suite runs under gVisor), able to pause
// runc sandboxes.
func gvisorEngine(t *testing.T) *sandbox.Manager {
	t.Helper()
	dir := testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return runcEngineWith(t, func(c *oci.Config) { c.RunscPath = testutil.Runsc(t) },
		func(c *sandbox.Config) { c.CheckpointDir = filepath.Join(dir, "checkpoints") })
}

// TestGVisorSandbox: a sandbox created with runtime "gvisor" runs Python
// kernels, commands and file calls as its user, in gVisor's kernel; what
// gVisor cannot do (pause, snapshot, auto-pause, allow_subprocess: false)
// is refused with ERR_NOT_SUPPORTED, and a runc sandbox of the same engine
// still pauses (the control).
func TestGVisorSandbox(t *testing.T) {
	m := gvisorEngine(t)
	ctx := context.Background()
	s := newSandbox(t, m, sandbox.CreateOptions{Runtime: "gvisor"})
	if ex := run(t, s, "python", "x = 41"); ex.Status != sandbox.ExecSuccess {
		t.Fatalf("x = 41: %+v", ex)
	}
	if ex := run(t, s, "python", "import os\n(x + 1, os.uname().release)"); !strings.HasPrefix(mainText(ex), "(42, '") ||
		strings.Contains(mainText(ex), hostRelease(t)) {
		t.Fatalf("state or kernel: %q (host %s)", mainText(ex), hostRelease(t))
	}
	if ex := run(t, s, "javascript", "1 + 1"); mainText(ex) != "2" {
		t.Fatalf("javascript: %+v", ex)
	}
	// Files as the sandbox's user: what they create is theirs.
	if _, err := s.WriteFile(ctx, "notes.txt", strings.NewReader("hello"), 0o644, 0); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	info, err := s.ReadFile(ctx, "/home/user/notes.txt", &out, 0)
	if err != nil || out.String() != "hello" || info.Owner != "user" {
		t.Fatalf("read back: %q %+v %v", out.String(), info, err)
	}
	if _, err := s.WriteFile(ctx, "/etc/passwd", strings.NewReader("x"), 0o644, 0); err == nil {
		t.Fatal("the user overwrote /etc/passwd")
	}
	var stdout bytes.Buffer
	res, err := s.Run(ctx, sandbox.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "id -u; cat notes.txt"}, TimeoutMS: 10_000},
		collect(&stdout))
	if err != nil || res.ExitCode != 0 || stdout.String() != "1000\nhello" {
		t.Fatalf("command: %+v %v %q", res, err, stdout.String())
	}
	wantCode(t, s.Pause(ctx), apierr.NotSupported)
	wantCode(t, s.Snapshot(ctx, filepath.Join(t.TempDir(), "snap")), apierr.NotSupported)
	if ex := run(t, s, "python", "x"); mainText(ex) != "41" {
		t.Fatalf("the sandbox lost its state after the refusals: %+v", ex)
	}
	no := false
	_, err = m.Create(ctx, sandbox.CreateOptions{Runtime: "gvisor", Policy: &policy.Policy{AccessControl: &policy.AccessControl{AllowSubprocess: &no}}})
	wantCode(t, err, apierr.NotSupported)
	_, err = m.Create(ctx, sandbox.CreateOptions{Runtime: "gvisor", AutoPause: true})
	wantCode(t, err, apierr.NotSupported)
	_, err = m.Create(ctx, sandbox.CreateOptions{Runtime: "kata"})
	wantCode(t, err, apierr.BadRequest)
	// Control: a runc sandbox of this engine pauses.
	if !testutil.GVisor() {
		r := newSandbox(t, m, sandbox.CreateOptions{Runtime: "runc"})
		if err := r.Pause(ctx); err != nil {
			t.Fatalf("control: a runc sandbox does not pause: %v", err)
		}
	}
}

// TestGVisorNotInstalled: an engine without runsc refuses runtime
// "gvisor" with ERR_NOT_SUPPORTED, saying it is not installed.
func TestGVisorNotInstalled(t *testing.T) {
	testutil.SkipUnderGVisor(t, "the suite's engines have runsc")
	m := runcEngine(t)
	_, err := m.Create(context.Background(), sandbox.CreateOptions{Runtime: "gvisor"})
	wantCode(t, err, apierr.NotSupported)
	if !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("message: %v", err)
	}
}

// TestGVisorMemoryBomb: under gVisor the host's OOM killer ends the whole
// sandbox (the Sentry holds all its memory), which the engine reports as
// out of memory; its neighbour runs on.
func TestGVisorMemoryBomb(t *testing.T) {
	m := gvisorEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Runtime: "gvisor", Limits: runtime.Limits{MemoryBytes: 192 << 20}})
	other := newSandbox(t, m, sandbox.CreateOptions{Runtime: "gvisor"})
	_, err := s.Execute(context.Background(), sandbox.ExecuteRequest{Code: "a = []\nwhile True:\n    a.append(bytearray(16 << 20))", Timeout: 30 * time.Second}, nil)
	if err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("bomb: %v, want the sandbox ended out of memory", err)
	}
	if ex := run(t, other, "python", "sum(range(10))"); mainText(ex) != "45" {
		t.Fatalf("neighbour sandbox broken: %+v", ex)
	}
}

func hostRelease(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// collect appends a process's stdout to b.
func collect(b *bytes.Buffer) func(agentproto.Event) {
	return func(ev agentproto.Event) {
		if ev.Type == agentproto.EventStdout {
			b.Write(ev.Data)
		}
	}
}

// TestGVisorEgress: a gVisor sandbox with an allowlist reaches its
// allowed host through the engine's gateway, with the same policy and
// request counting as the runc sandbox beside it in the same engine:
// under a limit of two requests the third is refused, a resource_exceeded
// event says so, metering reads two; a name outside the allowlist does
// not resolve (dns_denied); an address never resolved is refused. It runs
// in the ordinary suite (the gVisor pass runs every egress test besides).
func TestGVisorEgress(t *testing.T) {
	w := newEgressWorld(t)
	log := &eventLog{}
	m := runcEngineWith(t, func(c *oci.Config) { c.RunscPath = testutil.Runsc(t) }, func(c *sandbox.Config) {
		c.Events = log
		c.Egress.Test = w.test
		c.Egress.Self = []netip.AddrPort{w.self}
	})
	limit := int64(2)
	pol := allowlist("api.test")
	pol.ResourceLimits = &policy.ResourceLimits{NetworkRequests: &limit}
	for _, rt := range []string{"gvisor", "runc"} {
		t.Run(rt, func(t *testing.T) {
			s := w.sandbox(t, m, sandbox.CreateOptions{Runtime: rt, Policy: pol})
			got := py(t, s, netProbe+`
import os
print(os.uname().release, [get("api.test") for _ in range(3)], dns("evil.test"), tcp("203.0.113.99", 80))`)
			release, got, _ := strings.Cut(got, " ")
			if (release == hostRelease(t)) != (rt == "runc") {
				t.Fatalf("%s sandbox on kernel %s (the host's: %s)", rt, release, hostRelease(t))
			}
			if want := "['hello from api.test', 'hello from api.test', 'ECONNREFUSED'] NXDOMAIN/0 ECONNREFUSED"; got != want {
				t.Fatalf("%s: %s, want %s", rt, got, want)
			}
			if evs := log.find(s.ID, events.ResourceExceeded, "resource", events.ResourceNetworkRequests); len(evs) != 1 {
				t.Fatalf("%s: resource_exceeded events = %+v", rt, evs)
			}
			if evs := log.find(s.ID, events.SecurityViolation, "target", "evil.test"); len(evs) != 1 || evs[0].Details["kind"] != events.KindDNSDenied {
				t.Fatalf("%s: dns_denied events = %+v", rt, evs)
			}
			if n := s.EgressRequests(); n != 2 {
				t.Fatalf("%s: EgressRequests = %d, want 2", rt, n)
			}
		})
	}
}

// TestGVisorRJava: R and Java contexts start under gVisor, whose kernel
// refuses to change a pipe's mode: their control pipes are given to the
// interpreter's user instead (kernel.givePipe). The control: Python, whose
// driver needs neither, runs in the same sandbox.
func TestGVisorRJava(t *testing.T) {
	m := gvisorEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Runtime: "gvisor"})
	if ex := run(t, s, "python", "6 * 7"); mainText(ex) != "42" {
		t.Fatalf("control, python: %+v", ex)
	}
	if ex := run(t, s, "r", "x <- 41; x + 1"); mainText(ex) != "[1] 42" {
		t.Fatalf("r: %+v %+v", ex, ex.Error)
	}
	if ex := run(t, s, "java", "int x = 41; x + 1"); mainText(ex) != "42" {
		t.Fatalf("java: %+v %+v", ex, ex.Error)
	}
}

// TestGVisorSudo: E2B's "sudo works for user without a password" holds
// under gVisor, whose kernel does not count seccomp filters: no code of
// the sandbox runs under allow_subprocess: false there (refused), so the
// agent's sudo has no confined caller to refuse (agent.callerConfined).
// The control: the runc sandbox beside it, where the kernel counts.
func TestGVisorSudo(t *testing.T) {
	m := gvisorEngine(t)
	for _, rt := range []string{"gvisor", "runc"} {
		s := newSandbox(t, m, sandbox.CreateOptions{Runtime: rt})
		ex := run(t, s, "python", `import subprocess
r = subprocess.run(["sudo", "id", "-u"], capture_output=True, text=True)
(r.returncode, r.stdout.strip(), r.stderr.strip())`)
		if got := mainText(ex); got != "(0, '0', '')" {
			t.Fatalf("%s: sudo id -u: %s %+v", rt, got, ex.Error)
		}
	}
}
