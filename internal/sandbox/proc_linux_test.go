package sandbox_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// sudoCell speaks the agent's sudo protocol from Python, without the sudo
// binary (which code under the filter could not exec): it asks root to
// write its uid to /tmp/sudo-ran, and gives the agent's answer.
const sudoCell = `import socket, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect('\0sheepfold-sudo')
req = json.dumps({"argv": ["/bin/sh", "-c", "id -u > /tmp/sudo-ran"], "cwd": "/", "env": {}}).encode() + b"\n"
socket.send_fds(s, [req], [0, 1, 2])
s.makefile().readline().strip()`

// memCell finds the idle Bash context's interpreter (outside the filter:
// a shell refuses to run code under it) and writes into its memory
// through /proc, as another process of the same user may: a byte of its
// stack, rewritten with its own value. (Code written there, as over the
// instruction its blocked read() resumes at, runs as that process, which
// may start processes. Its control pipes are the agent's, not the
// user's: those the user cannot open.)
const memCell = `import os
pid = next(p for p in os.listdir('/proc') if p.isdigit() and b'--noprofile' in open('/proc/%s/cmdline' % p, 'rb').read())
lo, hi = next(l.split()[0] for l in open('/proc/%s/maps' % pid) if l.rstrip().endswith('[stack]')).split('-')
at = int(hi, 16) - 64
fd = os.open('/proc/%s/mem' % pid, os.O_RDWR)
b = os.pread(fd, 1, at)
os.pwrite(fd, b, at)
os.close(fd)
'written'`

// plantCell writes a .pth file into the user's site directory, which a
// fresh interpreter runs at its start, and ends the interpreter, which
// the next execution restarts.
const plantCell = `import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
open(os.path.join(d, 'plant.pth'), 'w').write('import os; os.system("touch /tmp/planted")\n')
os._exit(0)`

