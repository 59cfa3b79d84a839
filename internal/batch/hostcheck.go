package batch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// A batch's code is checked before any sandbox is used (HostCheck): the
// host's own Python parses and compiles it, in a short-lived child
// process confined by every layer the host can apply without a sandbox,
// and looks for a top-level handler. Parsing and compiling execute
// nothing of the code (no statement, no import, no default value, no
// decorator runs: ast.parse and compile only build trees and bytecode);
// the confinement is for the parser itself, should some input make it
// misbehave:
//
//   - a user namespace of its own in which it runs as an unprivileged id
//     (the host's nobody, 65534), no capability anywhere, no_new_privs;
//   - network, PID, IPC, UTS and mount namespaces of its own: no
//     interface but a loopback that is down, no other process to see;
//   - a seccomp filter that lets through only what reading a pipe,
//     parsing, writing a pipe and exiting need (no open, socket, exec,
//     fork, kill or ptrace), installed by the check before it reads the
//     code;
//   - resource limits set on it before it is given the code: its
//     address space, CPU seconds, file size 0, few descriptors, no new
//     processes, no core file;
//   - a wall-clock timeout, after which it is killed, and Pdeathsig, so
//     that it dies with the server;
//   - an empty environment, an empty working directory, Python's
//     isolated mode without site (-I -S).
//
// It is used only where the host's Python is of the template's major and
// minor version (the template's Python is what will run the code: the
// grammar must be the same); elsewhere the check runs in a sandbox as
// before (CheckScript).

// HostCheck checks batches' code with the host's Python.
type HostCheck struct {
	Python      string        // the interpreter [/usr/bin/python3]
	Timeout     time.Duration // wall clock [10s]
	MemoryBytes uint64        // its address space [1 GiB]
	CPUSeconds  uint64        // [5]
}

// Defaults of HostCheck.
const (
	DefaultCheckPython  = "/usr/bin/python3"
	defaultCheckTimeout = 10 * time.Second
	defaultCheckMemory  = 1 << 30
	defaultCheckCPU     = 5
	// checkOutputBytes bounds what the check may print.
	checkOutputBytes = 64 << 10
)

func (h HostCheck) withDefaults() HostCheck {
	if h.Python == "" {
		h.Python = DefaultCheckPython
	}
	if h.Timeout <= 0 {
		h.Timeout = defaultCheckTimeout
	}
	if h.MemoryBytes == 0 {
		h.MemoryBytes = defaultCheckMemory
	}
	if h.CPUSeconds == 0 {
		h.CPUSeconds = defaultCheckCPU
	}
	return h
}

// ErrCheckUnavailable is the cause of a host check that could not be
// made at all (no interpreter, no namespaces for it): the caller checks
// in a sandbox instead. It says nothing of the code.
var ErrCheckUnavailable = errors.New("batch: the host check is unavailable")

// CheckFailure is a host check that the code made fail without a
// verdict: it was killed at a limit (time, CPU, memory) or ended without
// one. The code is not accepted.
type CheckFailure struct {
	Reason string
}

func (e *CheckFailure) Error() string {
	return fmt.Sprintf("the code could not be checked: %s", e.Reason)
}

// confinePrelude is how the check's Python confines itself: no_new_privs
// and the seccomp filter given in hex as argv[1] (the seccomp system
// call's number as argv[2]; "-" for none), before anything else runs.
const confinePrelude = `import sys, ast, json, ctypes
def _confine(prog, nr):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(prog, len(prog))
    class F(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    f = F(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(nr, 1, 0, ctypes.byref(f)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
if sys.argv[1:] and sys.argv[1] != "-":
    _confine(bytes.fromhex(sys.argv[1]), int(sys.argv[2]))
`

// hostCheckScript is what the host's Python runs (-c): confined, it reads
// the code from stdin, parses and compiles it, and prints its verdict as
// one JSON line.
const hostCheckScript = confinePrelude + `def _check(src):
    try:
        tree = ast.parse(src, "<batch>", "exec")
        compile(tree, "<batch>", "exec")
    except SyntaxError as e:
        return {"ok": False, "name": type(e).__name__, "value": str(e.msg), "line": e.lineno or 0}
    except MemoryError as e:
        return {"ok": False, "name": "MemoryError", "value": str(e)[:500] or "the code is too large to parse", "line": 0}
    except (RecursionError, ValueError, OverflowError) as e:
        return {"ok": False, "name": type(e).__name__, "value": str(e)[:500], "line": 0}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == "handler":
            return {"ok": True}
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == "handler" for t in targets):
                return {"ok": True}
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == "handler" for a in n.names):
                return {"ok": True}
    return {"ok": False, "name": "NameError", "value": "the code defines no handler(item) at its top level", "line": 0}
src = sys.stdin.buffer.read()
try:
    src = src.decode("utf-8")
except UnicodeDecodeError:
    out = {"ok": False, "name": "SyntaxError", "value": "the code is not UTF-8", "line": 0}
else:
    out = _check(src)
sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
`

// versionScript prints the interpreter's major.minor.
const versionScript = confinePrelude + `sys.stdout.write("%d.%d\n" % sys.version_info[:2])`

// pythonVersion is a major.minor of Python 3.
var pythonVersion = regexp.MustCompile(`^3\.[0-9]{1,3}$`)

// TemplatePython returns the major.minor of the Python of the root
// filesystem rootfs, from the name its /usr/bin/python3 links to
// ("python3.11", as Debian installs it); false when it does not tell.
// The link is read, never followed.
func TemplatePython(rootfs string) (string, bool) {
	target, err := os.Readlink(filepath.Join(rootfs, "usr", "bin", "python3"))
	if err != nil {
		return "", false
	}
	v, ok := strings.CutPrefix(filepath.Base(target), "python")
	if !ok || !pythonVersion.MatchString(v) {
		return "", false
	}
	return v, true
}
