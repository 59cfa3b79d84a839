package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/lang"
)

type record struct {
	stdout, stderr string
	results        []agentproto.Result
	err            *agentproto.ExecError
	stdoutEvents   int
	done           agentproto.Event
}

func start(t *testing.T, lang string, env map[string]string) *Kernel {
	t.Helper()
	k, err := Start(context.Background(), agentproto.ContextSpec{Language: lang, Cwd: t.TempDir(), Env: env},
		Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func run(t *testing.T, k *Kernel, spec agentproto.ExecuteSpec) record {
	t.Helper()
	var r record
	r.done = k.Execute(context.Background(), spec, func(ev agentproto.Event) error {
		switch ev.Type {
		case agentproto.EventStdout:
			r.stdout += string(ev.Data)
			r.stdoutEvents++
		case agentproto.EventStderr:
			r.stderr += string(ev.Data)
		case agentproto.EventResult:
			r.results = append(r.results, *ev.Result)
		case agentproto.EventError:
			r.err = ev.Error
		}
		return nil
	})
	return r
}

func code(c string) agentproto.ExecuteSpec { return agentproto.ExecuteSpec{Code: c} }

func main(r record) string {
	for _, res := range r.results {
		if res.IsMainResult {
			return res.Text
		}
	}
	return ""
}

func TestPython(t *testing.T) {
	t.Parallel()
	k := start(t, "py", nil)
	if r := run(t, k, code("x = 41")); r.done.Status != agentproto.StatusOK || len(r.results) != 0 {
		t.Fatalf("x = 41: %+v", r)
	}
	if r := run(t, k, code("x + 1")); main(r) != "42" {
		t.Fatalf("state: %+v", r)
	}
	r := run(t, k, code("import sys\nprint('out')\nprint('err', file=sys.stderr)\nclass H:\n    def _repr_html_(self): return '<b>h</b>'\ndisplay(H())\nH()"))
	if r.stdout != "out\n" || r.stderr != "err\n" || len(r.results) != 2 || r.results[1].HTML != "<b>h</b>" || !r.results[1].IsMainResult || r.results[0].IsMainResult {
		t.Fatalf("output and results: %+v", r)
	}
	r = run(t, k, code("def f():\n    raise ValueError('bad')\nf()"))
	if r.done.Status != agentproto.StatusError || r.err == nil || r.err.Name != "ValueError" || r.err.Value != "bad" ||
		!strings.Contains(r.err.Traceback, "f()") || strings.Contains(r.err.Traceback, "_run") {
		t.Fatalf("exception: %+v", r.err)
	}
	if r = run(t, k, code("def (")); r.err == nil || r.err.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v", r.err)
	}
	if r = run(t, k, code("import sys; sys.exit(3)")); r.err == nil || r.err.Name != "SystemExit" {
		t.Fatalf("sys.exit: %+v", r.err)
	}
	r = run(t, k, agentproto.ExecuteSpec{Code: "import os\nos.environ.get('ONCE')", Env: map[string]string{"ONCE": "yes"}})
	if main(r) != "'yes'" {
		t.Fatalf("env: %+v", r)
	}
	if r = run(t, k, code("import os\nos.environ.get('ONCE')")); len(r.results) != 0 {
		t.Fatalf("env leaked into the next execution: %+v", r.results)
	}
	if r = run(t, k, code("x")); main(r) != "41" {
		t.Fatalf("state lost: %+v", r)
	}
	if r.done.Stats == nil || r.done.Stats.PeakMemoryBytes < 1<<20 {
		t.Fatalf("stats: %+v", r.done.Stats)
	}
}

func TestPythonStreams(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	var first, last time.Time
	n := 0
	k.Execute(context.Background(), code("import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)"), func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventStdout {
			if n == 0 {
				first = time.Now()
			}
			last = time.Now()
			n++
		}
		return nil
	})
	if n < 3 || last.Sub(first) < 300*time.Millisecond {
		t.Fatalf("output was not streamed: %d events over %s", n, last.Sub(first))
	}
}

