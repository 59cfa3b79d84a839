package kernel

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// The test binary is its own seccomp-exec helper, as the agent's binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "seccomp-exec" {
		os.Exit(SeccompExec(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func startWithHelper(t *testing.T, lang string) *Kernel {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	k, err := Start(t.Context(), agentproto.ContextSpec{Language: lang, Cwd: t.TempDir()},
		Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}, Helper: self})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// rawCalls are Python cells making process-creating system calls through
// libc.syscall, which no audit hook sees: only seccomp stops them. Each
// prints the return value and errno.
const rawLibc = "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n" +
	"NR = {'x86_64': {'fork': 57, 'clone': 56, 'execve': 59}, 'aarch64': {'clone': 220, 'execve': 221}}[platform.machine()]\n" +
	"FORK = ('fork', NR['fork']) if 'fork' in NR else ('clone', NR['clone'])\n"

// TestPythonSeccompReports: raw fork and execve work unconfined; under
// the filter each fails with EPERM and is reported with the system call as
// target; a fork loop is coalesced into two reports whose counts add up.
func TestPythonSeccompReports(t *testing.T) {
	t.Parallel()
	fork := rawLibc + "r = libc.syscall(FORK[1], 17, 0, 0, 0, 0) if FORK[0] == 'clone' else libc.syscall(FORK[1])\n" +
		"if r == 0: libc._exit(0)\nif r > 0: os_ = __import__('os'); os_.waitpid(r, 0)\nprint(r, ctypes.get_errno())"
	free := start(t, "python", nil)
	if r := run(t, free, code(fork)); r.err != nil || strings.HasPrefix(r.stdout, "-1") {
		t.Fatalf("unconfined, a raw fork works: %v", r)
	}
	k := start(t, "python", nil)
	r, vs := violations(t, k, withPolicy(fork, noSubprocess(t)))
	if r.err != nil || r.stdout != "-1 1\n" {
		t.Fatalf("confined, fork must fail with EPERM: %v", r)
	}
	forkName := "clone"
	if runtime.GOARCH == "amd64" {
		forkName = "fork"
	}
	if len(vs) != 1 || vs[0] != (agentproto.Violation{Kind: "subprocess_denied", Target: forkName, Count: 1, Source: agentproto.SourceAgent}) {
		t.Fatalf("violations %+v", vs)
	}

	execve := rawLibc + "r = libc.syscall(NR['execve'], b'/bin/true', (ctypes.c_char_p * 2)(b'true', None), None)\nprint(r, ctypes.get_errno())"
	r, vs = violations(t, k, code(execve))
	if r.err != nil || r.stdout != "-1 1\n" || len(vs) != 1 || vs[0] != (agentproto.Violation{Kind: "subprocess_denied", Target: "execve", Count: 1, Source: agentproto.SourceAgent}) {
		t.Fatalf("execve: %v %+v", r, vs)
	}

	loop := rawLibc + "n = 0\nfor i in range(3000):\n    r = libc.syscall(FORK[1], 17, 0, 0, 0, 0) if FORK[0] == 'clone' else libc.syscall(FORK[1])\n" +
		"    if r == 0: libc._exit(0)\n    n += r < 0\nn"
	r, vs = violations(t, k, code(loop))
	if main(r) != "3000" {
		t.Fatalf("fork loop: %v", r)
	}
	var total int64
	for _, v := range vs {
		if v.Kind != "subprocess_denied" || v.Target != forkName {
			t.Fatalf("fork loop violation %+v", v)
		}
		total += v.Count
	}
	if len(vs) > 2 || total != 3000 {
		t.Fatalf("a fork loop is reported in at most two counted events: %d events, count %d: %+v", len(vs), total, vs)
	}

	// A thread left running forks between executions (when the test
	// opens a FIFO it reads): reported at the next one, marked as such.
	bg := rawLibc + "import os, threading\nos.mkfifo('gate')\ndef f():\n    open('gate').read()\n" +
		"    libc.syscall(FORK[1], 17, 0, 0, 0, 0) if FORK[0] == 'clone' else libc.syscall(FORK[1])\n" +
		"threading.Thread(target=f, daemon=True).start()"
	if r, vs := violations(t, k, code(bg)); r.err != nil || len(vs) != 0 {
		t.Fatalf("%v %+v", r, vs)
	}
	if err := os.WriteFile(filepath.Join(k.spec.Cwd, "gate"), []byte("go"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.p.deny.kick:
	case <-time.After(10 * time.Second):
		t.Fatal("the thread's fork was not refused")
	}
	r, vs = violations(t, k, code("1"))
	if r.err != nil || len(vs) != 1 || vs[0] != (agentproto.Violation{Kind: "subprocess_denied", Target: forkName + " (between executions)", Count: 1, Source: agentproto.SourceAgent}) {
		t.Fatalf("a thread's fork: %v %+v", r, vs)
	}

	// Without a supervisor the kernel refuses the calls with ENOSYS.
	k.mu.Lock()
	k.p.lmu.Lock()
	k.p.listener.Close()
	k.p.lmu.Unlock()
	k.mu.Unlock()
	r, vs = violations(t, k, code(fork))
	if r.err != nil || r.stdout != "-1 38\n" || len(vs) != 0 {
		t.Fatalf("with the supervisor gone, fork must fail with ENOSYS: %v %+v", r, vs)
	}
}

// TestNodeNoSubprocess: Node starts under the filter; child_process
// works unconfined and is refused with SubprocessDeniedError and a report
// under it; threads (worker_threads) and ordinary code keep working.
func TestNodeNoSubprocess(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, code string }{
		{"execSync", "require('child_process').execSync('true').length"},
		{"spawn", "await new Promise((ok, fail) => { const c = require('child_process').spawn('true'); c.on('error', fail); c.on('exit', ok); })"},
		{"spawnSync", "const r = require('child_process').spawnSync('true'); if (r.error) throw r.error; r.status"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			free := startWithHelper(t, "javascript")
			if r := run(t, free, code(c.code)); r.err != nil {
				t.Fatalf("unconfined, it must work: %v", r)
			}
			k := startWithHelper(t, "javascript")
			r, vs := violations(t, k, withPolicy(c.code, noSubprocess(t)))
			if r.err == nil || r.err.Name != "SubprocessDeniedError" {
				t.Fatalf("confined: %v", r)
			}
			// libuv forks with fork(3), which is clone(2) in glibc.
			if len(vs) != 1 || vs[0].Kind != "subprocess_denied" || !strings.Contains("clone fork vfork", vs[0].Target) || vs[0].Target == "" {
				t.Fatalf("violations %+v", vs)
			}
		})
	}
	t.Run("ordinary code and threads", func(t *testing.T) {
		t.Parallel()
		k := startWithHelper(t, "javascript")
		r, vs := violations(t, k, withPolicy("globalThis.x = 20; x + 1", noSubprocess(t)))
		if main(r) != "21" || len(vs) != 0 || r.stderr != "" {
			t.Fatalf("%v %+v", r, vs)
		}
		w := "const { Worker } = require('worker_threads');\n" +
			"await new Promise((ok, fail) => { const w = new Worker('require(\"worker_threads\").parentPort.postMessage(6 * 7)', { eval: true }); w.on('message', ok); w.on('error', fail); })"
		r, vs = violations(t, k, withPolicy(w, noSubprocess(t)))
		if main(r) != "42" || len(vs) != 0 {
			t.Fatalf("worker_threads: %v %+v", r, vs)
		}
		if r := run(t, k, withPolicy("x", noSubprocess(t))); main(r) != "20" {
			t.Fatalf("state is kept under the filter: %v", r)
		}
	})
	t.Run("tightened after code ran", func(t *testing.T) {
		t.Parallel()
		k := startWithHelper(t, "javascript")
		if r := run(t, k, code("globalThis.y = 1; require('child_process').execSync('true').length")); r.err != nil {
			t.Fatalf("%v", r)
		}
		r := run(t, k, withPolicy("typeof y", noSubprocess(t)))
		if main(r) != "'undefined'" || !strings.Contains(r.stderr, "restarted to run under allow_subprocess: false") {
			t.Fatalf("a restart under the filter says so: %v", r)
		}
	})
}

// TestPythonOwnListener: code under the filter cannot take the refusal
// over with a filter and listener of its own (a newer filter's
// notification would win the tie with ours, and its "continue" would run
// the fork): the kernel allows one listener per filter chain and refuses a
// second with EBUSY. Unconfined the trick forks.
func TestPythonOwnListener(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("testdata/own_listener.py")
	if err != nil {
		t.Fatal(err)
	}
	free := start(t, "python", nil)
	if r := run(t, free, code(string(src))); r.err != nil || strings.HasPrefix(r.stdout, "-1") || r.stdout == "" {
		t.Fatalf("unconfined, the own listener lets the fork through: %v", r)
	}
	k := start(t, "python", nil)
	r := run(t, k, withPolicy(string(src), noSubprocess(t)))
	if r.err == nil || r.err.Name != "OSError" || !strings.Contains(r.err.Value, "[Errno 16]") {
		t.Fatalf("confined, a second listener must be refused (EBUSY): %v", r)
	}
}
