package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// takeCounters is Python that takes inotify watches, inotify instances
// and POSIX message queues until the kernel refuses each (or cap is
// reached), keeps them, and prints what it got and the errno that
// stopped it.
const takeCounters = `
import ctypes, ctypes.util, json, os
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
held = globals().setdefault("held", [])
def until_refused(make, cap):
    for n in range(cap):
        fd = make()
        if fd < 0:
            return [n, ctypes.get_errno()]
        held.append(fd)
    return [cap, 0]
def watches(cap):
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return [0, ctypes.get_errno()]
    held.append(fd)
    wds = set()  # hard links share an inode, and so a watch
    for root, dirs, files in os.walk("/usr"):
        for name in dirs + files:
            if len(wds) == cap:
                return [cap, 0]
            wd = libc.inotify_add_watch(fd, os.path.join(root, name).encode(), 0x4)
            if wd >= 0:
                wds.add(wd)
            elif ctypes.get_errno() == 28:
                return [len(wds), 28]
    return [len(wds), 0]
tag = "%d-%d" % (os.getpid(), len(held))
r = {"watches": watches(WATCH_CAP)}
r["instances"] = until_refused(lambda: libc.inotify_init1(os.O_CLOEXEC), 100000)
r["mqueues"] = until_refused(lambda: libc.mq_open(("/sf-%s-%d" % (tag, len(held))).encode(), os.O_CREAT | os.O_RDWR, 0o600, None), 100000)
print(json.dumps(r), flush=True)
`

// probeCounters takes one of each and says which failed (errno 0: ok).
const probeCounters = `
import ctypes, ctypes.util, json, os
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
r = {}
fd = libc.inotify_init1(os.O_CLOEXEC)
r["instance"] = 0 if fd >= 0 else ctypes.get_errno()
r["watch"] = (0 if libc.inotify_add_watch(fd, b"/tmp", 0x4) >= 0 else ctypes.get_errno()) if fd >= 0 else -1
name = ("/sf-probe-%d" % os.getpid()).encode()
q = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
r["mqueue"] = 0 if q >= 0 else ctypes.get_errno()
if q >= 0:
    libc.mq_unlink(name)
print(json.dumps(r), flush=True)
`

const (
	emfile = 24
	enospc = 28
)

// TestKernelCountersNotShared: code in one sandbox takes every inotify
// instance and watch and every message queue it can; another sandbox and
// the host can still take theirs. The control runs the same code on the
// host in a user namespace owned by a spare uid, as runc made every
// sandbox's (owned by root): that owner's own processes are then refused.
func TestKernelCountersNotShared(t *testing.T) {
	testutil.SkipUnderGVisor(t, "the per-user counters are the Sentry's, not the host kernel's")
	m := runcEngine(t)
	attacker := newSandbox(t, m, sandbox.CreateOptions{})
	neighbour := newSandbox(t, m, sandbox.CreateOptions{})

	watchLimit, _ := strconv.Atoi(oci.NamespaceLimits["user.max_inotify_watches"])
	instLimit, _ := strconv.Atoi(oci.NamespaceLimits["user.max_inotify_instances"])
	ex := run(t, attacker, "python", fmt.Sprintf("WATCH_CAP = %d\n", watchLimit+1000)+takeCounters)
	var took map[string][2]int
	if err := json.Unmarshal([]byte(ex.Stdout), &took); err != nil {
		t.Fatalf("attack: %v: %q %q %+v", err, ex.Stdout, ex.Stderr, ex.Error)
	}
	// Refused at the sandbox's own limits (one instance went to the watches).
	if w := took["watches"]; w != [2]int{watchLimit, enospc} {
		t.Errorf("watches taken %v, want %d then ENOSPC", w, watchLimit)
	}
	if n := took["instances"]; n != [2]int{instLimit - 1, emfile} {
		t.Errorf("instances taken %v, want %d then EMFILE", n, instLimit-1)
	}
	if q := took["mqueues"]; q[0] == 0 || q[1] != emfile {
		t.Errorf("message queues taken %v, want some then EMFILE", q)
	}

	// While the attacker holds everything: the neighbour and host root.
	if ex := run(t, neighbour, "python", probeCounters); ex.Stdout != `{"instance": 0, "watch": 0, "mqueue": 0}`+"\n" {
		t.Errorf("neighbour sandbox: %q %q", ex.Stdout, ex.Stderr)
	}
	if out := hostPython(t, probeCounters, nil, nil); out != `{"instance": 0, "watch": 0, "mqueue": 0}` {
		t.Errorf("host root: %s", out)
	}

	// Control: the same attack in a user namespace owned by a spare host
	// uid starves that uid's own processes.
	owner := &syscall.Credential{Uid: 990_000 + uint32(os.Getpid()%1000), Gid: 990_000 + uint32(os.Getpid()%1000)}
	stdin, release := io.Pipe()
	defer release.Close()
	code := "WATCH_CAP = 10\n" + takeCounters + "import sys\nsys.stdin.read()\n"
	out := hostPython(t, code, &syscall.SysProcAttr{Credential: owner}, stdin, "unshare", "--user", "--ipc", "--map-root-user")
	if err := json.Unmarshal([]byte(out), &took); err != nil || took["instances"][1] != emfile || took["mqueues"][1] != emfile {
		t.Fatalf("unconfined attack did not run out: %v %s", err, out)
	}
	if out := hostPython(t, probeCounters, &syscall.SysProcAttr{Credential: owner}, nil); out != `{"instance": 24, "watch": -1, "mqueue": 24}` {
		t.Errorf("the namespace owner's own process while the attack holds its counters: %s", out)
	}
}

// hostPython runs code with the host's python3 (through wrap, when given)
// and returns its first line of output. With stdin, the process is left
// running until stdin is closed (and waited for at the end of the test).
func hostPython(t *testing.T, code string, attr *syscall.SysProcAttr, stdin io.Reader, wrap ...string) string {
	t.Helper()
	args := append(wrap, "/usr/bin/python3", "-c", code)
	cmd := exec.CommandContext(context.Background(), args[0], args[1:]...)
	cmd.SysProcAttr = attr
	cmd.Stdin = stdin
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if stdin == nil {
		if err := cmd.Wait(); err != nil {
			t.Errorf("%v: %v", args[:len(wrap)+1], err)
		}
	} else {
		t.Cleanup(func() { cmd.Wait() })
	}
	return strings.TrimSpace(line)
}
