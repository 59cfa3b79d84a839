package sandbox_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// netPauseEngine is a runc engine that keeps checkpoints and whose
// gateways see w's world.
func netPauseEngine(t *testing.T, w *egressWorld) *sandbox.Manager {
	t.Helper()
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: pause is refused (TestGVisorSandbox)")
	dir := testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	return runcEngine(t, func(c *sandbox.Config) {
		c.Events = log
		c.Egress.Test = w.test
		c.Egress.Self = []netip.AddrPort{w.self}
		c.CheckpointDir = filepath.Join(dir, "checkpoints")
	})
}

// egressAttempts tries, from inside a sandbox allowed api.test alone, the
// allowed host, a name outside the allowlist and that name's address as
// a literal (with its Host): "allowed|denied name|denied address".
const egressAttempts = `
print(get("api.test"), get("evil.test"), get("203.0.113.30", hdr="evil.test"), sep="|", end="")`

// wantConfined is what egressAttempts prints in a sandbox whose
// allowlist holds: the allowed host answers, the other name does not
// resolve, its address is refused.
const wantConfined = "hello from api.test|gaierror|ECONNREFUSED"

// confinement is what a restored sandbox must keep of the original:
// its code's view of its ids, seccomp and capabilities (the host ids
// apart, printed last), and its cgroup limits.
const confinementProbe = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return 0 if rc == 0 else ctypes.get_errno()
status = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")}
um, gm = open("/proc/self/uid_map").read().split(), open("/proc/self/gid_map").read().split()
print(um[0], um[2], gm[0], gm[2], os.getuid(), status["Seccomp"], status["Seccomp_filters"], status["NoNewPrivs"],
      status["CapEff"], status["CapBnd"], errno_of(libc.unshare(0x10000000)), errno_of(libc.unshare(0x40000000)),
      "host", um[1], gm[1])
`

// confinement returns the probe's view without the host ids, the host
// uid of the sandbox's root, and its limits as the host reads them.
func confinement(t *testing.T, s *sandbox.Sandbox) (view, hostID string, limits [2]float64) {
	t.Helper()
	out := py(t, s, confinementProbe)
	view, ids, ok := strings.Cut(out, " host ")
	if !ok {
		t.Fatalf("probe printed %q", out)
	}
	u, err := s.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryLimit <= 0 {
		t.Fatalf("no memory limit read: %+v", u)
	}
	return view, ids, [2]float64{float64(u.MemoryLimit), u.CPULimit}
}

// TestNetworkPauseResume: a sandbox with an allowlist is paused and
// resumed (twice, with a connection open through its gateway at the
// first pause), snapshotted, and cloned from the snapshot. After each
// resume, after the snapshot (the parent) and in the clone, the
// allowlist holds exactly: the allowed host answers, a name outside it
// does not resolve and its address is refused, while a control sandbox
// that allows that name reaches it (so the attempts would succeed where
// not confined). Its request count goes on across the resumes; the
// clone's starts at its own first. Its isolation (ids, seccomp,
// capabilities, what seccomp refuses, memory and CPU limits) after the
// resumes is the original's, and the clone's the same apart from its
// own host ids.
func TestNetworkPauseResume(t *testing.T) {
	ctx := context.Background()
	w := newEgressWorld(t)
	m := netPauseEngine(t, w)
	pol := allowlist("api.test")
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol, Timeout: 10 * time.Minute})
	ctl := newSandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test", "evil.test")})
	if got := py(t, ctl, netProbe+"\n"+`print(get("evil.test"), get("203.0.113.30", hdr="evil.test"), sep="|", end="")`); got != "hello from evil.test|hello from evil.test" {
		t.Fatalf("control: a sandbox allowed evil.test gets %q from it", got)
	}

	if got := py(t, s, netProbe+egressAttempts); got != wantConfined {
		t.Fatalf("before the pause: %q, want %q", got, wantConfined)
	}
	run(t, s, "python", "x = 41")
	view, hostID, limits := confinement(t, s)
	before := py(t, s, isolationProbe)

	// A connection open through the gateway at the pause, and a UDP
	// socket connected to its resolver: they may be lost (a restore
	// could not connect them again), the process holding them is not.
	holder, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-c", `
