package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestPolicyCPUTimeCgroup: cpu_time_seconds counts the sandbox cgroup's
// CPU time, so CPU burnt in a thread or in a background process the code
// started (which the interpreter's own counters never see: it is not
// waited for) stops the execution too, with ERR_CPU_TIME_EXCEEDED and a
// resource_exceeded event carrying the limit and what was observed.
func TestPolicyCPUTimeCgroup(t *testing.T) {
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	// The code sleeps SECONDS while what it started spins.
	const wait = "import time\nt = time.time()\nwhile time.time() - t < SECONDS: time.sleep(0.05)\n'slept'"
	cases := []struct{ name, code string }{
		{"thread", "import threading\ndef spin():\n    while True: pass\nthreading.Thread(target=spin, daemon=True).start()\n" + wait},
		{"background process", "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n" + wait},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Unconfined, the code sleeps its time out.
			free := newSandbox(t, m, sandbox.CreateOptions{})
			if ex, _ := inContext(t, free, "python", strings.Replace(c.code, "SECONDS", "2", 1)); mainText(ex) != "'slept'" {
				t.Fatalf("unconfined: %+v %+v", ex, ex.Error)
			}
			s := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{
				CPUTimeSeconds: pf(0.5)}}})
			ex, id := inContext(t, s, "python", strings.Replace(c.code, "SECONDS", "25", 1))
			if apierr.Code(ex.ErrorCode) != apierr.CPUTimeExceeded || ex.CPUTimeMS < 500 || ex.CPUTimeMS > 2000 || ex.ExecutionTimeMS > 20000 {
				t.Fatalf("%+v %+v", ex, ex.Error)
			}
			ev := log.of(events.ResourceExceeded, s.ID, id)
			if len(ev) != 1 || ev[0].Details["resource"] != events.ResourceCPUTime || fmt.Sprint(ev[0].Details["limit"]) != "500" ||
				ev[0].Details["observed"].(float64) < 500 {
				t.Fatalf("events %+v", ev)
			}
			// The sandbox still works.
			if ex, _ := inContext(t, s, "python", "1 + 1"); mainText(ex) != "2" {
				t.Fatalf("after: %+v %+v", ex, ex.Error)
			}
		})
	}
}

