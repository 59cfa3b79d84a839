package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
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
	ln, _ := testutil.ClosingListener(t, "127.0.0.1:0")
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
			// The profile lets unshare through with CLONE_FS alone
			// (agent.StartIn); with it, a namespace flag is refused.
			name: "unshare with CLONE_FS",
			code: `
CLONE_FS, CLONE_NEWUSER = 0x00000200, 0x10000000
pid = os.fork()
if pid == 0:
    os._exit(err(libc.unshare(CLONE_FS | CLONE_NEWUSER)))
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
# Init only when confined: on the host (the control run, argv "host") an
# attach would stop the host's own init (PTRACE_ATTACH sends SIGSTOP).
init = None if sys.argv[1:] == ["host"] else err(libc.ptrace(PTRACE_ATTACH, 1, None, None))
print(json.dumps({"ptrace": rc, "init": init}))`,
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
		{
			// The code's parent is the agent (on the host: the test).
			name: "agent memory",
			code: `
def tryopen(p):
    try:
        open(p, "rb").close(); return 0
    except OSError as e:
        return e.errno or -1
ppid = os.getppid()
print(json.dumps({"environ": tryopen("/proc/%d/environ" % ppid), "mem": tryopen("/proc/%d/mem" % ppid)}))`,
			confined: func(r map[string]any) error {
				if err := isErr("environ", eacces, eperm)(r); err != nil {
					return err
				}
				return isErr("mem", eacces, eperm)(r)
			},
			host: func(r map[string]any) error {
				if err := isOK("environ")(r); err != nil {
					return err
				}
				return isOK("mem")(r)
			},
		},
		{
			name:     "chroot",
			code:     `print(json.dumps({"chroot": err(libc.chroot(b"/"))}))`,
			confined: isErr("chroot", eperm),
			host:     isOK("chroot"),
		},
		{
			name: "mknod",
			code: `
p = "/tmp/.sheepfold-mknod-%d" % os.getpid()
try:
    os.mknod(p, 0o600 | 0o020000, os.makedev(1, 3)); os.unlink(p); rc = 0
except OSError as e:
    rc = e.errno
print(json.dumps({"mknod": rc}))`,
			confined: isErr("mknod", eperm),
			host:     isOK("mknod"),
		},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			if a.name == "sysrq" {
				// The Sentry's /proc/sysrq-trigger takes the write and
				// does nothing: no host file is behind it.
				testutil.SkipUnderGVisor(t, "gVisor's sysrq-trigger is its own, without effect")
			}
			code := prelude + a.code
			ex := run(t, s, "python", code)
			got, err := parseAttack(ex.Stdout)
			if err != nil {
				t.Fatalf("confined run: %v\nstdout %q\nerror %+v", err, ex.Stdout, ex.Error)
			}
			if err := a.confined(got); err != nil {
				t.Errorf("confinement failed: %v", err)
			}
			// Root inside the sandbox (a process with User "root") is
			// confined as well.
			res, rootOut, rootErr := runAs(t, s, "root", "/usr/bin/python3", "-c", code)
			gotRoot, err := parseAttack(rootOut)
			if err != nil {
				t.Fatalf("confined run as root: %v (%+v)\nstdout %q\nstderr %q", err, res, rootOut, rootErr)
			}
			if err := a.confined(gotRoot); err != nil {
				t.Errorf("confinement of root failed: %v", err)
			}
			// "host" tells an attack it runs unconfined (see ptrace).
			out, err := exec.Command("/usr/bin/python3", "-c", code, "host").Output()
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
	testutil.SkipUnderGVisor(t, "a fork bomb exhausts the Sentry's memory and ends the sandbox (docs/security.md, gVisor)")
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

// runAs runs a command in s as user and returns its result and output.
func runAs(t *testing.T, s *sandbox.Sandbox, user, cmd string, args ...string) (*sandbox.ProcessResult, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	res, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: cmd, Args: args, User: user, TimeoutMS: 60_000},
		func(ev agentproto.Event) {
			switch ev.Type {
			case agentproto.EventStdout:
				out.Write(ev.Data)
			case agentproto.EventStderr:
				errOut.Write(ev.Data)
			}
		})
	if err != nil {
		t.Fatalf("run %s as %q: %v", cmd, user, err)
	}
	return res, out.String(), errOut.String()
}