// fakePyplot writes a stand-in matplotlib.pyplot (the host's python has
// none) with extra appended, and returns the PYTHONPATH directory.
func fakePyplot(t *testing.T, extra string) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "matplotlib"), 0o755)
	os.WriteFile(filepath.Join(dir, "matplotlib", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "matplotlib", "pyplot.py"), []byte(`
_figs = {}
class Figure:
    def savefig(self, buf, format=None, bbox_inches=None):
        buf.write(b"\x89PNG\r\n\x1a\nfake")
def figure(n=1):
    return _figs.setdefault(n, Figure())
def get_fignums():
    return sorted(_figs)
def close(which=None):
    _figs.clear()
`+extra), 0o644)
	return dir
}

func TestPythonFigures(t *testing.T) {
	t.Parallel()
	dir := fakePyplot(t, "def plot(*a):\n    figure(1)\n")
	k := start(t, "python", map[string]string{"PYTHONPATH": dir})
	r := run(t, k, code("import matplotlib.pyplot as plt\nplt.plot([1, 2])"))
	if len(r.results) != 1 || !strings.HasPrefix(r.results[0].PNG, "iVBORw0KGg") {
		t.Fatalf("figure: %+v", r)
	}
	if r = run(t, k, code("1")); len(r.results) != 1 {
		t.Fatalf("closed figures came back: %+v", r.results)
	}
}

// TestPythonShowAndShell covers plt.show() emitting figures at once and
// IPython-style !cmd shell escapes.
func TestPythonShowAndShell(t *testing.T) {
	t.Parallel()
	dir := fakePyplot(t, "def show():\n    raise RuntimeError('the driver must replace show')\n")
	k := start(t, "python", map[string]string{"PYTHONPATH": dir})
	// Each show() emits the figures open at that moment.
	r := run(t, k, code("import matplotlib.pyplot as plt\nplt.figure(1); plt.show()\nplt.figure(1); plt.figure(2); plt.show()"))
	if r.err != nil || len(r.results) != 3 {
		t.Fatalf("show: %+v", r)
	}
	r = run(t, k, code("x = 5\n!echo shell $((x))\nif True:\n    !echo in block\nx"))
	if r.err != nil || r.stdout != "shell 0\nin block\n" || main(r) != "5" {
		t.Fatalf("shell escapes: %q %+v", r.stdout, r.err)
	}
	// Not a shell escape: a syntax error stays one.
	if r = run(t, k, code("x = = 1")); r.err == nil || r.err.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v", r.err)
	}
}

// TestPythonInterruptedImport: a timeout that cuts off a package's import
// leaves the package out of sys.modules but the submodules it had finished
// in, holding the cut-off package object; the next import of the package
// must work all the same (it failed: "partially initialized module").
func TestPythonInterruptedImport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := map[string]string{
		// pkg imports a, then slow; a reads pkg.slow through the package
		// object it imported.
		"pkg/__init__.py": "from pkg import a\nfrom pkg import slow\nVALUE = a.get()\n",
		"pkg/a.py":        "import pkg\ndef get():\n    return pkg.slow.X\n",
		// slow waits for the file "go" (until then the import hangs, so the
		// timeout always lands inside it), saying so with "started".
		"pkg/slow.py": "import os, time\nhere = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n" +
			"open(os.path.join(here, 'started'), 'w').close()\n" +
			"while not os.path.exists(os.path.join(here, 'go')):\n    time.sleep(0.01)\nX = 42\n",
	}
	for name, src := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k, err := Start(context.Background(), agentproto.ContextSpec{Language: "python", Cwd: dir},
		Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	run(t, k, code("import sys\nsys.path.insert(0, '.')\ny = 7"))
	// A generous timeout: the import reaches slow long before on any
	// machine, and waits there whatever the timeout.
	r := run(t, k, agentproto.ExecuteSpec{Code: "import pkg", TimeoutMS: 5000})
	if r.done.Status != agentproto.StatusTimeout {
		t.Fatalf("the import was not cut off: %+v %+v", r.done, r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "started")); err != nil {
		t.Fatalf("the timeout did not land inside pkg.slow: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = run(t, k, code("import pkg\npkg.VALUE + y - 7"))
	if r.err != nil || main(r) != "42" {
		t.Fatalf("import after an interrupted import: %+v %+v", r.err, r)
	}
	// What was imported whole before stays as it was (the module object is
	// the same).
	r = run(t, k, code("import json\nj = json\n1/0"))
	if r.err == nil || r.err.Name != "ZeroDivisionError" {
		t.Fatalf("want ZeroDivisionError: %+v", r)
	}
	if r = run(t, k, code("import json\njson is j and 'json.decoder' in sys.modules")); main(r) != "True" {
		t.Fatalf("a module imported whole was dropped: %+v", r)
	}
}

// TestPythonInterruptBetweenExecutions: a SIGINT that arrives while no
// execution runs (a late interrupt, a put-off one retried after its
// execution ended) is ignored: it used to raise KeyboardInterrupt in the
// driver's loop, which ended the interpreter and lost the context's state.
func TestPythonInterruptBetweenExecutions(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	if r := run(t, k, code("y = 5")); r.done.Status != agentproto.StatusOK {
		t.Fatalf("y = 5: %+v", r)
	}
	k.mu.Lock()
	pid := k.p.cmd.Process.Pid
	k.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// Once the signal is no longer pending, the interpreter's main thread
	// (blocked reading its next request) has taken it and runs the Python
	// handler before it reads again.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		if !pendingSIGINT(string(st)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SIGINT still pending:\n%s", st)
		}
	}
	if r := run(t, k, code("y")); main(r) != "5" {
		t.Fatalf("state after a SIGINT between executions: %+v", r)
	}
}

