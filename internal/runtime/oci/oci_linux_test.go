package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func testConfig(t *testing.T, instance string) Config {
	t.Helper()
	testutil.RequireRoot(t)
	return Config{
		RuntimePath: testutil.Runc(t), StateDir: testutil.ShortTempDir(t), AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: instance,
	}
}

func ping(t *testing.T, sock string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	pingConn(t, c)
}

// pingConn pings the agent at the other end of c, and closes c.
func pingConn(t *testing.T, c net.Conn) {
	t.Helper()
	defer c.Close()
	conn := agentproto.NewConn(c)
	if err := conn.WriteJSON(agentproto.Request{Op: agentproto.OpPing}); err != nil {
		t.Fatal(err)
	}
	var ev agentproto.Event
	if err := conn.ReadJSON(&ev); err != nil || ev.Agent == nil {
		t.Fatalf("ping: %v %+v", err, ev)
	}
}

func assertGone(t *testing.T, o *OCI, id string) {
	t.Helper()
	if d := o.cg.dirs(id); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), o.bundle(id)) {
		t.Errorf("mounts left under %s", o.bundle(id))
	}
	if _, err := os.Stat(o.bundle(id)); err == nil {
		t.Errorf("bundle left: %s", o.bundle(id))
	}
	if _, held, err := o.ids.find(o.bundle(id)); held || err != nil {
		t.Errorf("id range of %s still held (%v)", id, err)
	}
}

