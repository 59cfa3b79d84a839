package sandbox_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestRuncRJava: R and Java contexts in a real sandbox of the python
// template (which carries r-base-core and the default JDK): state between
// executions, results (a plot as PNG, a data frame as text and HTML),
// errors; and the policy's layers hold for them as for Python: the
// no-subprocess filter (each attack works unconfined first), the CPU time
// limit and the memory cgroup.
func TestRuncRJava(t *testing.T) {
	testutil.SkipUnderGVisor(t, "allow_subprocess: false is refused under gVisor, and the host OOM killer ends the whole sandbox (TestGVisorSandbox, TestGVisorMemoryBomb)")
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	free := newSandbox(t, m, sandbox.CreateOptions{})

	t.Run("r", func(t *testing.T) {
		if ex := run(t, free, "r", "x <- 41"); ex.Status != sandbox.ExecSuccess || ex.Error != nil {
			t.Fatalf("%+v %+v", ex, ex.Error)
		}
		if ex := run(t, free, "R", "x + 1"); mainText(ex) != "[1] 42" {
			t.Fatalf("state: %+v %+v", ex, ex.Error)
		}
		ex := run(t, free, "r", "cat('hi\\n'); plot(1:3); data.frame(a = 1:2)")
		var png []byte
		var html string
		for _, r := range ex.Results {
			if r.PNG != "" {
				png, _ = base64.StdEncoding.DecodeString(r.PNG)
			}
			html += r.HTML
		}
		if ex.Stdout != "hi\n" || !strings.HasPrefix(string(png), "\x89PNG") || !strings.Contains(html, "<td>2</td>") {
			t.Fatalf("output, plot, data frame: %q %d bytes of PNG %q", ex.Stdout, len(png), html)
		}
		ex = run(t, free, "r", "stop('bad')")
		if ex.Status != sandbox.ExecError || ex.Error == nil || ex.Error.Name != "simpleError" || ex.Error.Value != "bad" {
			t.Fatalf("error: %+v %+v", ex, ex.Error)
		}
	})
	t.Run("java", func(t *testing.T) {
		if ex := run(t, free, "java", "int x = 41;\nString hi() { return \"hi\"; }"); ex.Status != sandbox.ExecSuccess || ex.Error != nil {
			t.Fatalf("%+v %+v", ex, ex.Error)
		}
		if ex := run(t, free, "java", "System.out.println(hi()); x + 1"); mainText(ex) != "42" || ex.Stdout != "hi\n" {
			t.Fatalf("state: %+v %+v", ex, ex.Error)
		}
		ex := run(t, free, "java", "Integer.parseInt(\"x\")")
		if ex.Status != sandbox.ExecError || ex.Error == nil || ex.Error.Name != "NumberFormatException" || !strings.Contains(ex.Error.Traceback, "parseInt") {
			t.Fatalf("error: %+v %+v", ex, ex.Error)
		}
	})

	nosub := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{AccessControl: &policy.AccessControl{AllowSubprocess: pb(false)}}})
	for _, c := range []struct{ name, lang, code string }{
		{"r system", "r", "stopifnot(system('true') == 0)"},
		{"r pipe", "r", "stopifnot(readLines(pipe('echo x')) == 'x')"},
		{"java ProcessBuilder", "java", `if (new ProcessBuilder("true").start().waitFor() != 0) throw new RuntimeException("failed");`},
		{"java vfork", "java", `System.setProperty("jdk.lang.Process.launchMechanism", "VFORK"); if (new ProcessBuilder("true").start().waitFor() != 0) throw new RuntimeException("failed");`},
	} {
		t.Run("allow_subprocess false/"+c.name, func(t *testing.T) {
			if ex, _ := inContext(t, free, c.lang, c.code); ex.Status != sandbox.ExecSuccess || ex.Error != nil {
				t.Fatalf("unconfined, the attack must work: %+v %+v", ex, ex.Error)
			}
			ex, id := inContext(t, nosub, c.lang, c.code)
			if ex.Error == nil {
				t.Fatalf("confined, the program ran: %+v", ex)
			}
			vs := log.of(events.SecurityViolation, nosub.ID, id)
			if len(vs) == 0 || vs[0].Details["kind"] != events.KindSubprocessDenied || vs[0].Source != events.SourceAgent {
				t.Fatalf("events %+v", vs)
			}
		})
	}
	t.Run("allow_subprocess false/ordinary code", func(t *testing.T) {
		for lang, c := range map[string][2]string{"r": {"v <- 2; plot(1); v * 21", "[1] 42"}, "java": {"var l = new java.util.ArrayList<Integer>(); l.add(42); l.get(0)", "42"}} {
			ex, id := inContext(t, nosub, lang, c[0])
			if mainText(ex) != c[1] || ex.Error != nil {
				t.Fatalf("%s: %+v %+v", lang, ex, ex.Error)
			}
			if vs := log.of(events.SecurityViolation, nosub.ID, id); len(vs) != 0 {
				t.Fatalf("%s: no event expected: %+v", lang, vs)
			}
		}
	})

	cpu := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{CPUTimeSeconds: pf(1)}}})
	for lang, spin := range map[string][2]string{
		"r":    {"t0 <- proc.time()[['user.self']]; while (proc.time()[['user.self']] - t0 < 2) {}; 'spun'", `[1] "spun"`},
		"java": {"long t0 = System.nanoTime(); while (System.nanoTime() - t0 < 2_000_000_000L) {} \"spun\"", "spun"},
	} {
		t.Run("cpu_time_seconds/"+lang, func(t *testing.T) {
			if ex, _ := inContext(t, free, lang, spin[0]); mainText(ex) != spin[1] {
				t.Fatalf("unconfined: %+v %+v", ex, ex.Error)
			}
			ex, id := inContext(t, cpu, lang, spin[0])
			if apierr.Code(ex.ErrorCode) != apierr.CPUTimeExceeded {
				t.Fatalf("%+v %+v", ex, ex.Error)
			}
			if ev := log.of(events.ResourceExceeded, cpu.ID, id); len(ev) != 1 || ev[0].Details["resource"] != events.ResourceCPUTime {
				t.Fatalf("events %+v", ev)
			}
		})
	}

	t.Run("memory_mb/r", func(t *testing.T) {
		code := "x <- numeric(25e6); length(x)" // 200 MB, touched
		if ex, _ := inContext(t, newSandbox(t, m, sandbox.CreateOptions{}), "r", code); mainText(ex) != "[1] 25000000" {
			t.Fatalf("unconfined: %+v %+v", ex, ex.Error)
		}
		small := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: pi(128)}}})
		ex, id := inContext(t, small, "r", code)
		if apierr.Code(ex.ErrorCode) != apierr.OutOfMemory {
			t.Fatalf("%+v %+v", ex, ex.Error)
		}
		if ev := log.of(events.ResourceExceeded, small.ID, id); len(ev) != 1 || ev[0].Details["resource"] != events.ResourceMemory {
			t.Fatalf("events %+v", ev)
		}
	})
	t.Run("memory_mb/java", func(t *testing.T) {
		// The JVM sizes its heap from the cgroup's limit: past it the
		// code gets Java's own OutOfMemoryError, the sandbox's limit holds.
		code := "byte[] b = new byte[64 << 20]; b.length"
		if ex, _ := inContext(t, newSandbox(t, m, sandbox.CreateOptions{}), "java", code); mainText(ex) != "67108864" {
			t.Fatalf("unconfined: %+v %+v", ex, ex.Error)
		}
		small := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: pi(128)}}})
		ex, _ := inContext(t, small, "java", code)
		if ex.Error == nil || ex.Error.Name != "OutOfMemoryError" {
			t.Fatalf("%+v %+v", ex, ex.Error)
		}
		if ex, _ := inContext(t, small, "java", "1 + 1"); mainText(ex) != "2" {
			t.Fatalf("after the OutOfMemoryError: %+v %+v", ex, ex.Error)
		}
	})
}