// pendingSIGINT reads SigPnd and ShdPnd of a /proc/PID/status.
func pendingSIGINT(status string) bool {
	for _, line := range strings.Split(status, "\n") {
		name, mask, ok := strings.Cut(line, ":")
		if !ok || (name != "SigPnd" && name != "ShdPnd") {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
		if err == nil && v&(1<<(uint(syscall.SIGINT)-1)) != 0 {
			return true
		}
	}
	return false
}

func TestPythonTimeoutKeepsState(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	run(t, k, code("y = 7"))
	r := run(t, k, agentproto.ExecuteSpec{Code: "while True:\n    pass", TimeoutMS: 300})
	if r.done.Status != agentproto.StatusTimeout || r.err == nil || r.err.Name != "TimeoutError" {
		t.Fatalf("timeout: %+v %+v", r.done, r.err)
	}
	if r = run(t, k, code("y")); main(r) != "7" {
		t.Fatalf("state lost after an interrupt: %+v", r)
	}
	r = run(t, k, agentproto.ExecuteSpec{Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)", TimeoutMS: 300})
	if r.done.Status != agentproto.StatusTimeout || !strings.Contains(r.err.Value, "killed") {
		t.Fatalf("stubborn timeout: %+v %+v", r.done, r.err)
	}
	if r = run(t, k, code("'fresh'")); main(r) != "'fresh'" {
		t.Fatalf("no restart after kill: %+v", r)
	}
}

func TestPythonOutputCapAndDeath(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	r := run(t, k, agentproto.ExecuteSpec{Code: "while True:\n    print('x' * 100)", MaxOutputBytes: 10000, TimeoutMS: 10000, StopAtOutputCap: true})
	if r.done.Status != agentproto.StatusOutputLimit || !r.done.Truncated || len(r.stdout) != 10000 {
		t.Fatalf("output cap: status %s truncated %v len %d", r.done.Status, r.done.Truncated, len(r.stdout))
	}
	// Seed 002's error 2: without StopAtOutputCap the output is cut with a
	// marker and the loop runs on to its timeout.
	r = run(t, k, agentproto.ExecuteSpec{Code: "n = 0\nwhile True:\n    n += 1\n    print('Boucle infinie')", MaxOutputBytes: 10000, TimeoutMS: 700})
	marker := fmt.Sprintf(agentproto.OutputCapMarker, 10000)
	if r.done.Status != agentproto.StatusTimeout || !r.done.Truncated || len(r.stdout) != 10000+len(marker) ||
		!strings.HasSuffix(r.stdout, marker) || r.err == nil || r.err.Name != "TimeoutError" {
		t.Fatalf("output cut, then timeout: status %s truncated %v len %d err %+v", r.done.Status, r.done.Truncated, len(r.stdout), r.err)
	}
	if r = run(t, k, code("n > 10000 // len('Boucle infinie')")); main(r) != "True" {
		t.Fatalf("the loop did not run on past the cap: %+v", r)
	}
	pid := k.p.cmd.Process.Pid
	r = run(t, k, code("import os\nos.kill(os.getpid(), 9)"))
	if r.done.Status != agentproto.StatusKilled || r.err == nil || r.err.Name != "KernelDied" {
		t.Fatalf("death: %+v %+v", r.done, r.err)
	}
	if r = run(t, k, code("2 * 21")); main(r) != "42" {
		t.Fatalf("no restart after death: %+v", r)
	}
	k.Close()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("old interpreter %d still alive", pid)
	}
	newPid := 0
	if k.p == nil {
		newPid = -1
	}
	if newPid == 0 {
		t.Fatal("Close left the interpreter")
	}
}

func TestJavaScript(t *testing.T) {
	t.Parallel()
	k := start(t, "js", nil)
	run(t, k, code("let n = 20; const add = (a) => a + 1; var v = 1"))
	if r := run(t, k, code("console.log('hi'); add(n * 2) + v")); main(r) != "42" || r.stdout != "hi\n" {
		t.Fatalf("state: %+v", r)
	}
	r := run(t, k, code("throw new TypeError('nope')"))
	if r.err == nil || r.err.Name != "TypeError" || r.err.Value != "nope" || r.done.Status != agentproto.StatusError {
		t.Fatalf("error: %+v", r.err)
	}
	if r = run(t, k, code("await Promise.resolve(5); v + 1")); r.done.Status != agentproto.StatusOK || main(r) != "2" {
		t.Fatalf("top-level await: %+v %+v", r.done, r.err)
	}
	// Declarations of an awaiting cell outlive it; its last expression is its value.
	r = run(t, k, code("const w = await Promise.resolve(7)\nfunction twice(x) { return 2 * x }\nclass K {}\ntwice(w);"))
	if main(r) != "14" {
		t.Fatalf("await cell value: %+v %+v", r.results, r.err)
	}
	if r = run(t, k, code("twice(w) + (new K() instanceof K ? 1 : 0)")); main(r) != "15" {
		t.Fatalf("await cell declarations: %+v %+v", r.results, r.err)
	}
	if r = run(t, k, code("for (const i of [1]) {\n  await null\n}")); r.err != nil || len(r.results) != 0 {
		t.Fatalf("await cell ending in a block: %+v %+v", r.results, r.err)
	}
	if r = run(t, k, agentproto.ExecuteSpec{Code: "while (true) {}", TimeoutMS: 300}); r.done.Status != agentproto.StatusTimeout {
		t.Fatalf("timeout: %+v", r.done)
	}
	if r = run(t, k, code("n")); main(r) != "20" {
		t.Fatalf("state lost after interrupt: %+v", r)
	}
}

func TestBash(t *testing.T) {
	t.Parallel()
	k := start(t, "bash", nil)
	run(t, k, code("cd /tmp && G=hello\nf() { echo \"f:$1\"; }"))
	if r := run(t, k, code(`echo "$G $(pwd)"; f x`)); r.stdout != "hello /tmp\nf:x\n" {
		t.Fatalf("state: %q", r.stdout)
	}
	if r := run(t, k, code("false")); r.done.Status != agentproto.StatusError || r.err == nil || r.err.Value != "exit status 1" {
		t.Fatalf("exit status: %+v", r.err)
	}
	if r := run(t, k, agentproto.ExecuteSpec{Code: "echo $ONCE", Env: map[string]string{"ONCE": "it's"}}); r.stdout != "it's\n" {
		t.Fatalf("env: %q", r.stdout)
	}
	if r := run(t, k, code("echo \"[$ONCE]\"")); r.stdout != "[]\n" {
		t.Fatalf("env leaked: %q", r.stdout)
	}
	if r := run(t, k, code("exit 4")); r.done.Status != agentproto.StatusKilled {
		t.Fatalf("exit: %+v", r.done)
	}
	if r := run(t, k, code("echo back")); r.stdout != "back\n" {
		t.Fatalf("after exit: %q", r.stdout)
	}
}

// TestBashCellFDs: a cell may use fds 3 and 4 as its own (exec
// 3<>/dev/tcp/host/port is the common way to talk TCP in Bash) without
// touching the driver's channels: the execution ends as usual and the
// shell's state is kept. The driver's channels were fds 3 and 4: such a
// cell cut them, the interpreter ended and its state was lost.
func TestBashCellFDs(t *testing.T) {
	t.Parallel()
	k := start(t, "bash", nil)
	r := run(t, k, code("x=kept; exec 3<>/dev/null 4>/dev/null; echo three >&3; exec 3<&- 4>&-; echo done"))
	if r.done.Status != agentproto.StatusOK || r.stdout != "done\n" {
		t.Fatalf("a cell using fds 3 and 4: %+v %q", r.done, r.stdout)
	}
	if r := run(t, k, code(`echo "$x"`)); r.done.Status != agentproto.StatusOK || r.stdout != "kept\n" {
		t.Fatalf("state after a cell using fds 3 and 4: %+v %q", r.done, r.stdout)
	}
}

// TestOutputBeforeTheEnd: all the output an execution wrote arrives when
// its interpreter ends just after writing it, with or without the
// driver's end of the execution. The run loop took the control pipe's
// close as the end: the output still in the pipes, unread by the pumps,
// was lost (one run in five on a busy machine: a Bash cell that ran
// exec 3<&- lost the status line it had printed).
func TestOutputBeforeTheEnd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		lang, code, want string
		status           string
	}{
		// The interpreter exits within the cell: no end from the driver.
		{"bash", "echo start; echo a | cat; echo end; exit 3", "start\na\nend\n", agentproto.StatusKilled},
		{"python", "import os, sys\nprint('start'); print('end'); sys.stdout.flush(); os._exit(3)", "start\nend\n", agentproto.StatusKilled},
		// The driver ends the execution and then its loop, whose
		// request channel the cell closed.
		{"bash", `echo start; echo a | cat; echo end; exec {__sf_req}<&-`, "start\na\nend\n", agentproto.StatusOK},
	}
	for _, c := range cases {
		for i := range 30 {
			k := start(t, c.lang, nil)
			r := run(t, k, code(c.code))
			k.Close()
			if r.stdout != c.want || r.done.Status != c.status {
				t.Fatalf("%s %q, run %d: %s %q, want %s %q", c.lang, c.code, i, r.done.Status, r.stdout, c.status, c.want)
			}
		}
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	run(t, k, code("z = 1"))
	if err := k.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := run(t, k, code("z")); r.err == nil || r.err.Name != "NameError" {
		t.Fatalf("state survived a restart: %+v", r)
	}
	if _, err := Start(context.Background(), agentproto.ContextSpec{Language: "cobol"}, Options{}); !errors.Is(err, lang.ErrUnsupported) {
		t.Errorf("a cobol kernel: %v", err)
	}
}