// TestResourceExceededCgroup: the limits the cgroup and the writable
// layer enforce are reported as resource_exceeded with their limit and
// what was observed, for executions and for commands: pids (forks refused
// at pids.max, from pids.events), memory (an OOM kill) and disk (the
// writable layer full). Each program first runs where the limit is
// roomy, where it must succeed.
func TestResourceExceededCgroup(t *testing.T) {
	testutil.SkipUnderGVisor(t, "its memory limit ends the whole gVisor sandbox (the host OOM-kills the Sentry), not the interpreter: TestGVisorMemoryBomb; forks at the pids limit fail (RLIMIT_NPROC) without a pids event")
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	ctx := context.Background()
	free := newSandbox(t, m, sandbox.CreateOptions{})
	tight := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 32, MemoryBytes: 128 << 20, DiskBytes: 16 << 20}})
	// The children exit at once (unreaped, they still hold their pids
	// until the finally clause waits for them) and are waited for before
	// the code ends, refused or not. (The agent keeps threads of its own
	// at the limit: TestForkBombSparesTheAgent.)
	forks := "import os\nkids = []\ntry:\n    for i in range(48):\n        pid = os.fork()\n        if pid == 0:\n            os._exit(0)\n        kids.append(pid)\nfinally:\n    for k in kids: os.waitpid(k, 0)\n'forked'"
	command := func(t *testing.T, s *sandbox.Sandbox, script string) *sandbox.ProcessResult {
		t.Helper()
		res, err := s.Run(ctx, sandbox.ProcessSpec{Cmd: "bash", Args: []string{"-c", script}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// last returns the newest resource_exceeded event of tight about
	// resource, after n events of it were seen.
	last := func(t *testing.T, resource string, n int) events.Event {
		t.Helper()
		var got []events.Event
		for _, ev := range log.of(events.ResourceExceeded, tight.ID, "") {
			if ev.Details["resource"] == resource {
				got = append(got, ev)
			}
		}
		if len(got) != n+1 {
			t.Fatalf("%d resource_exceeded %s events, want %d: %+v", len(got), resource, n+1, got)
		}
		return got[n]
	}

	t.Run("pids in an execution", func(t *testing.T) {
		if ex, _ := inContext(t, free, "python", forks); mainText(ex) != "'forked'" {
			t.Fatalf("unconfined: %+v %+v", ex, ex.Error)
		}
		ex, id := inContext(t, tight, "python", forks)
		if ex.Error == nil || ex.Error.Name != "BlockingIOError" {
			t.Fatalf("%+v %+v", ex, ex.Error)
		}
		ev := last(t, events.ResourcePids, 0)
		if ev.ExecutionID != id || ev.Details["limit"] != int64(32) || ev.Details["observed"] != int64(32) || ev.Details["refused"].(uint64) < 1 {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("pids in a command", func(t *testing.T) {
		script := "python3 -c \"" + strings.ReplaceAll(strings.TrimSuffix(forks, "'forked'"), "\n", "\n") + "\""
		if res := command(t, free, script); res.ExitCode != 0 {
			t.Fatalf("unconfined: %+v", res)
		}
		if res := command(t, tight, script); res.ExitCode == 0 {
			t.Fatalf("%+v", res)
		}
		if ev := last(t, events.ResourcePids, 1); ev.Details["limit"] != int64(32) {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("memory in a command", func(t *testing.T) {
		script := "python3 -c 'b = bytearray(300 << 20); print(len(b))'"
		if res := command(t, free, script); res.ExitCode != 0 {
			t.Fatalf("unconfined: %+v", res)
		}
		if res := command(t, tight, script); res.Signal != 9 {
			t.Fatalf("%+v", res)
		}
		ev := last(t, events.ResourceMemory, 0)
		if ev.Details["limit"] != int64(128<<20) || ev.Details["observed"].(int64) < 100<<20 {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("disk in a command", func(t *testing.T) {
		// Seen when the command ends: the layer is still full then.
		script := "head -c 24M /dev/zero > /tmp/fill"
		if res := command(t, free, script); res.ExitCode != 0 {
			t.Fatalf("unconfined: %+v", res)
		}
		if res := command(t, tight, script); res.ExitCode == 0 {
			t.Fatalf("%+v", res)
		}
		defer command(t, tight, "rm /tmp/fill")
		ev := last(t, events.ResourceDisk, 0)
		if ev.Details["limit"] != int64(16<<20) || ev.Details["observed"].(int64) < 15<<20 {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("wall time and output of executions", func(t *testing.T) {
		for _, c := range []struct {
			resource string
			req      sandbox.ExecuteRequest
			code     apierr.Code
			limit    int64
		}{
			{events.ResourceWallTime, sandbox.ExecuteRequest{ID: "exe_wall", Code: "import time\ntime.sleep(10)", Timeout: 500 * time.Millisecond}, apierr.SandboxTimeout, 500},
			// Cut at the cap with a marker, the code runs on to its end.
			{events.ResourceOutput, sandbox.ExecuteRequest{ID: "exe_out", Code: "print('x' * 5000)\nprint('ran on')", MaxOutput: 1000}, "", 1000},
		} {
			ex, err := tight.Execute(ctx, c.req, nil)
			if c.code == "" && (err != nil || ex.Status != sandbox.ExecSuccess || !ex.Truncated || !strings.HasSuffix(ex.Stdout, fmt.Sprintf(agentproto.OutputCapMarker, 1000))) {
				t.Fatalf("%s: %+v, %v", c.resource, ex, err)
			}
			if err != nil || apierr.Code(ex.ErrorCode) != c.code {
				t.Fatalf("%s: %+v, %v", c.resource, ex, err)
			}
			ev := last(t, c.resource, 0)
			if ev.ExecutionID != c.req.ID || fmt.Sprint(ev.Details["limit"]) != fmt.Sprint(c.limit) || number(ev.Details["observed"]) < float64(c.limit) {
				t.Fatalf("event %+v", ev)
			}
		}
	})
	t.Run("disk in an execution", func(t *testing.T) {
		code := "open('/tmp/fill', 'wb').write(b'x' * (24 << 20))"
		ex, id := inContext(t, tight, "python", code)
		if ex.Error == nil || !strings.Contains(ex.Error.Value, "No space left") {
			t.Fatalf("%+v", ex.Error)
		}
		ev := last(t, events.ResourceDisk, 1)
		if ev.ExecutionID != id || ev.Details["limit"] != int64(16<<20) || ev.Details["observed"].(int64) < 15<<20 {
			t.Fatalf("event %+v", ev)
		}
		inContext(t, tight, "python", "import os; os.remove('/tmp/fill')")
	})
}

// number reads an event detail that holds a number of any Go type.
func number(v any) float64 {
	var f float64
	fmt.Sscan(fmt.Sprint(v), &f)
	return f
}

// TestPolicyResizesLiveSandbox: seed 002's resource_limits.memory_mb and
// disk_write_mb applied to a running sandbox lower its cgroup's memory
// limit and its writable tmpfs: what the sandbox could do before (hold
// 300 MiB, write 80 MiB) it cannot after (256 MiB, 50 MiB), with its
// context's state kept; a size below what the sandbox already holds is
// refused and changes nothing.
func TestPolicyResizesLiveSandbox(t *testing.T) {
	testutil.SkipUnderGVisor(t, "its memory limit ends the whole gVisor sandbox (the host OOM-kills the Sentry), not the interpreter: TestGVisorMemoryBomb")
	m := runcEngine(t)
	ctx := context.Background()
	mib := func(n int64) *int64 { return &n }
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mib(512)}}})
	hold := "x = bytearray(300 << 20)\nx[::4096] = b'1' * len(x[::4096])\nn = len(x) >> 20\ndel x\nn"
	write := "with open('/tmp/big', 'wb') as f:\n    f.write(b'\\0' * (80 << 20))\nimport os\nos.remove('/tmp/big')\n'written'"
	// The controls: before, both work.
	if ex := run(t, s, "python", hold); mainText(ex) != "300" {
		t.Fatalf("300 MiB under 512 MiB: %+v %+v", ex, ex.Error)
	}
	if ex := run(t, s, "python", write); mainText(ex) != "'written'" {
		t.Fatalf("80 MiB under 256 MiB of disk: %+v %+v", ex, ex.Error)
	}
	run(t, s, "python", "kept = 42")
	ch, err := s.SetPolicy(&policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mib(256), DiskWriteMB: mib(50)}})
	if err != nil || !ch.Resized {
		t.Fatalf("SetPolicy: %+v, %v", ch, err)
	}
	u, err := s.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryLimit != 256<<20 || u.DiskTotalBytes > 51<<20 || u.DiskTotalBytes < 49<<20 {
		t.Fatalf("after: memory limit %d, disk %d", u.MemoryLimit, u.DiskTotalBytes)
	}
	if l := s.CurrentLimits(); l.MemoryBytes != 256<<20 || l.DiskBytes != 50<<20 {
		t.Fatalf("limits %+v", l)
	}
	if ex := run(t, s, "python", "kept"); mainText(ex) != "42" {
		t.Fatalf("the context's state: %+v %+v", ex, ex.Error)
	}
	if ex := run(t, s, "python", write); ex.Error == nil || !strings.Contains(ex.Error.Value, "No space left") {
		t.Fatalf("80 MiB under 50 MiB of disk: %+v %+v", ex, ex.Error)
	}
	run(t, s, "python", "import os\nos.path.exists('/tmp/big') and os.remove('/tmp/big')")
	if ex := run(t, s, "python", hold); apierr.Code(ex.ErrorCode) != apierr.OutOfMemory {
		t.Fatalf("300 MiB under 256 MiB: %+v %+v", ex, ex.Error)
	}
	// Below what the sandbox holds: refused, nothing changed.
	if ex := run(t, s, "python", "open('/tmp/keep', 'wb').write(b'\\0' * (20 << 20))"); ex.Error != nil {
		t.Fatal(ex.Error)
	}
	if _, err := s.SetPolicy(&policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mib(256), DiskWriteMB: mib(10)}}); apierr.CodeOf(err) != apierr.InvalidPolicy {
		t.Fatalf("shrinking below what it holds: %v", err)
	}
	if l := s.CurrentLimits(); l.DiskBytes != 50<<20 {
		t.Fatalf("a refused resize changed the limits: %+v", l)
	}
	// Raised again, up to what the disk was made with: the room comes
	// back (the balloon of the lowered limit shrinks).
	if _, err := s.SetPolicy(&policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mib(256), DiskWriteMB: mib(200)}}); err != nil {
		t.Fatalf("raising to 200 MiB: %v", err)
	}
	if ex := run(t, s, "python", write); mainText(ex) != "'written'" {
		t.Fatalf("80 MiB under 200 MiB of disk: %+v %+v", ex, ex.Error)
	}
	if u, err := s.Usage(ctx); err != nil || u.DiskTotalBytes > 201<<20 || u.DiskTotalBytes < 199<<20 || u.DiskBytes > 21<<20 {
		t.Fatalf("after raising to 200 MiB: disk %d of %d (%v)", u.DiskBytes, u.DiskTotalBytes, err)
	}
	// Past what it was made with (the default 256 MiB): the disk grows
	// online where the server may (CAP_SYS_RESOURCE), else the raise is
	// refused and nothing changes.
	_, err = s.SetPolicy(&policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mib(256), DiskWriteMB: mib(400)}})
	if !hasCapability(t, unix.CAP_SYS_RESOURCE) {
		if apierr.CodeOf(err) != apierr.InvalidPolicy || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Fatalf("growing the disk without CAP_SYS_RESOURCE: %v", err)
		}
		if l := s.CurrentLimits(); l.DiskBytes != 200<<20 {
			t.Fatalf("a refused growth changed the limits: %+v", l)
		}
		return
	}
	if err != nil {
		t.Fatalf("growing the disk to 400 MiB: %v", err)
	}
	// Written a MiB at a time: the memory limit is still 256 MiB.
	big := "with open('/tmp/big', 'wb') as f:\n    for _ in range(300):\n        f.write(b'\\0' * (1 << 20))\n'written'"
	if ex := run(t, s, "python", big); mainText(ex) != "'written'" {
		t.Fatalf("300 MiB under 400 MiB of disk: %+v %+v", ex, ex.Error)
	}
}

// hasCapability reports whether this process has capability c in its
// effective set.
func hasCapability(t *testing.T, c int) bool {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return mask&(1<<uint(c)) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