// uringCell sets up an io_uring, whose operations the kernel runs without
// passing them through seccomp; it prints io_uring_setup's result and
// errno.
const uringCell = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 1, params)  # io_uring_setup, the same number everywhere
print(r, ctypes.get_errno())`

// forkExecCell starts a program with _posixsubprocess.fork_exec, which
// subprocess uses under its audit event: called directly, no audit hook
// sees it, and only the seccomp filter stands in its way.
const forkExecCell = `import _posixsubprocess, os
r, w = os.pipe()
pid = _posixsubprocess.fork_exec([b'/bin/true'], [b'/bin/true'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w,
                                 True, False, -1, None, None, None, -1, None, True)
os.waitpid(pid, 0)[1]`

// TestPolicyNoProcessByAnyRoute: under allow_subprocess: false no route
// gives the code a new process: not the agent's sudo socket, not the
// memory of another interpreter outside the filter (an idle Bash
// context's), not a file a fresh interpreter runs before it is filtered. Each works in a sandbox without the rule.
func TestPolicyNoProcessByAnyRoute(t *testing.T) {
	testutil.SkipUnderGVisor(t, "allow_subprocess: false is refused under gVisor (TestGVisorSandbox)")
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	boxes := map[string]*sandbox.Sandbox{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, p := range map[string]*policy.Policy{"free": nil, "nosub": {AccessControl: &policy.AccessControl{AllowSubprocess: pb(false)}}} {
		wg.Go(func() {
			s := newSandbox(t, m, sandbox.CreateOptions{Policy: p})
			mu.Lock()
			boxes[name] = s
			mu.Unlock()
		})
	}
	wg.Wait()
	exists := func(s *sandbox.Sandbox, path string) bool {
		res, _, _ := runAs(t, s, "", "test", "-e", path)
		return res.ExitCode == 0
	}

	t.Run("fork_exec under no audit hook", func(t *testing.T) {
		if ex := run(t, boxes["free"], "python", forkExecCell); mainText(ex) != "0" {
			t.Fatalf("unconfined, the program runs: %+v %+v", ex, ex.Error)
		}
		ex, id := inContext(t, boxes["nosub"], "python", forkExecCell)
		if ex.Error == nil || ex.Error.Name != "PermissionError" {
			t.Fatalf("confined, the kernel must refuse it: %+v %+v", ex, ex.Error)
		}
		vs := log.of(events.SecurityViolation, boxes["nosub"].ID, id)
		if len(vs) == 0 || vs[0].Details["kind"] != events.KindSubprocessDenied ||
			!strings.Contains(" vfork clone fork ", " "+fmt.Sprint(vs[0].Details["target"])+" ") {
			t.Fatalf("the agent reports the system call: %+v", vs)
		}
	})

	t.Run("sudo socket", func(t *testing.T) {
		if ex := run(t, boxes["free"], "python", sudoCell); mainText(ex) != "'exit 0'" {
			t.Fatalf("unconfined, the agent runs the command as root: %+v %+v", ex, ex.Error)
		}
		if _, out, _ := runAs(t, boxes["free"], "", "cat", "/tmp/sudo-ran"); out != "0\n" {
			t.Fatalf("root ran it: %q", out)
		}
		ex := run(t, boxes["nosub"], "python", sudoCell)
		if !strings.Contains(mainText(ex), "error this process may not start processes") {
			t.Fatalf("confined, sudo must refuse: %+v %+v", ex, ex.Error)
		}
		if exists(boxes["nosub"], "/tmp/sudo-ran") {
			t.Fatal("the refused command ran")
		}
		// The caller's own commands are the caller's: sudo works there.
		if res, out, errOut := runAs(t, boxes["nosub"], "", "sudo", "id", "-u"); res.ExitCode != 0 || out != "0\n" {
			t.Fatalf("sudo from a command: %d %q %q", res.ExitCode, out, errOut)
		}
	})

	t.Run("another interpreter's memory", func(t *testing.T) {
		for _, name := range []string{"free", "nosub"} {
			c, err := boxes[name].CreateContext(context.Background(), agentproto.ContextSpec{Language: "bash"})
			if err != nil {
				t.Fatal(err)
			}
			defer boxes[name].DeleteContext(context.Background(), c.ID)
		}
		if ex, _ := inContext(t, boxes["free"], "python", memCell); mainText(ex) != "'written'" {
			t.Fatalf("unconfined, the other interpreter's memory is written: %+v %+v", ex, ex.Error)
		}
		ex, _ := inContext(t, boxes["nosub"], "python", memCell)
		if ex.Error == nil || ex.Error.Name != "PermissionError" || !strings.Contains(ex.Error.Value, "/proc/") {
			t.Fatalf("confined, the other interpreter's memory must be closed: %+v %+v", ex, ex.Error)
		}
	})

	t.Run("io_uring", func(t *testing.T) {
		out, err := exec.Command("/usr/bin/python3", "-c", uringCell).Output()
		if err != nil || strings.HasPrefix(string(out), "-1") {
			t.Fatalf("on the host, io_uring_setup works: %q %v", out, err)
		}
		ex, _ := inContext(t, boxes["nosub"], "python", uringCell)
		if ex.Error != nil || ex.Stdout != "-1 1\n" {
			t.Fatalf("in the sandbox, io_uring_setup must fail with EPERM: %q %+v", ex.Stdout, ex.Error)
		}
	})

	t.Run("a file a fresh interpreter runs", func(t *testing.T) {
		for _, name := range []string{"free", "nosub"} {
			c, err := boxes[name].CreateContext(context.Background(), agentproto.ContextSpec{Language: "python"})
			if err != nil {
				t.Fatal(err)
			}
			defer boxes[name].DeleteContext(context.Background(), c.ID)
			ex := runReq(t, boxes[name], sandbox.ExecuteRequest{ContextID: c.ID, Code: plantCell})
			if ex.Error == nil || ex.Error.Name != "KernelDied" {
				t.Fatalf("%s: the plant ends its interpreter: %+v", name, ex.Error)
			}
			ex = runReq(t, boxes[name], sandbox.ExecuteRequest{ContextID: c.ID, Code: "1 + 1"})
			if mainText(ex) != "2" {
				t.Fatalf("%s: the restarted interpreter: %+v %+v", name, ex, ex.Error)
			}
			if got, want := exists(boxes[name], "/tmp/planted"), name == "free"; got != want {
				t.Fatalf("%s: the planted .pth ran outside the filter: %v, want %v", name, got, want)
			}
		}
	})
}