// TestTypeScriptContext checks that a typescript context runs on Node: the
// host sends it transpiled cells (internal/sandbox), so plain JavaScript
// runs and type syntax is Node's syntax error.
func TestTypeScriptContext(t *testing.T) {
	t.Parallel()
	k := start(t, "ts", nil)
	if k.Language() != "typescript" {
		t.Fatalf("language %q", k.Language())
	}
	if r := run(t, k, code("const a = 20; a * 2 + 2")); r.err != nil || main(r) != "42" {
		t.Fatalf("javascript in a typescript context: %q %+v", main(r), r.err)
	}
}

// TestOversizeMessages: results and errors too large for the protocol are
// reported (a dropped event; an error cut to size), in Python and in
// JavaScript, and so is a huge line the code writes straight into the
// control pipe; the interpreter and its state survive all of them.
func TestOversizeMessages(t *testing.T) {
	t.Parallel()
	dropped := func(t *testing.T, k *Kernel, c string) (int, record) {
		t.Helper()
		var n int
		var r record
		r.done = k.Execute(context.Background(), code(c), func(ev agentproto.Event) error {
			switch ev.Type {
			case agentproto.EventDropped:
				if ev.Dropped.Type != agentproto.EventResult || ev.Dropped.Bytes <= agentproto.MaxResult {
					t.Errorf("dropped %+v", ev.Dropped)
				}
				n++
			case agentproto.EventResult:
				r.results = append(r.results, *ev.Result)
			case agentproto.EventError:
				r.err = ev.Error
			case agentproto.EventStdout:
				r.stdout += string(ev.Data)
			}
			return nil
		})
		return n, r
	}
	t.Run("python", func(t *testing.T) {
		t.Parallel()
		k := start(t, "python", nil)
		run(t, k, code("x = 7"))
		big := "class B:\n    def _repr_html_(self): return '<' * 4_000_000\ndisplay(B())\nprint('after')\n1"
		if n, r := dropped(t, k, big); n != 1 || r.stdout != "after\n" || main(r) != "1" || r.done.Status != agentproto.StatusOK {
			t.Fatalf("a large result: %d dropped, %+v", n, r)
		}
		r := run(t, k, code("raise ValueError('v' * 5_000_000)"))
		if r.done.Status != agentproto.StatusError || r.err == nil || r.err.Name != "ValueError" || len(r.err.Value) > 70000 ||
			!strings.Contains(r.err.Value, "characters cut") {
			t.Fatalf("a large error: %+v", r.done)
		}
		// The code itself writes a huge line to the control pipe.
		if n, r := dropped(t, k, "import os\nos.write(4, b'{\"type\": \"result\", \"x\": \"' + b'y' * 6_000_000 + b'\"}\\n')\nprint('after')"); n != 1 || r.stdout != "after\n" {
			t.Fatalf("a huge control line: %d dropped, %+v", n, r)
		}
		if r := run(t, k, code("x")); main(r) != "7" {
			t.Fatalf("the state was lost: %+v", r)
		}
	})
	t.Run("javascript", func(t *testing.T) {
		t.Parallel()
		k := start(t, "javascript", nil)
		if n, r := dropped(t, k, "Object.fromEntries(Array.from({length: 400000}, (_, i) => ['k' + i, i]))"); n != 1 || r.done.Status != agentproto.StatusOK {
			t.Fatalf("a large result: %d dropped, %+v", n, r)
		}
		r := run(t, k, code("throw new Error('v'.repeat(5000000))"))
		if r.done.Status != agentproto.StatusError || r.err == nil || len(r.err.Value) > 70000 || !strings.Contains(r.err.Value, "characters cut") {
			t.Fatalf("a large error: %+v %+v", r.done, r.err != nil)
		}
	})
}

