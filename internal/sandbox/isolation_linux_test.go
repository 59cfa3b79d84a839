package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// attack is hostile Python that prints one JSON object saying what it
// achieved. Each runs twice: confined in a sandbox, where it must fail,
// and unconfined on the host (as root), where it must succeed, so that a
// passing case proves the confinement and not a broken attack.
type attack struct {
	name string
	code string
	// confined and host check the JSON the code printed.
	confined func(map[string]any) error
	host     func(map[string]any) error
	// absentOnHost names a result that is ENOENT on a host kernel built
	// without the feature: then the attack cannot be run at all here.
	absentOnHost string
}

const prelude = `
import ctypes, ctypes.util, errno, json, os, socket, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
def err(rc):
    return 0 if rc == 0 else ctypes.get_errno()
`

func isErr(key string, ok ...int) func(map[string]any) error {
	return func(r map[string]any) error {
		v, _ := r[key].(float64)
		if v == 0 {
			return fmt.Errorf("%s succeeded (errno 0)", key)
		}
		if len(ok) > 0 {
			for _, e := range ok {
				if int(v) == e {
					return nil
				}
			}
			return fmt.Errorf("%s failed with errno %v, want one of %v", key, v, ok)
		}
		return nil
	}
}

func isOK(key string) func(map[string]any) error {
	return func(r map[string]any) error {
		if v, _ := r[key].(float64); v != 0 {
			return fmt.Errorf("%s failed with errno %v on the host", key, v)
		}
		return nil
	}
}

func equals(key string, want any) func(map[string]any) error {
	return func(r map[string]any) error {
		if r[key] != want {
			return fmt.Errorf("%s = %v, want %v", key, r[key], want)
		}
		return nil
	}
}

const (
	eperm  = 1
	enoent = 2
	eacces = 13
	erofs  = 30
	enosys = 38
)

func TestIsolation(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})

	hostHostname, _ := os.ReadFile("/etc/hostname")
	marker := filepath.Join("/root", fmt.Sprintf(".sheepfold-marker-%d", os.Getpid()))
	if err := os.WriteFile(marker, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(marker)
	dataDir := testutil.DataDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	mnt := t.TempDir()

	attacks := []attack{
		{
			name: "host files",
			code: fmt.Sprintf(`
r = {"hostname": open("/etc/hostname").read().strip(),
     "marker": os.path.exists(%q), "datadir": os.path.exists(%q)}
print(json.dumps(r))`, marker, filepath.Join(dataDir, "templates")),
			confined: func(r map[string]any) error {
				if r["hostname"] == strings.TrimSpace(string(hostHostname)) {
					return fmt.Errorf("sees the host's hostname %v", r["hostname"])
				}
				if r["marker"] != false || r["datadir"] != false {
					return fmt.Errorf("sees host files: %v", r)
				}
				return nil
			},
			host: func(r map[string]any) error {
				if r["marker"] != true || r["datadir"] != true {
					return fmt.Errorf("control cannot see the host files: %v", r)
				}
				return nil
			},
		},
		{
			name: "network",
			code: fmt.Sprintf(`
def conn(addr):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(addr); return 0
    except OSError as e:
        return e.errno or -1
    finally:
        s.close()
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
print(json.dumps({"host_loopback": conn(("127.0.0.1", %d)), "outside": conn(("8.8.8.8", 53)), "ifaces": ",".join(ifaces)}))`, port),
			confined: func(r map[string]any) error {
				if err := isErr("host_loopback")(r); err != nil {
					return err
				}
				if err := isErr("outside")(r); err != nil {
					return err
				}
				return equals("ifaces", "lo")(r)
			},
			host: isOK("host_loopback"),
		},
		{
			name: "mount",
			code: fmt.Sprintf(`
target = %q if os.path.isdir(%q) else "/tmp"
rc = err(libc.mount(b"none", target.encode(), b"tmpfs", 0, None))
if rc == 0: libc.umount2(target.encode(), 0)
print(json.dumps({"mount": rc}))`, mnt, mnt),
			confined: isErr("mount", eperm),
			host:     isOK("mount"),
		},
		{
			name: "unshare",
			code: `
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
pid = os.fork()
if pid == 0:
    os._exit(err(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)))
_, status = os.waitpid(pid, 0)
print(json.dumps({"unshare": os.waitstatus_to_exitcode(status)}))`,
			confined: isErr("unshare", eperm),
			host:     isOK("unshare"),
		},
		{
			name: "ptrace",
			code: `
import signal, time
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
child = os.fork()
if child == 0:
    time.sleep(30); os._exit(0)
rc = err(libc.ptrace(PTRACE_ATTACH, child, None, None))
if rc == 0:
    os.waitpid(child, 0); libc.ptrace(PTRACE_DETACH, child, None, None)
os.kill(child, signal.SIGKILL); os.waitpid(child, 0)
print(json.dumps({"ptrace": rc, "init": err(libc.ptrace(PTRACE_ATTACH, 1, None, None))}))`,
			confined: func(r map[string]any) error {
				if err := isErr("ptrace", eperm)(r); err != nil {
					return err
				}
				return isErr("init", eperm)(r)
			},
			host: isOK("ptrace"),
		},
		{
			name: "sysrq",
			code: `
try:
    f = open("/proc/sysrq-trigger", "w"); f.close(); rc = 0
except OSError as e:
    rc = e.errno
print(json.dumps({"sysrq": rc}))`,
			confined:     isErr("sysrq", eacces, erofs, eperm, enoent),
			host:         isOK("sysrq"),
			absentOnHost: "sysrq",
		},
		{
			name: "kernel modules",
			code: `
SYS_init_module, SYS_finit_module = 175, 313
libc.syscall.restype = ctypes.c_long
rc1 = err(libc.syscall(SYS_finit_module, -1, b"", 0))
rc2 = err(libc.syscall(SYS_init_module, None, 0, b""))
print(json.dumps({"finit_module": rc1, "init_module": rc2}))`,
			// This kernel has no module support, so the host gets ENOSYS
			// (or EBADF for the bad fd); the sandbox must be stopped before
			// the kernel looks: EPERM from seccomp.
			confined: func(r map[string]any) error {
				if err := isErr("finit_module", eperm)(r); err != nil {
					return err
				}
				return isErr("init_module", eperm)(r)
			},
			host: func(r map[string]any) error {
				if v, _ := r["init_module"].(float64); int(v) == eperm {
					return fmt.Errorf("the host control was refused too: %v", r)
				}
				return nil
			},
		},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			code := prelude + a.code
			ex := run(t, s, "python", code)
			got, err := parseAttack(ex.Stdout)
			if err != nil {
				t.Fatalf("confined run: %v\nstdout %q\nerror %+v", err, ex.Stdout, ex.Error)
			}
			if err := a.confined(got); err != nil {
				t.Errorf("confinement failed: %v", err)
			}
			out, err := exec.Command("/usr/bin/python3", "-c", code).Output()
			if err != nil {
				t.Fatalf("host control run: %v", err)
			}
			hostGot, err := parseAttack(string(out))
			if err != nil {
				t.Fatalf("host control: %v (%q)", err, out)
			}
			if v, _ := hostGot[a.absentOnHost].(float64); a.absentOnHost != "" && int(v) == enoent {
				t.Skipf("this kernel has no %s; the sandbox got %v", a.absentOnHost, got)
			}
			if err := a.host(hostGot); err != nil {
				t.Errorf("the attack does not work unconfined either, so this case proves nothing: %v", err)
			}
		})
	}
}

