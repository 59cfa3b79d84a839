package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// crashServer is a `sheepfold serve` of its own data dir that a test may
// kill -9 and start again on the same data dir.
type crashServer struct {
	t              *testing.T
	bin, dir, addr string
	key            string
	extra          []string // more flags of serve
	cmd            *exec.Cmd
	exited         chan struct{}
	log            *testutil.Buffer
	upAfter        time.Duration
}

func newCrashServer(t *testing.T) *crashServer {
	t.Helper()
	testutil.RequireRoot(t)
	runc := testutil.Runc(t)
	templates := filepath.Dir(testutil.TemplateRootFS(t, "python"))
	dir, err := os.MkdirTemp("", "sfcrash")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := build(bin); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(runc, filepath.Join(bin, "runc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(templates), filepath.Join(dir, "templates")); err != nil {
		t.Fatal(err)
	}
	s := &crashServer{t: t, bin: filepath.Join(bin, "sheepfold"), dir: dir}
	out, err := exec.Command(s.bin, "--data-dir", dir, "keys", "create", "--name", "crash").CombinedOutput()
	if err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	s.key = regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	ln.Close()
	t.Cleanup(func() {
		if s.cmd != nil {
			s.stop()
		}
		if ids := s.bundles(); len(ids) > 0 {
			t.Errorf("sandboxes left after a clean stop: %v", ids)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", lastLines([]byte(s.log.String()), 60))
		}
		os.RemoveAll(dir)
	})
	return s
}

func (s *crashServer) client() *client.Client { return client.New("http://"+s.addr, s.key) }

// start starts the server and waits until it answers; it records how
// long that took. Its pool does not follow demand (--pool-max is --pool):
// the tests count its members.
func (s *crashServer) start(pool int) {
	s.t.Helper()
	s.log = &testutil.Buffer{}
	s.cmd = exec.Command(s.bin, append([]string{"--data-dir", s.dir, "serve", "--listen", s.addr, "--pool", strconv.Itoa(pool), "--pool-max", strconv.Itoa(pool)}, s.extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	begin := time.Now()
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.exited) }()
	c := s.client()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := c.Version(context.Background()); err == nil {
			break
		}
		select {
		case <-s.exited:
			s.t.Fatalf("server exited at start:\n%s", s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("server did not start:\n%s", s.log.String())
		}
	}
	s.upAfter = time.Since(begin)
}

// poolReady waits until the warm pool has its member.
func (s *crashServer) poolReady() {
	s.t.Helper()
	eventually(s.t, 60*time.Second, "the warm pool to fill", func() bool {
		v, err := s.client().Version(context.Background())
		return err == nil && v.Pool != nil && v.Pool.Ready == v.Pool.Size
	})
}

// kill9 kills the server with SIGKILL and waits for it to be gone.
func (s *crashServer) kill9() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// stop stops the server cleanly (SIGTERM).
func (s *crashServer) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		s.t.Error("server did not stop on SIGTERM")
		s.kill9()
	}
	s.cmd = nil
}

// bundles lists the ids of every sandbox the runtime holds state for.
func (s *crashServer) bundles() []string {
	var ids []string
	for _, pattern := range []string{"run/*/sandboxes/*", "run/*/runc/*"} {
		m, _ := filepath.Glob(filepath.Join(s.dir, pattern))
		for _, p := range m {
			if id := filepath.Base(p); !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// sandboxProc is a host process, told apart from a later one with its pid by
// its start time.
type sandboxProc struct {
	pid   int
	start string
}

// startTime is the start time of a live process, "" for none (a zombie
// is dead: only its parent's wait is missing, and this host's pid 1 reaps
// slowly).
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return ""
	}
	return f[19]
}

func (p sandboxProc) alive() bool { return startTime(p.pid) == p.start }

// procs lists the host processes in the cgroups of sandbox id.
func procs(id string) []sandboxProc {
	files, _ := filepath.Glob("/sys/fs/cgroup/*/sheepfold/*/" + id + "/cgroup.procs")
	more, _ := filepath.Glob("/sys/fs/cgroup/sheepfold/*/" + id + "/cgroup.procs")
	var out []sandboxProc
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(l)
			if st := startTime(pid); st != "" && !slices.ContainsFunc(out, func(p sandboxProc) bool { return p.pid == pid }) {
				out = append(out, sandboxProc{pid, st})
			}
		}
	}
	return out
}