// TestPythonIndentedCell: a cell whose lines share an indentation runs as
// IPython runs it, the first line's indentation removed from every line.
func TestPythonIndentedCell(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	r := run(t, k, code("\n    def f(x):\n        return x * 2\n\n    print('ok')\n    f(21)\n  "))
	if r.err != nil || r.stdout != "ok\n" || main(r) != "42" {
		t.Fatalf("indented cell: %+v (error %+v)", r, r.err)
	}
	// A line indented less than the first is kept as it is: still an error.
	if r := run(t, k, code("    x = 1\n  y = 2")); r.err == nil || r.err.Name != "IndentationError" {
		t.Fatalf("inconsistent indentation: %+v", r)
	}
}

// Options.Wrap starts the interpreter through another command (the
// agent's nproc-exec), also when it restarts.
func TestWrap(t *testing.T) {
	t.Parallel()
	wrap := func(path string, argv []string) (string, []string) {
		return "/usr/bin/env", append([]string{"env", "WRAPPED=yes", path}, argv[1:]...)
	}
	k, err := Start(context.Background(), agentproto.ContextSpec{Language: "bash", Cwd: t.TempDir()},
		Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}, Wrap: wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	if r := run(t, k, code("echo $WRAPPED")); r.stdout != "yes\n" {
		t.Fatalf("stdout %q, stderr %q", r.stdout, r.stderr)
	}
	if err := k.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := run(t, k, code("echo $WRAPPED")); r.stdout != "yes\n" {
		t.Fatalf("after a restart: stdout %q", r.stdout)
	}
}