import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect(("10.255.255.1", 53))
c = socket.create_connection(("api.test", 80), timeout=10)
c.sendall(b"GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n")
c.recv(1000)
open("/tmp/holding", "w").write("holding\n")
while True:
    time.sleep(3600)`}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); lineCount(t, s, "/tmp/holding") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holder never got its answer through the gateway")
		}
	}

	for round := 1; round <= 2; round++ {
		reqs := s.EgressRequests()
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("round %d: pause of a sandbox with a network: %v", round, err)
		}
		if got := s.EgressRequests(); got != reqs {
			t.Fatalf("round %d: paused, the request count is %d, was %d", round, got, reqs)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		if got := py(t, s, netProbe+egressAttempts); got != wantConfined {
			t.Fatalf("round %d: after the resume: %q, want %q", round, got, wantConfined)
		}
		// One request (the allowed connection; a refused one and a name
		// that does not resolve are none), counted on from before.
		if got := s.EgressRequests(); got != reqs+1 {
			t.Errorf("round %d: request count %d after the resume's one request, want %d (on from %d)", round, got, reqs+1, reqs)
		}
		if got := mainText(run(t, s, "python", "x += 1\nx")); got != "4"+string(rune('1'+round)) {
			t.Fatalf("round %d: x = %s after the resume", round, got)
		}
	}
	procs, err := s.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alive := false
	for _, p := range procs {
		alive = alive || p.PID == holder
	}
	if !alive {
		t.Errorf("the process that held a connection at the pause is gone: %+v", procs)
	}
	if got := py(t, s, isolationProbe); got != before {
		t.Errorf("isolation after the resumes:\n%s\nbefore:\n%s", got, before)
	}
	if v, h, l := confinement(t, s); v != view || h != hostID || l != limits {
		t.Errorf("after the resumes: %s (host %s) %v, before %s (host %s) %v", v, h, l, view, hostID, limits)
	}

	// A snapshot: the parent keeps its network, the clone gets its own.
	snap := filepath.Join(testutil.ShortTempDir(t), "snap")
	if err := s.Snapshot(ctx, snap); err != nil {
		t.Fatalf("snapshot of a sandbox with a network: %v", err)
	}
	if got := py(t, s, netProbe+egressAttempts); got != wantConfined {
		t.Fatalf("the parent after the snapshot: %q, want %q", got, wantConfined)
	}
	clone, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: snap, Policy: pol})
	if err != nil {
		t.Fatalf("clone of a sandbox with a network: %v", err)
	}
	defer m.Kill(ctx, clone.ID)
	if got := mainText(run(t, clone, "python", "x")); got != "43" {
		t.Errorf("the clone's x = %s, want the parent's 43", got)
	}
	if got := py(t, clone, netProbe+egressAttempts); got != wantConfined {
		t.Fatalf("the clone: %q, want %q", got, wantConfined)
	}
	if got := clone.EgressRequests(); got != 1 {
		t.Errorf("the clone's request count is %d after its one request, want 1 (a gateway of its own)", got)
	}
	if v, h, l := confinement(t, clone); v != view || h == hostID || l != limits {
		t.Errorf("the clone: %s (host %s) %v, the original %s (host %s) %v", v, h, l, view, hostID, limits)
	}
	// The clone's network goes with it; the parent's stays.
	if err := m.Kill(ctx, clone.ID); err != nil {
		t.Fatal(err)
	}
	if got := py(t, s, netProbe+egressAttempts); got != wantConfined {
		t.Fatalf("the parent after its clone stopped: %q", got)
	}
}

// TestNetworkPausedAfterRestart: a sandbox with an allowlist and a
// network_requests budget, paused and left to the next engine, comes
// back with its allowlist and the requests it had made counted: the
// first request after the resume is allowed (the control) and the one
// past the budget refused, as they would have been without the restart
// (which must not give the budget back), while a name outside the
// allowlist still does not resolve.
func TestNetworkPausedAfterRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	w := newEgressWorld(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	state := testutil.ShortTempDir(t)
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	rcfg := oci.Config{RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
		CgroupParent: testCgroupParent, Instance: "t" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	rt, err := oci.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	cgroup := rt.CgroupPath()
	dir := testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{Runtime: rt, CheckpointDir: filepath.Join(dir, "checkpoints"), KeepPaused: true,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}
	cfg.Egress.Test = w.test
	cfg.Egress.Self = []netip.AddrPort{w.self}
	first, err := sandbox.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 3
	pol := allowlist("api.test")
	pol.ResourceLimits = &policy.ResourceLimits{NetworkRequests: ptr(int64(budget))}
	s, err := first.Create(ctx, sandbox.CreateOptions{Timeout: 10 * time.Minute, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	for range budget - 1 {
		if got := py(t, s, netProbe+`print(get("api.test"), end="")`); got != "hello from api.test" {
			t.Fatalf("within the budget: %q", got)
		}
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatalf("close the first engine: %v", err)
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("close the first runtime: %v", err)
	}

	rt2, err := oci.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Runtime = rt2
	m, err := sandbox.New(ctx, cfg)
	if err != nil {
		rt2.Close()
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(ctx); err != nil {
			t.Errorf("close the second engine: %v", err)
		}
		if err := rt2.Close(); err != nil {
			t.Errorf("close the second runtime: %v", err)
		}
		assertNoLeaks(t, state, rcfg.Instance, cgroup)
	}()
	kept, err := m.Get(s.ID)
	if err != nil {
		t.Fatalf("the paused sandbox was not taken back: %v", err)
	}
	defer m.Kill(ctx, kept.ID)
	if got := kept.EgressRequests(); got != budget-1 {
		t.Errorf("taken back, its request count is %d, want %d", got, budget-1)
	}
	if err := kept.Resume(ctx); err != nil {
		t.Fatalf("resume after the restart: %v", err)
	}
	got := py(t, kept, netProbe+`print(get("api.test"), get("api.test"), get("evil.test"), sep="|", end="")`)
	if want := "hello from api.test|ECONNREFUSED|gaierror"; got != want {
		t.Fatalf("after the restart: %q, want %q (the last request of the budget allowed, the one past it refused)", got, want)
	}
	if got := kept.EgressRequests(); got != budget {
		t.Errorf("request count %d after the restart, want %d", got, budget)
	}
}