// statusFields picks lines of /proc/<pid>/status.
func statusFields(status string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// rootCapMask is oci.RootCapabilities as /proc/<pid>/status shows it.
func rootCapMask(t *testing.T) string {
	bits := map[string]uint{"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}
	var mask uint64
	for _, c := range oci.RootCapabilities {
		b, ok := bits[c]
		if !ok {
			t.Fatalf("capability %s: add its bit here", c)
		}
		mask |= 1 << b
	}
	return fmt.Sprintf("%016x", mask)
}

// TestIdentity checks who code runs as: kernels and default processes as
// "user" with no capabilities, root processes as root with the agent's
// few; and how that looks from the host (unprivileged uids).
func TestIdentity(t *testing.T) {
	testutil.SkipUnderGVisor(t, "the tenant's processes are the Sentry's tasks, not host processes of the sandbox's id range")
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	caps := rootCapMask(t)
	const script = `cat /proc/self/status; echo "env=$HOME $USER $LOGNAME $(pwd)"; kill -0 $PPID && echo "signal agent: ok"; kill -0 1 && echo "signal init: ok"`

	ex := run(t, s, "python", "print(open('/proc/self/status').read())")
	kernel := statusFields(ex.Stdout)
	_, out, _ := runAs(t, s, "", "/bin/bash", "-c", script)
	user := statusFields(out)
	for name, f := range map[string]map[string]string{"kernel": kernel, "process": user} {
		want := map[string]string{"Uid": "1000 1000 1000 1000", "Gid": "1000 1000 1000 1000", "Groups": "1000",
			"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapInh": "0000000000000000",
			"CapAmb": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
		for k, v := range want {
			if f[k] != v {
				t.Errorf("%s as user: %s = %q, want %q", name, k, f[k], v)
			}
		}
	}
	if !strings.Contains(out, "env=/home/user user user /home/user") {
		t.Errorf("user process environment:\n%s", out)
	}
	// The agent is another uid, so user code cannot even signal it;
	// root can (the same command, so it is spelled right).
	if strings.Contains(out, "signal agent: ok") || strings.Contains(out, "signal init: ok") {
		t.Errorf("user code may signal the agent:\n%s", out)
	}

	_, out, errOut := runAs(t, s, "root", "/bin/bash", "-c", script)
	root := statusFields(out)
	for k, v := range map[string]string{"Uid": "0 0 0 0", "Gid": "0 0 0 0", "CapEff": caps, "CapPrm": caps,
		"CapBnd": caps, "CapInh": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
		if root[k] != v {
			t.Errorf("root process: %s = %q, want %q", k, root[k], v)
		}
	}
	if !strings.Contains(out, "env=/root root root /root") || !strings.Contains(out, "signal agent: ok") || !strings.Contains(out, "signal init: ok") {
		t.Errorf("root process:\n%s%s", out, errOut)
	}

	// Unknown users are refused.
	_, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: "true", User: "nosuch"}, nil)
	if apierr.CodeOf(err) != apierr.BadRequest || !strings.Contains(err.Error(), "unknown user") {
		t.Errorf("unknown user: %v", err)
	}
	// A passwd user other than user and root: its own ids.
	if _, out, _ := runAs(t, s, "nobody", "/usr/bin/id", "-u"); strings.TrimSpace(out) != "65534" {
		t.Errorf("id -u as nobody: %q", out)
	}

	// Seen from the host, root inside is an unprivileged uid of the
	// sandbox's own range (after the template's owners) and user is that
	// plus 1000; so is the agent.
	marker := fmt.Sprintf("%d.%d", os.Getpid(), time.Now().UnixNano()%1000)
	for _, u := range []string{"root", "user"} {
		if _, err := s.Start(context.Background(), sandbox.ProcessSpec{Cmd: "/bin/sleep", Args: []string{marker + "0" + map[string]string{"root": "1", "user": "2"}[u]}, User: u}); err != nil {
			t.Fatal(err)
		}
	}
	wantHost := map[string]int{marker + "01": 0, marker + "02": 1000}
	hostUID := map[string]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(hostUID) < len(wantHost) && time.Now().Before(deadline) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, f := range procs {
			cmdline, _ := os.ReadFile(f)
			arg, ok := strings.CutPrefix(string(cmdline), "/bin/sleep\x00")
			arg = strings.TrimSuffix(arg, "\x00")
			if _, mine := wantHost[arg]; !ok || !mine {
				continue
			}
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "status"))
			st := statusFields(string(b))
			uids := strings.Fields(st["Uid"])
			if len(uids) != 4 || uids[0] != uids[1] || uids[0] != uids[2] || uids[0] != uids[3] {
				t.Errorf("host view of %s: Uid %q", arg, st["Uid"])
				continue
			}
			hostUID[arg], _ = strconv.Atoi(uids[0])
			pb, _ := os.ReadFile("/proc/" + st["PPid"] + "/status")
			if pst := statusFields(string(pb)); pst["Uid"] != strings.Repeat(uids[0]+" ", 3)+uids[0] && arg == marker+"01" {
				t.Errorf("host view of the agent (pid %s): Uid %q, want root's %s", st["PPid"], pst["Uid"], uids[0])
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(hostUID) < len(wantHost) {
		t.Fatalf("processes not found from the host: %v of %v", hostUID, wantHost)
	}
	rootUID := hostUID[marker+"01"]
	if rootUID < int(oci.DefaultIDMap.HostID+oci.DefaultIDMap.Size) || hostUID[marker+"02"] != rootUID+1000 {
		t.Errorf("host uids: root %d, user %d; want root after the template's range (%d+) and user = root+1000",
			rootUID, hostUID[marker+"02"], oci.DefaultIDMap.HostID+oci.DefaultIDMap.Size)
	}
}

// TestRootWritesStayInSandbox: root inside writes anywhere in its overlay,
// user only where user may; the template on the host never changes.
func TestRootWritesStayInSandbox(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	passwdBefore, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("sheepfold-root-%d", os.Getpid())

	// Processes.
	if res, _, errOut := runAs(t, s, "", "/bin/sh", "-c", "echo x > /etc/"+name); res.ExitCode == 0 {
		t.Errorf("user wrote /etc/%s", name)
	} else if !strings.Contains(errOut, "Permission denied") {
		t.Errorf("user writing /etc: %q", errOut)
	}
	if res, _, errOut := runAs(t, s, "root", "/bin/sh", "-c",
		"echo x > /etc/"+name+" && mkdir -p /usr/local/lib/"+name+" && echo root >> /etc/passwd"); res.ExitCode != 0 {
		t.Fatalf("root writing /etc and /usr: %+v %s", res, errOut)
	}

	// File calls.
	var buf strings.Builder
	if _, err := s.WriteFile(ctx, "/etc/passwd", strings.NewReader("evil"), 0, 0); apierr.CodeOf(err) != apierr.PathNotAllowed {
		t.Errorf("user writing /etc/passwd by file call: %v", err)
	}
	if _, err := s.ReadFile(ctx, "/etc/passwd", &buf, 0); err != nil || strings.Contains(buf.String(), "evil") || !strings.Contains(buf.String(), "user:x:1000") {
		t.Errorf("/etc/passwd after user's write: %v %q", err, buf.String())
	}
	buf.Reset()
	if err := s.Remove(ctx, "/etc/hostname"); apierr.CodeOf(err) != apierr.PathNotAllowed {
		t.Errorf("user removing /etc/hostname: %v", err)
	}
	if _, err := s.ReadFile(ctx, "/etc/shadow", &buf, 0); apierr.CodeOf(err) != apierr.PathNotAllowed {
		t.Errorf("user reading /etc/shadow: %v", err)
	}
	if _, err := s.ReadFile(ctx, "/etc/shadow", &buf, 0, sandbox.AsUser("root")); err != nil {
		t.Errorf("root reading /etc/shadow: %v", err)
	}
	fi, err := s.WriteFile(ctx, "/etc/"+name+".api", strings.NewReader("x"), 0, 0, sandbox.AsUser("root"))
	if err != nil || fi.Owner != "root" || fi.Mode != 0o644 {
		t.Errorf("root writing /etc by file call: %+v %v", fi, err)
	}
	if fi, err := s.WriteFile(ctx, "rel.txt", strings.NewReader("x"), 0, 0, sandbox.AsUser("root")); err != nil || fi.Path != "/root/rel.txt" {
		t.Errorf("root's relative path: %+v %v", fi, err)
	}
	fi, err = s.WriteFile(ctx, "/home/user/u.txt", strings.NewReader("x"), 0, 0)
	if err != nil || fi.Owner != "user" || fi.Group != "user" || fi.Mode != 0o644 {
		t.Errorf("user's file: %+v %v", fi, err)
	}
	fi, err = s.MakeDir(ctx, "/home/user/d/e")
	if err != nil || fi.Owner != "user" || fi.Mode != 0o755 {
		t.Errorf("user's directory: %+v %v", fi, err)
	}
	if res, out, _ := runAs(t, s, "", "/bin/sh", "-c", "echo more >> /home/user/u.txt && touch /home/user/d/e/f && cat /home/user/u.txt"); res.ExitCode != 0 || out != "xmore\n" {
		t.Errorf("user code using the user's file and directory: %+v %q", res, out)
	}

	// A setuid-root binary made by root does not make user root
	// (no_new_privs). Control: the same on the host gives euid 0.
	const probe = "import os; print(os.geteuid())"
	if res, _, errOut := runAs(t, s, "root", "/bin/sh", "-c", "cp /usr/bin/python3 /tmp/suid && chmod 4755 /tmp/suid"); res.ExitCode != 0 {
		t.Fatalf("root making a setuid binary: %s", errOut)
	}
	if _, out, errOut := runAs(t, s, "", "/tmp/suid", "-c", probe); strings.TrimSpace(out) != "1000" {
		t.Errorf("setuid binary as user: euid %q (%s)", out, errOut)
	}
	hostDir := testutil.ShortTempDir(t)
	os.Chmod(hostDir, 0o755)
	hostBin := filepath.Join(hostDir, "suid")
	if out, err := exec.Command("/bin/sh", "-c", "cp /usr/bin/python3 "+hostBin+" && chmod 4755 "+hostBin).CombinedOutput(); err != nil {
		t.Fatalf("host control: %v %s", err, out)
	}
	cmd := exec.Command(hostBin, "-c", probe)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("host control: the setuid binary gives euid %q (%v), so this case proves nothing", out, err)
	}

	// Root cannot change the agent's binary (a read-only bind mount of a
	// host file, and init is non-dumpable); the same command appends to
	// root's own file in /etc.
	agentBin := testutil.AgentBin(t)
	binBefore, _ := os.ReadFile(agentBin)
	if _, out, errOut := runAs(t, s, "root", "/bin/sh", "-c",
		"for f in /etc/"+name+" /.sheepfold/agent /proc/1/exe; do true >> $f || echo refused $f; done; chmod 777 /.sheepfold/agent || echo refused chmod"); out != "refused /.sheepfold/agent\nrefused /proc/1/exe\nrefused chmod\n" {
		t.Errorf("root writing the agent's binary: %q %q", out, errOut)
	}
	if binAfter, _ := os.ReadFile(agentBin); len(binBefore) == 0 || string(binAfter) != string(binBefore) {
		t.Error("the agent's binary changed on the host")
	}

	// The template is untouched.
	for _, p := range []string{"etc/" + name, "etc/" + name + ".api", "usr/local/lib/" + name, "root/rel.txt", "tmp/suid", "home/user/u.txt"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !os.IsNotExist(err) {
			t.Errorf("template has %s: %v", p, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd")); string(b) != string(passwdBefore) {
		t.Error("the template's /etc/passwd changed")
	}
}

// holdPids forks sleeping children until a fork fails, prints "full" with
// the errno, and from then on forks again at once whenever a pid is freed,
// so that the sandbox's tenant sits at its pids limit until the file
// /home/user/stop appears; then it kills its process group, itself and
// its children.
const holdPids = `
import os, signal, time
full = False
while not os.path.exists("/home/user/stop"):
    try:
        if os.fork() == 0:
            time.sleep(120); os._exit(0)
    except OSError as e:
        if not full:
            full = True
            print("full", e.errno, flush=True)
        time.sleep(0.0005)
os.killpg(0, signal.SIGKILL)
`

// TestForkBombSparesTheAgent holds a sandbox at its pids limit for
// seconds while the agent is asked to work: run code in a kernel that is
// already up, read a file, start processes (each start ends one of the
// agent's OS threads, so the Go runtime must make another). The agent's
// threads must never compete with the tenant's tasks: the tenant's
// processes are charged to a cgroup of their own, below the sandbox's,
// whose limit is the one asked for, and the sandbox's keeps a reserve
// for the agent. Before, the agent shared the limit; the runtime could
// not make a thread ("failed to create new OS thread", EAGAIN) and the
// agent died, stopping the sandbox ("sandbox agent is gone").
//
// after_waited_processes first starts many processes through the agent,
// each of which it waits for: had that cost the agent a thread each (a
// goroutine blocked in waitid), they would have eaten its reserve, and the
// sandbox's own limit, not the tenant's, would have stopped the fork bomb
// with the agent out of threads. The agent waits on pidfds instead
// (internal/pidfd).
func TestForkBombSparesTheAgent(t *testing.T) {
	testutil.SkipUnderGVisor(t, "a fork bomb exhausts the Sentry's memory and ends the sandbox (docs/security.md, gVisor)")
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	t.Run("fork_bomb", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 64}})
		holdAndWork(t, s, 64, log)
	})
	t.Run("after_waited_processes", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 256}})
		for i := range 150 {
			if _, err := s.Start(context.Background(), sandbox.ProcessSpec{Cmd: "/bin/sleep", Args: []string{"600"}}); err != nil {
				t.Fatalf("start sleeper %d: %v", i, err)
			}
		}
		holdAndWork(t, s, 256, log)
	})
}

