package batch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// hostPython skips a test without the host's Python and needs root (the
// check maps the host's nobody into its user namespace).
func hostPython(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat(DefaultCheckPython); err != nil {
		t.Skipf("no %s", DefaultCheckPython)
	}
}

// TestHostCheckVerdicts: the host check's verdicts, each bound of a
// handler and each kind of error with its line; compile's own errors
// too (not only the parser's).
func TestHostCheckVerdicts(t *testing.T) {
	hostPython(t)
	t.Parallel()
	for _, c := range []struct {
		name, code, errName string
		line                int
	}{
		{"def", "import os\ndef handler(x):\n    return 1\n", "", 0},
		{"async def", "async def handler(x):\n    return 1\n", "", 0},
		{"assignment", "handler = len\n", "", 0},
		{"annotated", "handler: object = len\n", "", 0},
		{"import", "from os.path import basename as handler\n", "", 0},
		{"syntax", "x = 1\n\ndef handler(item)\n    return 1\n", "SyntaxError", 3},
		{"indent", "def handler(item):\nreturn 1\n", "IndentationError", 2},
		{"compile's", "def handler(x):\n    pass\nreturn 3\n", "SyntaxError", 3},
		{"missing", "def other(item):\n    return 1\n", "NameError", 0},
		{"nested only", "if True:\n    def handler(x): pass\n", "NameError", 0},
		{"not UTF-8", "def handler(x): return '\xff'\n", "SyntaxError", 0},
		{"NUL", "def handler(x): pass\n\x00\n", "", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res, err := HostCheck{}.Check(context.Background(), c.code)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.line < 0: // Python's own words for it vary by version
				if res.OK {
					t.Fatalf("%+v: a NUL accepted", res)
				}
			case c.errName == "" && !res.OK:
				t.Fatalf("%+v, want ok", res)
			case c.errName != "" && (res.OK || res.Name != c.errName || res.Line != c.line):
				t.Fatalf("%+v, want %s at line %d", res, c.errName, c.line)
			}
		})
	}
}

// TestHostCheckRunsNothing: code whose top level would write a file and
// connect to a listener of the test is checked (and refused: no
// handler), and neither happens. Control: the same code run by the same
// Python does both.
func TestHostCheckRunsNothing(t *testing.T) {
	hostPython(t)
	t.Parallel()
	dir := t.TempDir()
	ln, accepted := testutil.ClosingListener(t, "127.0.0.1:0")
	marker := filepath.Join(dir, "ran")
	code := fmt.Sprintf("import socket\nopen(%q, 'w').write('x')\nsocket.create_connection(('127.0.0.1', %d)).close()\n"+
		"def helper(x=open(%q + '2', 'w')):\n    pass\n@print\ndef other(x): pass\n", marker, ln.Addr().(*net.TCPAddr).Port, marker)
	res, err := HostCheck{}.Check(context.Background(), code)
	if err != nil || res.OK || res.Name != "NameError" {
		t.Fatalf("check: %+v, %v; want NameError (no handler)", res, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the check ran the code: %v", ents)
	}
	select {
	case <-accepted:
		t.Fatal("the check ran the code: the listener was connected to")
	default:
	}
	// Control: run, the code does both.
	if out, err := exec.Command(DefaultCheckPython, "-I", "-S", "-c", code).CombinedOutput(); err != nil {
		t.Fatalf("control: %v\n%s", err, out)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("control: the code wrote no file: %v", err)
	}
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("control: the code connected to nothing")
	}
}

// probe is Python run in the check's confinement as if the parser had
// been made to run the tenant's code: it tries to write a file in dir
// (open to all) and to connect to the test's listener at port, and
// prints what it managed.
func probe(dir string, port int) string {
	return confinePrelude + fmt.Sprintf(`import os
done = []
try:
    with open(os.path.join(%q, "written"), "w") as f:
        f.write("x")
    done.append("wrote")
except OSError:
    pass
try:
    import socket
    socket.create_connection(("127.0.0.1", %d), timeout=2).close()
    done.append("connected")
except OSError:
    pass
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    done.append("forked")
except OSError:
    pass
sys.stdout.write(" ".join(done) + "\n")
`, dir, port)
}

// TestHostCheckConfinement: what each layer of the check's confinement
// stops, should the parser ever run what it is given: a file written
// with content, a connection to a listener on the host's loopback, a
// new process. Control: unconfined, the probe does all three; confined
// by every layer, none; each layer alone stops what it is there for.
func TestHostCheckConfinement(t *testing.T) {
	hostPython(t)
	t.Parallel()
	ln, _ := testutil.ClosingListener(t, "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		name string
		c    confinement
		want string
	}{
		{"control: none", confinement{}, "wrote connected forked"},
		{"all", confined, ""},
		// Its own network namespace: no route to the host's loopback.
		{"namespaces", confinement{namespaces: true}, "wrote forked"},
		// File size 0 (the file is made empty); no new process does
		// not bind root (it does nobody, below).
		{"rlimits", confinement{rlimits: true}, "connected forked"},
		{"namespaces and rlimits", confinement{namespaces: true, rlimits: true}, ""},
		// No open, socket or fork at all.
		{"seccomp", confinement{seccomp: true}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A directory anyone may write, on a path anyone may reach.
			dir, err := os.MkdirTemp("", "sheepfold-probe-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			out, err := HostCheck{}.withDefaults().run(context.Background(), probe(dir, port), nil, c.c)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(out)); got != c.want {
				t.Fatalf("the probe did %q, want %q", got, c.want)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "written")); (err == nil && len(b) > 0) != strings.Contains(c.want, "wrote") {
				t.Fatalf("the file: %q, %v", b, err)
			}
		})
	}
}

