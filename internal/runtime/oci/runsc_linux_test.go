package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func gvisorConfig(t *testing.T, instance string) Config {
	t.Helper()
	cfg := testConfig(t, instance)
	cfg.RunscPath = testutil.Runsc(t)
	return cfg
}

// runscProcs lists the host processes of runsc (its gofer and Sentry)
// whose command line names dir (their --root).
func runscProcs(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(string(b), "runsc") && strings.Contains(string(b), dir) {
			out = append(out, e.Name()+" "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// pingVia is ping through a runtime.Instance's dialer.
func pingVia(t *testing.T, inst *runtime.Instance) {
	t.Helper()
	c, err := inst.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pingConn(t, c)
}

// TestGVisorCreateDestroy runs a sandbox under runsc beside one under
// runc in the same engine: the agent answers, Python runs in gVisor's
// kernel, the cgroup holds the sandbox's limits and usage, pause and
// resume work, a checkpoint is refused with ErrGVisor, and a destroy
// leaves no runsc process, state, cgroup, mount or bundle.
func TestGVisorCreateDestroy(t *testing.T) {
	o, err := New(gvisorConfig(t, "gv"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if got := o.Runtimes(); len(got) != 2 || got[0] != RuntimeGVisor || got[1] != RuntimeRunc {
		t.Fatalf("Runtimes = %v", got)
	}
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	lim := runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 16 << 20, CPUs: 0.5}
	inst, err := o.Create(ctx, runtime.Spec{ID: "gv", RootFS: rootfs, Runtime: RuntimeGVisor, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	pingVia(t, inst)
	// The kernel Python sees is gVisor's Sentry, not the host's.
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(execPython(t, inst.Socket, "import os; print(os.uname().release)"))
	if release == "" || release == unix.ByteSliceToString(host.Release[:]) {
		t.Fatalf("the sandbox sees kernel %q, the host's", release)
	}
	// Files land on the sandbox's own disk, under its limit.
	if out := execPython(t, inst.Socket, "open('/home/user/f','w').write('x'*4096); import os; print(os.path.getsize('/home/user/f'))"); strings.TrimSpace(out) != "4096" {
		t.Fatalf("write a file: %q", out)
	}
	u, err := o.Usage(ctx, "gv")
	if err != nil || u.MemoryLimit != lim.MemoryBytes || u.CPULimit != 0.5 || u.MemoryBytes <= 0 || u.CPUNanos == 0 ||
		u.DiskTotalBytes < lim.DiskBytes || u.DiskBytes <= 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
	// A runc sandbox beside it, in the same engine.
	rinst, err := o.Create(ctx, runtime.Spec{ID: "rc", RootFS: rootfs, Runtime: RuntimeRunc, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	ping(t, rinst.Socket)
	if o.gvisor("rc") || !o.gvisor("gv") {
		t.Fatal("runtime markers are wrong")
	}
	if err := o.Freeze(ctx, "gv"); err != nil {
		t.Fatal(err)
	}
	if err := o.Thaw(ctx, "gv"); err != nil {
		t.Fatal(err)
	}
	pingVia(t, inst)
	if err := o.Checkpoint(ctx, "gv", filepath.Join(t.TempDir(), "ck")); !errors.Is(err, ErrGVisor) || !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("checkpoint of a gVisor sandbox: %v, want ErrGVisor", err)
	}
	if err := o.Snapshot(ctx, "gv", filepath.Join(t.TempDir(), "snap")); !errors.Is(err, ErrGVisor) {
		t.Fatalf("snapshot of a gVisor sandbox: %v, want ErrGVisor", err)
	}
	if len(runscProcs(o.runscDir)) == 0 {
		t.Fatal("no runsc process: the control of the leftover check below fails")
	}
	for _, id := range []string{"gv", "rc"} {
		if err := o.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		assertGone(t, o, id)
	}
	if p := runscProcs(o.runscDir); len(p) > 0 {
		t.Errorf("runsc processes left: %v", p)
	}
	if o.runscState("gv") {
		t.Error("runsc state left")
	}
}

// TestGVisorNotInstalled: without runsc, a gVisor sandbox is refused
// with ErrNoRunsc, and nothing of it is left.
func TestGVisorNotInstalled(t *testing.T) {
	o, err := New(testConfig(t, "gvn"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if got := o.Runtimes(); len(got) != 1 || got[0] != RuntimeRunc {
		t.Fatalf("Runtimes = %v", got)
	}
	_, err = o.Create(context.Background(), runtime.Spec{ID: "x", RootFS: testutil.TemplateRootFS(t, "python"), Runtime: RuntimeGVisor})
	if !errors.Is(err, ErrNoRunsc) {
		t.Fatalf("create: %v, want ErrNoRunsc", err)
	}
	assertGone(t, o, "x")
	cfg := testConfig(t, "gvn2")
	cfg.DefaultRuntime = RuntimeGVisor
	if _, err := New(cfg); err == nil {
		t.Fatal("an engine defaulting to gVisor without runsc started")
	}
}

// TestGVisorAgentSocketSwap is the attack on the agent channel of a
// gVisor sandbox: code inside (as root) replaces its agent's socket, on
// the directory shared with the host, by a symlink to another sandbox's
// agent socket, so that the host's requests would reach the other
// sandbox. The host's dialer refuses the connection (its listener is
// outside the sandbox's cgroup); the control dials the same path plainly
// and reaches the other sandbox.
func TestGVisorAgentSocketSwap(t *testing.T) {
	o, err := New(gvisorConfig(t, "gvs"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	lim := runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 16 << 20}
	attacker, err := o.Create(ctx, runtime.Spec{ID: "attacker", RootFS: rootfs, Runtime: RuntimeGVisor, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, "attacker")
	victim, err := o.Create(ctx, runtime.Spec{ID: "victim", RootFS: rootfs, Runtime: RuntimeGVisor, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, "victim")
	execPython(t, attacker.Socket, "import os\nos.mkdir('/home/user/marker-attacker')")
	// The attacker's agent is already listening; the symlink replaces
	// its path for the host's next dials.
	out := runAsRoot(t, attacker.Socket, "mv "+runscSocketDir+"/agent.sock "+runscSocketDir+"/old.sock && ln -s "+victim.Socket+" "+runscSocketDir+"/agent.sock && readlink "+runscSocketDir+"/agent.sock")
	if strings.TrimSpace(out) != victim.Socket {
		t.Fatalf("the symlink was not planted: %q", out)
	}
	// Control: the path now leads a plain dial to the victim's agent.
	c, err := net.Dial("unix", attacker.Socket)
	if err != nil {
		t.Fatalf("control: a plain dial through the symlink failed: %v", err)
	}
	c.Close()
	if out := execPython(t, attacker.Socket, "import os; print(os.path.exists('/home/user/marker-attacker'))"); strings.TrimSpace(out) != "False" {
		t.Fatalf("control: the plain dial reached the attacker itself (%q), not the victim", out)
	}
	if _, err := attacker.Dial(ctx); !errors.Is(err, errNotThisSandbox) {
		t.Fatalf("the host's dialer followed the swapped socket: %v, want errNotThisSandbox", err)
	}
	pingVia(t, victim) // the victim's own dialer still reaches it
}

// runAsRoot runs a shell script as the sandbox's root (a tenant may:
// sudo, or user "root" in a request) and returns its stdout.
func runAsRoot(t *testing.T, sock, script string) string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out strings.Builder
	done, err := agentproto.Call(c, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "/bin/sh", Args: []string{"-c", script}, User: agentproto.UserRoot}}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventStdout || ev.Type == agentproto.EventStderr {
				out.Write(ev.Data)
			}
			return nil
		}})
	if err != nil || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Fatalf("%q as root: %v %+v: %s", script, err, done, out.String())
	}
	return out.String()
}

// TestGVisorDestroyKillsByCgroup: a destroy kills a gVisor sandbox's
// Sentry and gofer through its cgroup, not through runsc: with runsc's
// state gone (a crash, or a `runsc delete` that hangs on a busy Sentry)
// nothing of it is left either. On a hybrid host runsc places them in the
// v1 hierarchies alone, which the kill must then use.
func TestGVisorDestroyKillsByCgroup(t *testing.T) {
	o, err := New(gvisorConfig(t, "gvk"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "gvk", RootFS: testutil.TemplateRootFS(t, "python"), Runtime: RuntimeGVisor,
		Limits: runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 16 << 20}}); err != nil {
		t.Fatal(err)
	}
	if len(runscProcs(o.runscDir)) == 0 {
		t.Fatal("no runsc process to kill")
	}
	state, _ := filepath.Glob(filepath.Join(o.runscDir, "gvk_sandbox:*"))
	for _, f := range state {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if o.runscState("gvk") {
		t.Fatal("runsc's state is still there")
	}
	if err := o.Destroy(context.Background(), "gvk"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, o, "gvk")
	if p := runscProcs(o.runscDir); len(p) > 0 {
		t.Errorf("runsc processes left: %v", p)
	}
}

// TestGVisorNetwork: a gVisor sandbox with a network runs its Sentry in a
// network namespace of its own that holds the gateway's device alone
// (runsc --network=sandbox; the test holds the device's other end, in
// the gateway's place). Its code sees lo and that device, and what it
// sends leaves through it: the test reads its SYN there. The host's side
// of the device keeps no address (runsc took it: the namespace's host
// kernel answers nothing for the sandbox), the Sentry runs in that
// namespace in a user namespace of runsc's without CAP_NET_ADMIN, and a
// destroy leaves no mount of the namespace. Control: a gVisor sandbox without a network sees lo
// alone, and its connect fails at once (ENETUNREACH).
func TestGVisorNetwork(t *testing.T) {
	o, err := New(gvisorConfig(t, "gvnet"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	lim := runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 16 << 20}
	tun, netns := -1, ""
	attach := func(_ context.Context, path string) error {
		netns = path
		return inNetns(path, func() (err error) {
			if tun, err = testTUN("eth0", netip.MustParseAddr("10.255.255.2")); err != nil {
				return err
			}
			return nil
		})
	}
	inst, err := o.Create(ctx, runtime.Spec{ID: "net", RootFS: rootfs, Runtime: RuntimeGVisor, Limits: lim,
		Network: &runtime.Network{ResolvConf: "nameserver 10.255.255.1\n", AttachNetns: attach}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, "net") // no mount of the namespace left either
	defer unix.Close(tun)
	const probe = `import socket, errno
print(sorted(n for _, n in socket.if_nameindex()), open('/etc/resolv.conf').read().split())
s = socket.socket()
s.setblocking(False)
try:
    s.connect(("203.0.113.10", 80))
except BlockingIOError:
    print("sent")
except OSError as e:
    print(errno.errorcode[e.errno])
`
	if got := execPython(t, inst.Socket, probe); got != "['eth0', 'lo'] ['nameserver', '10.255.255.1']\nsent\n" {
		t.Fatalf("inside the networked sandbox: %q", got)
	}
	if err := readSYN(tun, netip.MustParseAddrPort("203.0.113.10:80")); err != nil {
		t.Fatalf("the sandbox's connect did not leave through the device: %v", err)
	}
	var addrs []net.Addr
	if err := inNetns(netns, func() error {
		i, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		addrs, err = i.Addrs()
		return err
	}); err != nil || len(addrs) != 0 {
		t.Fatalf("the host's side of the device holds %v (%v), want no address", addrs, err)
	}

	if err := sentryConfined(o, netns); err != nil {
		t.Fatal(err)
	}

	// Control: no network, lo alone.
	plain, err := o.Create(ctx, runtime.Spec{ID: "plain", RootFS: rootfs, Runtime: RuntimeGVisor, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, "plain")
	if got := execPython(t, plain.Socket, probe); !strings.HasPrefix(got, "['lo'] ") || !strings.HasSuffix(got, "\nENETUNREACH\n") {
		t.Fatalf("control, without a network: %q", got)
	}
}

// sentryConfined checks the Sentry of o's one gVisor sandbox (runsc's
// "runsc-sandbox" process) runs in the network namespace bound at netns,
// in a user namespace other than the host's, without CAP_NET_ADMIN: it
// cannot reconfigure a namespace the host's user namespace owns.
func sentryConfined(o *OCI, netns string) error {
	var st unix.Stat_t
	if err := unix.Stat(netns, &st); err != nil {
		return err
	}
	hostUser, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return err
	}
	found := false
	for _, p := range runscProcs(o.runscDir) {
		pid, cmd, _ := strings.Cut(p, " ")
		if !strings.HasPrefix(cmd, "runsc-sandbox ") {
			continue
		}
		found = true
		if n, _ := os.Readlink("/proc/" + pid + "/ns/net"); n != fmt.Sprintf("net:[%d]", st.Ino) {
			return fmt.Errorf("the Sentry %s is in network namespace %s, not the sandbox's (%d)", pid, n, st.Ino)
		}
		if u, _ := os.Readlink("/proc/" + pid + "/ns/user"); u == hostUser {
			return fmt.Errorf("the Sentry %s is in the host's user namespace", pid)
		}
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				var caps uint64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%x", &caps); err != nil {
					return err
				}
				if caps&(1<<unix.CAP_NET_ADMIN) != 0 {
					return fmt.Errorf("the Sentry %s holds CAP_NET_ADMIN (%x)", pid, caps)
				}
			}
		}
	}
	if !found {
		return errors.New("no Sentry (runsc-sandbox) process")
	}
	return nil
}

// testTUN makes a TUN device named name in the calling thread's network
// namespace, as the egress gateway's AttachNetns does: up, with address
// addr and the default route through it. It returns the device's
// descriptor.
func testTUN(name string, addr netip.Addr) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, err
	}
	link, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err == nil {
		err = netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}})
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// readSYN reads IPv4 packets from the TUN device fd until a TCP SYN to
// dst, for up to 10 seconds.
func readSYN(fd int, dst netip.AddrPort) error {
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 65536)
	var seen []string
	for time.Until(deadline) > 0 {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		} else if n == 0 {
			break
		}
		n, err := unix.Read(fd, buf)
		if err != nil {
			return err
		}
		p := buf[:n]
		if n < 20 || p[0]>>4 != 4 {
			seen = append(seen, fmt.Sprintf("%d bytes, version %d", n, p[0]>>4))
			continue
		}
		ihl := int(p[0]&15) * 4
		to, _ := netip.AddrFromSlice(p[16:20])
		if p[9] == unix.IPPROTO_TCP && n >= ihl+14 {
			port := uint16(p[ihl+2])<<8 | uint16(p[ihl+3])
			if netip.AddrPortFrom(to, port) == dst && p[ihl+13]&0x02 != 0 {
				return nil
			}
		}
		seen = append(seen, fmt.Sprintf("protocol %d to %s", p[9], to))
	}
	return fmt.Errorf("no SYN to %s; saw %v", dst, seen)
}