// holdAndWork holds s at its pids limit (holdPids) while the agent works,
// and checks that the agent stays and the sandbox works afterwards, and
// that a command refused at the limit is reported in log as the pids
// limit reached.
func holdAndWork(t *testing.T, s *sandbox.Sandbox, limit int64, log *policyLog) {
	t.Helper()
	if ex := run(t, s, "python", "open('/home/user/kept', 'w').write('kept')\n1 + 1"); mainText(ex) != "2" {
		t.Fatalf("warm the kernel: %+v", ex)
	}

	full := make(chan string, 1)
	bomb := make(chan error, 1)
	go func() {
		var out strings.Builder // the stream's callback runs on one goroutine
		_, err := s.Run(context.Background(), sandbox.ProcessSpec{
			Cmd: "/usr/bin/python3", Args: []string{"-c", holdPids}, TimeoutMS: 60_000,
		}, func(ev agentproto.Event) {
			if ev.Type != agentproto.EventStdout || out.Len() > 64 {
				return
			}
			out.Write(ev.Data)
			if line, _, ok := strings.Cut(out.String(), "\n"); ok {
				full <- line
				out.WriteString(strings.Repeat(".", 64)) // said once
			}
		})
		bomb <- err
	}()
	select {
	case msg := <-full:
		// The control: the tenant really is at its limit.
		if msg != "full 11" {
			t.Fatalf("the holder says %q, want a fork refused with EAGAIN", msg)
		}
	case err := <-bomb:
		t.Fatalf("the holder ended before the sandbox was full: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the sandbox never filled")
	}

	// Work while full, for seconds: each process start ends one of the
	// agent's threads, so its runtime makes new ones throughout.
	refused, rounds := 0, 0
	for until := time.Now().Add(3 * time.Second); rounds < 20 || time.Now().Before(until); rounds++ {
		i := rounds
		ex, err := s.Execute(context.Background(), sandbox.ExecuteRequest{Language: "python", Code: "2 + 2"}, nil)
		if err != nil {
			t.Fatalf("round %d: execute at the limit: %v", i, err)
		}
		if mainText(ex) != "4" {
			t.Fatalf("round %d: execute at the limit: %+v", i, ex)
		}
		var buf strings.Builder
		if _, err := s.ReadFile(context.Background(), "/home/user/kept", &buf, 1<<20); err != nil || buf.String() != "kept" {
			t.Fatalf("round %d: read a file at the limit: %q %v", i, buf.String(), err)
		}
		res, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: "/bin/true", TimeoutMS: 10_000}, nil)
		switch {
		case err != nil && apierr.CodeOf(err) == apierr.SandboxState:
			t.Fatalf("round %d: start a process at the limit: %v", i, err)
		case err != nil:
			// The tenant's limit refuses the process: a clean error,
			// with a code of its own.
			if apierr.CodeOf(err) != apierr.ProcessLimit {
				t.Fatalf("round %d: a process start refused at the limit: %v, want ERR_PROCESS_LIMIT", i, err)
			}
			if refused++; refused == 1 {
				t.Logf("a process start at the limit: %v", err)
			}
		case res.ExitCode != 0:
			t.Fatalf("round %d: /bin/true at the limit: %+v", i, res)
		}
	}
	if refused == 0 {
		t.Error("no process start was refused at the limit: the holder did not hold it")
	}
	// While the holder still runs (its own end would be reported too).
	reported := false
	for _, ev := range log.of(events.ResourceExceeded, s.ID, "") {
		reported = reported || ev.Details["resource"] == events.ResourcePids && ev.Details["limit"] == limit
	}
	if !reported {
		t.Errorf("no resource_exceeded pids event for the commands refused at the limit: %+v", log.of(events.ResourceExceeded, s.ID, ""))
	}
	// The tenant's tasks are counted against the limit it asked for.
	if u, err := s.Usage(context.Background()); err != nil || u.Pids < limit-4 || u.Pids > limit+1 || u.PidsDenied == 0 {
		t.Errorf("usage at the limit: %+v %v", u, err)
	}
	t.Logf("%d rounds of work at the limit, %d process starts refused", rounds, refused)
	if _, err := s.WriteFile(context.Background(), "/home/user/stop", strings.NewReader(""), 0o644, 1); err != nil {
		t.Fatalf("stop the holder: %v", err)
	}
	if err := <-bomb; err != nil {
		t.Fatalf("the holder's stream: %v", err)
	}
	if ex := run(t, s, "python", "3 + 3"); mainText(ex) != "6" {
		t.Fatalf("after the holder: %+v", ex)
	}
	if res, out, _ := runAs(t, s, "user", "/bin/echo", "ok"); res.ExitCode != 0 || out != "ok\n" {
		t.Fatalf("a process after the holder: %+v %q", res, out)
	}
}