// TestHostCheckHostileSource: code made to exhaust the parser ends with a
// clear verdict or failure within the timeout: deep nesting, a deep
// unary chain, a constant-folding bomb (never folded, never run), a
// literal too large for the check's memory (control: without the
// limits it parses), and code that takes longer to parse than the
// timeout (control: given the time, it parses).
func TestHostCheckHostileSource(t *testing.T) {
	hostPython(t)
	t.Parallel()
	ctx := context.Background()
	verdict := func(t *testing.T, h HostCheck, code string) (CheckResult, time.Duration, error) {
		t.Helper()
		start := time.Now()
		res, err := h.Check(ctx, code)
		d := time.Since(start)
		if d > h.withDefaults().Timeout+5*time.Second {
			t.Fatalf("the check took %s, past its timeout", d)
		}
		return res, d, err
	}
	t.Run("nesting", func(t *testing.T) {
		t.Parallel()
		res, _, err := verdict(t, HostCheck{}, "x = "+strings.Repeat("(", 100000)+"\n")
		if err != nil || res.OK || res.Name != "SyntaxError" || res.Line != 1 {
			t.Fatalf("%+v, %v", res, err)
		}
	})
	t.Run("unary chain", func(t *testing.T) {
		t.Parallel()
		res, _, err := verdict(t, HostCheck{}, "x = "+strings.Repeat("-", 200000)+"1\ndef handler(x): pass\n")
		if err != nil || res.OK {
			t.Fatalf("%+v, %v", res, err)
		}
	})
	t.Run("folding bomb", func(t *testing.T) {
		t.Parallel()
		code := "x = 'a' * (1 << 40)\ny = 2 ** (2 ** 40)\nz = (1,) * (1 << 40)\ndef handler(i): pass\n"
		res, _, err := verdict(t, HostCheck{Timeout: 20 * time.Second}, code)
		if err != nil || !res.OK {
			t.Fatalf("%+v, %v", res, err)
		}
		// Control: run (in a shell that bounds its memory to 1 GiB),
		// its first line asks for a terabyte.
		out, err := exec.Command("/bin/sh", "-c", "ulimit -v 1048576 && exec "+DefaultCheckPython+` -I -S -c "x = 'a' * (1 << 40)"`).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "MemoryError") {
			t.Fatalf("control: %v\n%s", err, out)
		}
	})
	t.Run("huge literal", func(t *testing.T) {
		t.Parallel()
		code := "x = '" + strings.Repeat("a", 24<<20) + "'\ndef handler(i): pass\n"
		small := HostCheck{MemoryBytes: 96 << 20, Timeout: 30 * time.Second}
		res, _, err := verdict(t, small, code)
		var failed *CheckFailure
		if !(err == nil && !res.OK && res.Name == "MemoryError") && !errors.As(err, &failed) {
			t.Fatalf("%+v, %v; want MemoryError or a failure", res, err)
		}
		// Control: without the limits the same code parses.
		res, err = small.withDefaults().check(ctx, code, confinement{namespaces: true, seccomp: true})
		if err != nil || !res.OK {
			t.Fatalf("control: %+v, %v", res, err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		code := strings.Repeat("x = [1, 2, 3, {'a': (4, 5)}]\n", 50000) + "def handler(i): pass\n"
		_, d, err := verdict(t, HostCheck{Timeout: 100 * time.Millisecond}, code)
		var failed *CheckFailure
		if !errors.As(err, &failed) || !strings.Contains(err.Error(), "took more than") {
			t.Fatalf("%v after %s; want a failure at the timeout", err, d)
		}
		// Control: given the time, it parses.
		if res, _, err := verdict(t, HostCheck{Timeout: 60 * time.Second, CPUSeconds: 30}, code); err != nil || !res.OK {
			t.Fatalf("control: %+v, %v", res, err)
		}
	})
}

// TestTemplatePython: the version of a root filesystem's Python from
// the name its python3 links to; none when it is not a link of that
// shape.
func TestTemplatePython(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := TemplatePython(root); ok {
		t.Fatal("a version without python3")
	}
	link := filepath.Join(bin, "python3")
	for _, c := range []struct {
		target, want string
		ok           bool
	}{
		{"python3.11", "3.11", true},
		{"/usr/bin/python3.12", "3.12", true},
		{"python3", "", false},
		{"python3.11; rm", "", false},
	} {
		os.Remove(link)
		if err := os.Symlink(c.target, link); err != nil {
			t.Fatal(err)
		}
		if v, ok := TemplatePython(root); v != c.want || ok != c.ok {
			t.Errorf("%s: %q, %v", c.target, v, ok)
		}
	}
}
