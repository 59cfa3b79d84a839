package kernel

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Hostile cells that write the driver's end-of-execution message
// themselves: what the driver says is the sandbox's word (docs/security.md,
// section 7), so nothing the kernel keeps may depend on it alone.

// forgeEnd is code that ends its execution early and goes on running, per
// language: it closes its stdout and stderr (the kernel reads their end as
// the end of the execution's output), writes "done" on the control pipe,
// and then runs then.
var forgeEnd = map[string]string{
	"python": "import os, sys\nsys.stdout.flush(); sys.stderr.flush()\nos.close(1); os.close(2)\n" +
		"os.write(4, b'{\"type\":\"done\"}\\n')\n%s\n",
	// Node's driver writes the marker after the cell: fds 1 and 2 are
	// opened again on /dev/null, so that it does not fail.
	"javascript": "const fs = require('fs'); fs.closeSync(1); fs.closeSync(2);\n" +
		"fs.openSync('/dev/null', 'w'); fs.openSync('/dev/null', 'w');\nfs.writeSync(4, '{\"type\":\"done\"}\\n');\n%s\n",
}

// TestForgedEndClosedPipes: an execution whose code closed its stdout and
// stderr and wrote "done" ends there (the attack works: the kernel cannot
// tell), and the next execution replaces the interpreter, whose pipes
// ended, instead of waiting for output from them forever (it spun on the
// closed output channel with the kernel's lock held, so that the context
// could not even be deleted).
func TestForgedEndClosedPipes(t *testing.T) {
	t.Parallel()
	block := map[string]string{"python": "import threading\nthreading.Event().wait()",
		"javascript": "setInterval(() => {}, 1 << 30);"}
	for lang, forge := range forgeEnd {
		k := start(t, lang, nil)
		r := run(t, k, code(fmt.Sprintf(forge, block[lang])))
		if r.done.Status != agentproto.StatusOK {
			t.Fatalf("%s: the forged end did not end the execution: %v", lang, r)
		}
		next := make(chan record, 1)
		go func() { next <- run(t, k, code("1 + 1")) }()
		select {
		case r = <-next:
		case <-time.After(20 * time.Second):
			panic(lang + ": the execution after a forged end with closed pipes does not end")
		}
		if main(r) != "2" {
			t.Fatalf("%s: after a forged end with closed pipes: %v", lang, r)
		}
	}
}

// burnAfterEnd is code that ends its execution early by writing the
// driver's end itself, then, 0.3 s later, burns 1.5 s of CPU time in a
// thread, a timer or a background job of its process group, and at last
// writes the CPU time it burnt (in seconds) to the file %[1]s. The wait
// lets the kernel read the forged end before the burn: on a loaded host
// it read it late, and the execution's CPU time took in the burn's start.
var burnAfterEnd = map[string]string{
	// The marker is on the driver's frame.
	"python": `import os, sys, threading, time
f = sys._getframe()
while 'req' not in f.f_locals:
    f = f.f_back
mark = ('\x1e' + f.f_locals['req']['marker'] + '\n').encode()
sys.stdout.flush(); sys.stderr.flush()
os.write(1, mark); os.write(2, mark); os.write(4, b'{"type":"done"}\n')
def burn():
    time.sleep(0.3)
    t = time.thread_time()
    while time.thread_time() - t < 1.5: pass
    open(%[1]q, 'w').write(str(time.thread_time() - t))
threading.Thread(target=burn).start()
`,
	"javascript": fmt.Sprintf(forgeEnd["javascript"], `setTimeout(() => {
  const t = process.cpuUsage(); let u;
  do { u = process.cpuUsage(t); } while (u.user + u.system < 1.5e6);
  fs.writeFileSync(%[1]q, String((u.user + u.system) / 1e6));
}, 300);`),
	// The marker is in a variable of the driver; the job is in the
	// shell's process group (no job control).
	"bash": `printf '\036%%s\n' "$__sf_marker"; printf '\036%%s\n' "$__sf_marker" >&2; printf 'done 0\n' >&"$__sf_msg"
( sleep 0.3; while :; do read -a f < /proc/$BASHPID/stat; (( f[13] + f[14] >= 150 )) && break; done
  echo "$(( f[13] + f[14] ))e-2" > %[1]q ) &
`,
}