// findCgroupFDs looks through every process's descriptors, as the
// sandbox's root, for one that opens a cgroup's directory, and reports what it found, the processes
// whose descriptors it could not reach, and whether it saw the one it
// planted itself (the control: the search works).
const findCgroupFDs = `
import json, os
planted = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
found, shut, saw_planted = [], [], False
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        fds = os.listdir("/proc/%s/fd" % pid)
    except OSError:
        shut.append(int(pid))
        continue
    reached = False
    for fd in fds:
        p = "/proc/%s/fd/%s" % (pid, fd)
        try:
            opened = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        reached = True
        if int(pid) == os.getpid() and int(fd) == planted:
            saw_planted = os.path.samestat(os.fstat(opened), os.stat("/tmp"))
        try:
            entries = os.listdir(opened)
        except OSError:
            entries = []
        os.close(opened)
        if "pids.max" in entries or "cgroup.procs" in entries or "tasks" in entries:
            found.append("%s/%s: %s" % (pid, fd, sorted(entries)[:4]))
    if not reached and fds:
        shut.append(int(pid))
print(json.dumps({"found": found, "shut": shut, "planted": saw_planted}))
`

// TestTenantCannotReachTheCgroup: the sandbox's root (sudo, or a process
// started as root) finds no descriptor of the sandbox's pids cgroup, which
// the agent holds to start processes in the tenant's cgroup: it is
// close-on-exec in the agent, and the agent, non-dumpable, keeps its
// /proc/PID/fd from every process of the sandbox.
func TestTenantCannotReachTheCgroup(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{Pids: 64}})
	res, out, errOut := runAs(t, s, "root", "/usr/bin/python3", "-c", findCgroupFDs)
	if res.ExitCode != 0 {
		t.Fatalf("the search failed: %+v %s", res, errOut)
	}
	var r struct {
		Found   []string
		Shut    []int
		Planted bool
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if !r.Planted {
		t.Fatalf("the search did not see its own descriptor: %+v", r)
	}
	if len(r.Found) > 0 {
		t.Errorf("root in the sandbox holds or reaches cgroup descriptors: %v", r.Found)
	}
	// The agent's init is pid 1; serve is its child.
	if !slices.Contains(r.Shut, 1) || len(r.Shut) < 2 {
		t.Errorf("root reached the descriptors of the agent's processes: only %v were shut", r.Shut)
	}
}