func parseAttack(out string) (map[string]any, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return nil, err
	}
	return r, nil
}

// countForks forks sleeping children until fork fails and prints how many
// it got.
const countForks = `
import os, time
n = 0
pids = []
try:
    while n < 2000:
        pid = os.fork()
        if pid == 0:
            time.sleep(20); os._exit(0)
        pids.append(pid); n += 1
except OSError as e:
    print("fork failed:", e.errno)
for p in pids:
    os.kill(p, 9); os.waitpid(p, 0)
print(n)
`

func TestForkBombContained(t *testing.T) {
	m := runcEngine(t)
	small := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 64}})
	large := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 512}})
	forks := func(s *sandbox.Sandbox) int {
		ex := runReq(t, s, sandbox.ExecuteRequest{Code: countForks, Timeout: 60 * time.Second})
		var n int
		lines := strings.Split(strings.TrimSpace(ex.Stdout), "\n")
		if _, err := fmt.Sscan(lines[len(lines)-1], &n); err != nil || !strings.Contains(ex.Stdout, "fork failed: 11") {
			t.Fatalf("fork counter: %q %+v", ex.Stdout, ex.Error)
		}
		return n
	}
	nSmall, nLarge := forks(small), forks(large)
	if nSmall >= 64 || nSmall < 20 {
		t.Errorf("pids 64: %d forks succeeded", nSmall)
	}
	if nLarge <= nSmall+300 {
		t.Errorf("pids 512 allowed %d forks, pids 64 allowed %d: the limit is not what stops them", nLarge, nSmall)
	}
	// A real fork bomb ends at the timeout, contained; the sandbox and the
	// engine keep working.
	res, err := small.Run(context.Background(), sandbox.ProcessSpec{
		Cmd: "/bin/bash", Args: []string{"-c", ":(){ :|:& };:"}, TimeoutMS: 3000,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork bomb ended: %+v", res)
	if ex := run(t, large, "python", "2 + 2"); mainText(ex) != "4" {
		t.Fatalf("neighbour broken after fork bomb: %+v", ex)
	}
}

func TestDiskLimit(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{DiskBytes: 64 << 20, MemoryBytes: 512 << 20}})
	ex := run(t, s, "python", `
import errno
n = 0
try:
    with open("/home/user/fill", "wb") as f:
        while n < (512 << 20):
            f.write(b"x" * (1 << 20)); f.flush(); n += 1 << 20
except OSError as e:
    print("error", e.errno)
print(n)`)
	if !strings.Contains(ex.Stdout, "error 28") { // ENOSPC
		t.Fatalf("want ENOSPC, got %q %+v", ex.Stdout, ex.Error)
	}
	var n int64
	lines := strings.Split(strings.TrimSpace(ex.Stdout), "\n")
	fmt.Sscan(lines[len(lines)-1], &n)
	if n > 64<<20 || n < 48<<20 {
		t.Fatalf("wrote %d MiB into a 64 MiB disk", n>>20)
	}
	// Writes also land anywhere else (the overlay takes them), under the
	// same limit, and removing frees the space.
	ex = run(t, s, "python", "import os\nos.remove('/home/user/fill')\nopen('/tmp/new', 'w').write('ok')\nopen('/tmp/new').read()")
	if mainText(ex) != "'ok'" {
		t.Fatalf("write outside home: %+v", ex)
	}
}