// TestForgedEndCPUTime: a cell under a CPU time limit of 300 ms that ends
// its execution early by writing the driver's end-of-execution message
// itself, then burns 1.5 s of CPU time in a thread (Python), a timer
// (Node) or a background job (Bash). The control, without the watch that
// goes on after the end (noIdleWatch), proves the attack: the execution
// reports success, the code burns all of it, and the next execution runs
// as if nothing happened. With it, the process group is killed near the
// limit and the next execution reports CPUTimeExceeded instead of running;
// the one after runs in a fresh interpreter.
func TestForgedEndCPUTime(t *testing.T) {
	t.Parallel()
	// 300 ms, not less: a fresh interpreter's start (Node's above all) is
	// counted in its first execution, and on a loaded VM came near 100 ms.
	pol := &agentproto.KernelPolicy{CPUTimeMS: 300, AllowNetwork: true}
	noop := map[string]string{"python": "1", "javascript": "1", "bash": "true"}
	for _, lang := range []string{"python", "javascript", "bash"} {
		for _, defended := range []bool{false, true} {
			k := start(t, lang, nil)
			k.noIdleWatch = !defended
			// The interpreter's start (its imports) is not the
			// attack's.
			if r := run(t, k, code(noop[lang])); r.done.Status != agentproto.StatusOK {
				t.Fatalf("%s: the warm-up: %v", lang, r)
			}
			burnt := filepath.Join(t.TempDir(), "burnt")
			r := run(t, k, withPolicy(fmt.Sprintf(burnAfterEnd[lang], burnt), pol))
			if r.done.Status != agentproto.StatusOK || r.done.Stats.CPUTimeMS >= 300 {
				t.Fatalf("%s: the forged end did not end the execution at once: %v %+v", lang, r, r.done.Stats)
			}
			if !defended {
				var s float64
				waitFor(t, 60*time.Second, lang+": the burn to finish", func() bool {
					b, _ := os.ReadFile(burnt)
					var err error
					s, err = strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
					return err == nil
				})
				if s < 1.45 {
					t.Fatalf("%s: the control burnt %g s", lang, s)
				}
				if r := run(t, k, withPolicy(noop[lang], pol)); r.done.Status != agentproto.StatusOK {
					t.Fatalf("%s: control: the execution after the burn: %v", lang, r)
				}
				continue
			}
			k.mu.Lock()
			p := k.p
			k.mu.Unlock()
			select {
			case <-p.exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the interpreter burning past its limit after a forged end was not killed", lang)
			}
			if _, err := os.Stat(burnt); err == nil {
				t.Fatalf("%s: the burn finished: it was not stopped", lang)
			}
			r = run(t, k, withPolicy(noop[lang], pol))
			if r.done.Status != agentproto.StatusCPULimit || r.err == nil || r.err.Name != "CPUTimeExceeded" ||
				r.done.Stats == nil || r.done.Stats.CPUTimeMS <= 300 || r.done.Stats.CPUTimeMS >= 1450 {
				t.Fatalf("%s: the execution after the kill: %v %+v", lang, r, r.done.Stats)
			}
			if r := run(t, k, withPolicy(noop[lang], pol)); r.done.Status != agentproto.StatusOK {
				t.Fatalf("%s: the execution after the report: %v", lang, r)
			}
		}
	}
}

// TestIdleWatchHonest: what an honest cell leaves running within its
// limit (a thread that sleeps, one that computes a little after the
// cell returned) is not killed, and the context keeps its state.
func TestIdleWatchHonest(t *testing.T) {
	t.Parallel()
	pol := &agentproto.KernelPolicy{CPUTimeMS: 300, AllowNetwork: true}
	k := start(t, "python", nil)
	done := filepath.Join(t.TempDir(), "done")
	r := run(t, k, withPolicy(fmt.Sprintf(`import threading, time
x = 7
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
def work():
    time.sleep(0.05)
    t = time.thread_time()
    while time.thread_time() - t < 0.1: pass
    open(%q, 'w').write('ok')
threading.Thread(target=work).start()
`, done), pol))
	if r.done.Status != agentproto.StatusOK {
		t.Fatalf("%v", r)
	}
	waitFor(t, 30*time.Second, "the thread's work", func() bool { _, err := os.Stat(done); return err == nil })
	if r := run(t, k, withPolicy("x", pol)); main(r) != "7" {
		t.Fatalf("the execution after an honest thread: %v", r)
	}
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForgedViolationsMarked: code writes violation reports on the
// driver's control pipe as the driver's own hooks do; they reach the
// host, marked as the sandbox's word, as the real ones the driver sends
// are (the seccomp supervisor's are the agent's: TestPythonSeccompReports).
func TestForgedViolationsMarked(t *testing.T) {
	t.Parallel()
	forge := map[string]string{
		"python":     `import os; os.write(4, b'{"type":"violation","kind":"syscall_denied","target":"forged"}\n')`,
		"javascript": `require('fs').writeSync(4, '{"type":"violation","kind":"syscall_denied","target":"forged"}\n')`,
	}
	for lang, c := range forge {
		k := start(t, lang, nil)
		r, vs := violations(t, k, code(c))
		if r.done.Status != agentproto.StatusOK || len(vs) != 1 ||
			vs[0] != (agentproto.Violation{Kind: "syscall_denied", Target: "forged", Source: agentproto.SourceSandbox}) {
			t.Fatalf("%s: %v %+v", lang, r, vs)
		}
	}
	k := start(t, "python", nil)
	_, vs := violations(t, k, withPolicy("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)",
		&agentproto.KernelPolicy{}))
	if len(vs) != 1 || vs[0].Kind != "network_denied" || vs[0].Source != agentproto.SourceSandbox {
		t.Fatalf("the driver's own report: %+v", vs)
	}
}

// TestIdleWatchInterval: the watch reads an idle context rarely (at most
// every second when much of the budget is left) and more often as the
// budget runs out, never less than idleEvery apart.
func TestIdleWatchInterval(t *testing.T) {
	t.Parallel()
	cpus := time.Duration(goruntime.NumCPU())
	for _, tc := range []struct {
		budget, after float64
		want          time.Duration
	}{
		{budget: 3_600_000, after: 0, want: time.Second},
		{budget: 2100, after: 0, want: max(2100*time.Millisecond/(4*cpus), 100*time.Millisecond)},
		{budget: 2100, after: 2090, want: 100 * time.Millisecond},
		{budget: 2100, after: 2200, want: 100 * time.Millisecond},
	} {
		w := &idleWatch{budget: tc.budget, afterMS: tc.after}
		if got := w.next(); got != tc.want {
			t.Errorf("budget %g ms, %g used: next reading in %s, want %s", tc.budget, tc.after, got, tc.want)
		}
	}
}