// assertGone checks that nothing of sandbox id is left on the host: no
// runtime state or bundle, no mount, no cgroup, none of its processes.
func (s *crashServer) assertGone(t *testing.T, id string, ps []sandboxProc) {
	t.Helper()
	if slices.Contains(s.bundles(), id) {
		t.Errorf("sandbox %s: runtime state or bundle left", id)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte("/"+id+"/")) {
		t.Errorf("sandbox %s: mounts left", id)
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*/sheepfold/*/" + id, "/sys/fs/cgroup/sheepfold/*/" + id} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("sandbox %s: cgroups left: %v", id, m)
		}
	}
	for _, p := range ps {
		if p.alive() {
			t.Errorf("sandbox %s: process %d left", id, p.pid)
		}
	}
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

func oomScore(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	return strings.TrimSpace(string(b))
}

// setImmutable sets or clears FS_IMMUTABLE_FL (chattr +i), which even
// root cannot unlink: a leftover that cannot be destroyed at once.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const immutable = 0x10 // FS_IMMUTABLE_FL
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if on {
		flags |= immutable
	} else {
		flags &^= immutable
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatal(err)
	}
}

// TestCrashRestart kills a real `sheepfold serve` with SIGKILL mid-
// execution, mid-create and mid-destroy, and starts it again on the same
// data dir each time: it comes up within seconds whatever it finds (a
// leftover it cannot destroy at once included), nothing of the earlier
// sandboxes is left on the host, and their records say what happened. A
// sandbox whose lifetime ends while no server runs is ended by its agent
// on time. Sandboxes' processes are the kernel's first OOM choice, the
// server's score is not raised.
func TestCrashRestart(t *testing.T) {
	s := newCrashServer(t)
	ctx := context.Background()
	s.start(1)
	c := s.client()
	s.poolReady()

	// Mid-execution: a sandbox running a cell with a child process, and
	// one (from the pool) with a short lifetime and a background job.
	long, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, short.ID, client.CommandRequest{Cmd: "sleep", Args: []string{"1000"}}); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	var once sync.Once
	go c.ExecuteStream(ctx, long.ID, client.ExecuteRequest{Timeout: 5 * time.Minute, Code: `
import subprocess, time
subprocess.Popen(["sleep", "1000"])
print("ready", flush=True)
time.sleep(1000)`}, client.ExecuteHandlers{OnStdout: func(string) { once.Do(func() { close(ready) }) }})
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("the long execution did not start")
	}
	before := s.bundles() // the two sandboxes and the pool's member
	if len(before) != 3 {
		t.Fatalf("runtime holds %v, want three sandboxes", before)
	}
	ps := map[string][]sandboxProc{}
	for _, id := range before {
		ps[id] = procs(id)
	}
	if len(ps[long.ID]) < 4 || len(ps[short.ID]) < 3 {
		t.Fatalf("processes: long %v, short %v", ps[long.ID], ps[short.ID])
	}
	for _, p := range ps[long.ID] {
		if score, _ := strconv.Atoi(oomScore(p.pid)); score < 500 {
			t.Errorf("sandbox process %d has oom_score_adj %d, want 500 or more", p.pid, score)
		}
	}
	if score := oomScore(s.cmd.Process.Pid); score != "0" {
		t.Errorf("the server's oom_score_adj is %s, want it left at 0", score)
	}

	// The execution's record is written beside it, off its path (the
	// server's executionRecord): a crash in the first moments of an
	// execution, before that write, leaves no record. Wait for it, as
	// that write is what this part of the test is about; on a loaded
	// host the output came first (CI, 7 Dec).
	eventually(t, 10*time.Second, "the long execution's record", func() bool {
		db, err := sqlite.Open(ctx, filepath.Join(s.dir, "sheepfold.db"))
		if err != nil {
			return false
		}
		defer db.Close()
		exs, err := db.ListExecutions(ctx, long.ID)
		return err == nil && len(exs) == 1
	})

	s.kill9()
	// While no server runs, the short sandbox ends at its deadline (its
	// agent keeps it); the long one lives on.
	eventually(t, time.Until(short.ExpiresAt)+10*time.Second, "the short sandbox's processes to end", func() bool {
		return !slices.ContainsFunc(ps[short.ID], sandboxProc.alive)
	})
	if time.Now().Before(short.ExpiresAt) {
		t.Fatalf("the short sandbox ended before its deadline %s", short.ExpiresAt)
	}
	if !slices.ContainsFunc(ps[long.ID], sandboxProc.alive) {
		t.Fatal("the long sandbox died with the server: the test proves nothing about restarts")
	}
	// One leftover cannot be destroyed at once.
	stuck := filepath.Join(s.dir, "run")
	m, _ := filepath.Glob(filepath.Join(stuck, "*", "sandboxes", long.ID, "config.json"))
	if len(m) != 1 {
		t.Fatalf("no bundle of %s", long.ID)
	}
	stuck = m[0]
	setImmutable(t, stuck, true)
	defer func() {
		if _, err := os.Stat(stuck); err == nil {
			setImmutable(t, stuck, false)
		}
	}()

	s.start(1)
	t.Logf("restart after kill -9 mid-execution answered after %s", s.upAfter)
	if s.upAfter > 10*time.Second {
		t.Errorf("restart took %s", s.upAfter)
	}
	for id, want := range map[string]string{long.ID: "server restarted", short.ID: "timed out"} {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil || sb.State != "stopped" || sb.StopReason != want {
			t.Errorf("record of %s: %+v %v, want stopped (%s)", id, sb, err, want)
		}
	}
	// The execution the crash cut is recorded as ended by the restart.
	db, err := sqlite.Open(ctx, filepath.Join(s.dir, "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	exs, err := db.ListExecutions(ctx, long.ID)
	db.Close()
	if err != nil || len(exs) != 1 || exs[0].Status != store.ExecutionError || exs[0].Error != "server restarted" {
		t.Errorf("executions of %s: %+v %v, want one ended with error \"server restarted\"", long.ID, exs, err)
	}
	// Everything of the stuck one but its bundle went at once; the bundle
	// is retried in the background and goes once it can.
	eventually(t, 10*time.Second, "the stuck sandbox's processes to end", func() bool {
		return !slices.ContainsFunc(ps[long.ID], sandboxProc.alive)
	})
	if !strings.Contains(s.log.String(), long.ID) {
		t.Error("the stuck leftover was not reported in the log")
	}
	setImmutable(t, stuck, false)
	eventually(t, 30*time.Second, "the stuck leftover to be destroyed in the background", func() bool {
		return !slices.Contains(s.bundles(), long.ID)
	})
	for _, id := range before {
		s.assertGone(t, id, ps[id])
	}

	// Mid-create: a create that misses the pool (other limits) is cut
	// by the kill once the runtime has begun it.
	s.poolReady()
	known := s.bundles()
	go c.CreateSandbox(ctx, client.CreateSandboxRequest{Resources: &client.Resources{MemoryMB: 256}})
	var creating string
	eventually(t, 30*time.Second, "the create to begin", func() bool {
		for _, id := range s.bundles() {
			if !slices.Contains(known, id) {
				creating = id
				return true
			}
		}
		return false
	})
	s.kill9()
	left := s.bundles()
	ps = map[string][]sandboxProc{}
	for _, id := range left {
		ps[id] = procs(id)
	}
	s.start(1)
	t.Logf("restart after kill -9 mid-create answered after %s", s.upAfter)
	if s.upAfter > 10*time.Second {
		t.Errorf("restart took %s", s.upAfter)
	}
	for _, id := range left {
		s.assertGone(t, id, ps[id])
	}
	all, err := c.ListSandboxes(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.State != "stopped" {
			t.Errorf("after the restart %s is %s", sb.ID, sb.State)
		}
		if sb.ID == creating {
			t.Errorf("the half-created sandbox has a record: %+v", sb)
		}
	}

	// Mid-destroy: the kill lands while the server tears a sandbox down.
	victim, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, victim.ID, client.CommandRequest{Cmd: "sleep", Args: []string{"1000"}}); err != nil {
		t.Fatal(err)
	}
	vps := procs(victim.ID)
	go c.Kill(ctx, victim.ID)
	// The sandbox's processes die first, its cgroups, mounts and bundle
	// go after: kill the server as soon as they die.
	for deadline := time.Now().Add(30 * time.Second); slices.ContainsFunc(vps, sandboxProc.alive); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the destroy did not begin")
		}
	}
	s.kill9()
	t.Logf("killed mid-destroy with the bundle still there: %v", slices.Contains(s.bundles(), victim.ID))
	left = s.bundles()
	ps = map[string][]sandboxProc{victim.ID: vps}
	for _, id := range left {
		ps[id] = procs(id)
	}
	s.start(1)
	t.Logf("restart after kill -9 mid-destroy answered after %s", s.upAfter)
	for _, id := range append(left, victim.ID) {
		s.assertGone(t, id, ps[id])
	}
	if sb, err := c.GetSandbox(ctx, victim.ID); err != nil || sb.State != "stopped" ||
		(sb.StopReason != "killed" && sb.StopReason != "server restarted") {
		t.Errorf("record of the killed sandbox: %+v %v", sb, err)
	}

	// With the server up, a lifetime that ends mid-execution gives the
	// client the same answer as the record.
	brief, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Execute(ctx, brief.ID, client.ExecuteRequest{Code: "import time; time.sleep(30)", Timeout: time.Minute})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "ERR_SANDBOX_TIMEOUT" {
		t.Errorf("execution cut by the lifetime: %v, want ERR_SANDBOX_TIMEOUT", err)
	}
	sb, err := c.GetSandbox(ctx, brief.ID)
	if err != nil || sb.StopReason != "timed out" {
		t.Errorf("record of the timed-out sandbox: %+v %v", sb, err)
	}
	if ce != nil && !strings.Contains(ce.Message, "timed out") {
		t.Errorf("client message %q does not say timed out", ce.Message)
	}
}

// TestRepeatedSIGTERM: a server told to stop twice, as timeout(1) does
// (it signals the whole process group) or a supervisor and a parent's
// Pdeathsig together, still destroys its sandboxes before it exits: the
// second SIGTERM ended it at once and left them running, with their
// mounts and cgroups (found after a `sheepfold bench` stopped by timeout).
func TestRepeatedSIGTERM(t *testing.T) {
	s := newCrashServer(t)
	s.start(1)
	s.poolReady()
	sb, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s.poolReady() // the next member
	ids := s.bundles()
	if len(ids) != 2 || !slices.Contains(ids, sb.ID) {
		t.Fatalf("runtime holds %v, want %s and the pool's member", ids, sb.ID)
	}
	ps := map[string][]sandboxProc{}
	for _, id := range ids {
		if ps[id] = procs(id); len(ps[id]) == 0 {
			t.Fatalf("sandbox %s: no processes", id)
		}
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(20 * time.Millisecond)
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		s.kill9()
		t.Fatal("the server did not stop")
	}
	s.cmd = nil
	for _, id := range ids {
		s.assertGone(t, id, ps[id])
	}
	if t.Failed() {
		s.start(0) // a start destroys what the last one left
		s.stop()
	}
}