func TestCreateDestroy(t *testing.T) {
	o, err := New(testConfig(t, "cd"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	rootfs := testutil.TemplateRootFS(t, "python")
	inst, err := o.Create(context.Background(), runtime.Spec{ID: "one", RootFS: rootfs,
		Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20, CPUs: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	ping(t, inst.Socket)
	// Pids counts the tenant's tasks, against its limit: none yet (the
	// agent's own are in its reserve, AgentPids).
	u, err := o.Usage(context.Background(), "one")
	if err != nil || u.MemoryLimit != 128<<20 || u.Pids != 0 || u.CPULimit != 0.5 || u.DiskTotalBytes < 16<<20 || u.DiskTotalBytes > 16<<20+256<<10 ||
		u.MemoryCacheBytes < 0 || u.MemoryCacheBytes > u.MemoryBytes {
		t.Fatalf("usage %+v %v", u, err)
	}
	if n, err := o.OOMKills("one"); err != nil || n != u.OOMKills {
		t.Fatalf("OOMKills = %d, %v; Usage says %d", n, err, u.OOMKills)
	}
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "one", RootFS: rootfs}); err == nil {
		t.Fatal("a second sandbox with the same id was created")
	}
	// Another sandbox gets other host ids; its bundle's group is its own.
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "two", RootFS: rootfs,
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	var st1, st2 syscall.Stat_t
	if syscall.Stat(o.bundle("one"), &st1) != nil || syscall.Stat(o.bundle("two"), &st2) != nil ||
		st1.Gid == st2.Gid || st1.Gid < DefaultIDMap.HostID+DefaultIDMap.Size || st1.Mode&0o777 != 0o710 {
		t.Errorf("bundles: gid %d mode %o and gid %d: want 0710 and distinct ranges after the template's", st1.Gid, st1.Mode&0o777, st2.Gid)
	}
	if err := o.Destroy(context.Background(), "two"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := o.List(context.Background()); len(ids) != 1 || ids[0] != "one" {
		t.Fatalf("List = %v", ids)
	}
	if err := o.Destroy(context.Background(), "one"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, o, "one")
	if _, err := o.OOMKills("one"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("OOMKills of a destroyed sandbox: %v, want ErrNotFound", err)
	}
	if err := o.Destroy(context.Background(), "one"); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
}

// BenchmarkUsage and BenchmarkOOMKills are the two ways the engine can read
// a sandbox's OOM-kill count before each execution: all of Usage, or the
// one file of OOMKills.
func BenchmarkUsage(b *testing.B) {
	o, id := benchSandbox(b)
	for b.Loop() {
		if _, err := o.Usage(context.Background(), id); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOOMKills(b *testing.B) {
	o, id := benchSandbox(b)
	for b.Loop() {
		if _, err := o.OOMKills(id); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSandbox(b *testing.B) (*OCI, string) {
	testutil.RequireRoot(b)
	o, err := New(Config{RuntimePath: testutil.Runc(b), StateDir: testutil.ShortTempDir(b), AgentBin: testutil.AgentBin(b),
		CgroupParent: "sheepfold-test", Instance: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { o.Close() })
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "bench", RootFS: testutil.TemplateRootFS(b, "python"),
		Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := o.Destroy(context.Background(), "bench"); err != nil {
			b.Error(err)
		}
	})
	return o, "bench"
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	o, err := New(testConfig(t, "fail"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	// A root without the agent's mount point target parent still works,
	// but a rootfs that is a file makes runc fail after our mounts are up.
	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "usr"), 0o755)
	os.WriteFile(filepath.Join(bad, "proc"), []byte("not a dir"), 0o644)
	// Owned as templates are, so that it fails in runc, not before.
	for _, p := range []string{bad, filepath.Join(bad, "usr"), filepath.Join(bad, "proc")} {
		os.Chown(p, int(DefaultIDMap.HostID), int(DefaultIDMap.HostID))
	}
	os.Chmod(bad, 0o755)
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "bad", RootFS: bad,
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err == nil {
		t.Fatal("create with a broken rootfs succeeded")
	} else if !strings.Contains(err.Error(), "runc") {
		t.Fatalf("create failed before runc ran: %v", err)
	}
	assertGone(t, o, "bad")
	for _, id := range []string{"../x", "UPPER", ""} {
		if _, err := o.Create(context.Background(), runtime.Spec{ID: id, RootFS: bad}); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}

// die makes o as a dead process leaves it: nothing of it runs any more
// (its background sweep and the maker of spare user namespaces, whose
// programs, between fork and exec, hold a copy of every descriptor,
// the lock's included), its descriptors are closed, its sandboxes stay.
func die(o *OCI) {
	o.stopBackground()
	o.lock.Close()
}

func TestSweepDeadInstance(t *testing.T) {
	cfg := testConfig(t, "dead")
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Create(context.Background(), runtime.Spec{ID: "orphan", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Fatal("a second process took a live instance's lock")
	}
	die(crashed) // the process "dies": its lock goes, its sandbox stays

	cfg.Instance = "survivor"
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	assertGone(t, crashed, "orphan")
	if _, err := os.Stat(crashed.dir); err == nil {
		t.Errorf("dead instance dir %s left", crashed.dir)
	}
}

// probeAccess is Python that tries to read, list, write and connect to
// the paths it is given and prints the errno of each attempt (0: it
// worked).
const probeAccess = `
import errno, json, os, socket, sys
def attempt(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno
paths = json.loads(sys.argv[1])
def connect(p):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p)
    finally:
        s.close()
r = {
    "read secret": attempt(lambda: open(paths["secret"]).read()),
    "list home": attempt(lambda: os.listdir(paths["home"])),
    "write tmp": attempt(lambda: open(os.path.join(paths["tmp"], "planted-%d" % os.getpid()), "w").close()),
    "list upper": attempt(lambda: os.listdir(paths["upper"])),
    "list bundle": attempt(lambda: os.listdir(paths["bundle"])),
    "read config": attempt(lambda: open(paths["config"]).read()),
    "read log": attempt(lambda: open(paths["log"]).read()),
    "connect agent": attempt(lambda: connect(paths["socket"])),
}
print(json.dumps(r))
`

// TestHostFilesPrivate: no host user but root reaches a sandbox's files,
// bundle, agent socket or log, through the paths /proc/self/mountinfo
// shows. The same probe as root reaches them all, so the paths are right.
func TestHostFilesPrivate(t *testing.T) {
	o, err := New(testConfig(t, "priv"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	inst, err := o.Create(context.Background(), runtime.Spec{ID: "tenant", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Destroy(context.Background(), "tenant")

	// The overlay's mount point and upper dir, as any host user sees them.
	var rootfs, upper string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], o.bundle("tenant")) && strings.Contains(line, " - overlay ") {
			rootfs = f[4]
			for _, opt := range strings.Split(f[len(f)-1], ",") {
				if v, ok := strings.CutPrefix(opt, "upperdir="); ok {
					upper = v
				}
			}
		}
	}
	if rootfs == "" || upper == "" {
		t.Fatalf("overlay of the sandbox not in mountinfo:\n%s", mounts)
	}
	// A tenant's file, readable by everyone inside.
	secret := filepath.Join(rootfs, "home/user/secret")
	if err := os.WriteFile(secret, []byte("tenant data"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths, _ := json.Marshal(map[string]string{
		"secret": secret, "home": filepath.Join(rootfs, "home/user"), "tmp": filepath.Join(rootfs, "tmp"),
		"upper": upper, "bundle": o.bundle("tenant"), "config": filepath.Join(o.bundle("tenant"), "config.json"),
		"log": filepath.Join(o.bundle("tenant"), "agent.log"), "socket": inst.Socket,
	})
	probe := func(cred *syscall.Credential) map[string]int {
		cmd := exec.Command("/usr/bin/python3", "-c", probeAccess, string(paths))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("probe: %v: %s", err, out)
		}
		var r map[string]int
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("probe: %v: %s", err, out)
		}
		return r
	}
	for what, errno := range probe(nil) {
		if errno != 0 {
			t.Errorf("root: %s failed with errno %d: the probe is wrong", what, errno)
		}
	}
	for _, cred := range []*syscall.Credential{{Uid: 65534, Gid: 65534}, {Uid: 4_000_000_000, Gid: 4_000_000_000}} {
		for what, errno := range probe(cred) {
			if errno != int(syscall.EACCES) {
				t.Errorf("uid %d: %s: errno %d, want EACCES", cred.Uid, what, errno)
			}
		}
	}
}

// start starts a process in the sandbox through its agent and returns once
// the agent says it started.
func start(t *testing.T, sock, script string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := agentproto.NewConn(c)
	if err := conn.WriteJSON(agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", script}}}); err != nil {
		t.Fatal(err)
	}
	var ev agentproto.Event
	if err := conn.ReadJSON(&ev); err != nil || ev.Type != agentproto.EventStart {
		t.Fatalf("process.start: %v %+v", err, ev)
	}
}

// hostProcs lists the live host processes (zombies are dead; the host's
// init reaps them) whose uid is in [base, base+size), outside the host's
// mount namespace: a sandbox's processes never share it, while the holder
// of a user namespace the runtime made in advance for the range
// (spare_linux.go) lives in it and belongs to no sandbox.
func hostProcs(base, size uint32) []string {
	var out []string
	self, _ := os.Readlink("/proc/self/ns/mnt")
	statuses, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, f := range statuses {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), "\nState:\tZ") {
			continue
		}
		if mnt, _ := os.Readlink(filepath.Join(filepath.Dir(f), "ns", "mnt")); mnt == self {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				var uid uint32
				if _, err := fmt.Sscan(v, &uid); err == nil && uid >= base && uid-base < size {
					out = append(out, filepath.Base(filepath.Dir(f)))
				}
			}
		}
	}
	return out
}

// TestDestroyKillsAtOnce: a sandbox whose processes keep forking and
// exiting (always a step ahead of anyone killing pids one by one), and
// whose runc state is lost (as after a crash in create), is destroyed
// completely: through cgroup.kill where there is a cgroup2 hierarchy, and
// through the v1 freezer.
func TestDestroyKillsAtOnce(t *testing.T) {
	o, err := New(testConfig(t, "kill"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	unified := o.cg.unified
	defer func() { o.cg.unified = unified }()
	for _, how := range []string{"cgroup.kill", "freezer"} {
		t.Run(how, func(t *testing.T) {
			if how == "cgroup.kill" && unified == "" {
				t.Skip("no cgroup2 hierarchy on this host")
			}
			if how == "freezer" {
				if o.cg.v2 {
					t.Skip("no v1 freezer on a cgroup v2 host")
				}
				o.cg.unified = ""
			}
			id := "chain-" + strings.ReplaceAll(how, ".", "")
			inst, err := o.Create(context.Background(), runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"),
				Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 16 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(o.bundle(id), &st); err != nil {
				t.Fatal(err)
			}
			start(t, inst.Socket, `echo '/bin/sh /tmp/chain &' > /tmp/chain; /bin/sh /tmp/chain`)
			// The chain runs: its pids keep changing.
			first := hostProcs(st.Gid, 65536)
			deadline := time.Now().Add(10 * time.Second)
			for slices.Equal(hostProcs(st.Gid, 65536), first) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := os.RemoveAll(filepath.Join(o.runcDir, id)); err != nil {
				t.Fatal(err)
			}
			if err := o.Destroy(context.Background(), id); err != nil {
				t.Fatalf("destroy: %v", err)
			}
			assertGone(t, o, id)
			if left := hostProcs(st.Gid, 65536); len(left) > 0 {
				t.Errorf("processes of the sandbox left: %v", left)
			}
		})
	}
}

// fsImmutableFL is FS_IMMUTABLE_FL of <linux/fs.h> (x/sys lacks it).
const fsImmutableFL = 0x10

// setImmutable sets or clears a file's immutable flag (chattr +i): nobody,
// root included, may then unlink it, as with a stuck leftover.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatal(err)
	}
}

// TestSweepRetriesStubbornLeftovers: a dead instance's sandbox that cannot
// be destroyed at once does not hold New up; it is swept again in the
// background until it is gone.
func TestSweepRetriesStubbornLeftovers(t *testing.T) {
	defer func(r time.Duration) { sweepRetry = r }(sweepRetry)
	sweepRetry = 50 * time.Millisecond
	cfg := testConfig(t, "stuck")
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Create(context.Background(), runtime.Spec{ID: "orphan", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	stuck := filepath.Join(crashed.bundle("orphan"), "config.json")
	setImmutable(t, stuck, true)
	// Should the test fail before the survivor swept the leftover, one
	// more instance sweeps it, so that nothing is left behind.
	t.Cleanup(func() {
		if _, err := os.Stat(stuck); err == nil {
			setImmutable(t, stuck, false)
		}
		if _, err := os.Stat(crashed.dir); err != nil {
			return
		}
		cfg.Instance = "sweeper"
		o, err := New(cfg)
		if err != nil {
			t.Errorf("sweep the leftover: %v", err)
			return
		}
		defer o.Close()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(crashed.dir); errors.Is(err, os.ErrNotExist) {
				return
			}
		}
		t.Errorf("the leftover %s is still there", crashed.dir)
	})
	die(crashed) // the process dies

	cfg.Instance = "survivor"
	start := time.Now()
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if took := time.Since(start); took > sweepWait+time.Second {
		t.Fatalf("New took %s", took)
	}
	if _, err := os.Stat(crashed.bundle("orphan")); err != nil {
		t.Fatalf("the stuck leftover went at once (%v): the test proves nothing", err)
	}
	setImmutable(t, stuck, false)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(crashed.dir); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leftover was not swept again")
		}
	}
	assertGone(t, crashed, "orphan")
}
