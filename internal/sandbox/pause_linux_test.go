package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// pauseEngine is a Manager on runc that keeps checkpoints (in a directory
// others may pass through, as a restore needs), with its events recorded;
// opts adjust its Config. It returns the cgroup path of its runtime's
// instance too.
func pauseEngine(t *testing.T, opts ...func(*sandbox.Config)) (*sandbox.Manager, string, *typeLog) {
	t.Helper()
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: pause is refused (TestGVisorSandbox)")
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	rt, noLeaks := runcRuntime(t)
	dir := testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	log := &typeLog{}
	cfg := sandbox.Config{
		Runtime: rt, CheckpointDir: filepath.Join(dir, "checkpoints"), Events: log,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil }),
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("close manager: %v", err)
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
		noLeaks()
		if left, _ := os.ReadDir(filepath.Join(dir, "checkpoints")); len(left) > 0 {
			t.Errorf("checkpoints left: %v", left)
		}
	})
	return m, rt.CgroupPath(), log
}

// typeLog records the types of the events it is sent, per sandbox.
type typeLog struct {
	mu    sync.Mutex
	types map[string][]events.Type
}

func (l *typeLog) Emit(e events.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.types == nil {
		l.types = map[string][]events.Type{}
	}
	l.types[e.SandboxID] = append(l.types[e.SandboxID], e.Type)
}

func (l *typeLog) count(id string, typ events.Type) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, t := range l.types[id] {
		if t == typ {
			n++
		}
	}
	return n
}

// sandboxCgroups lists the cgroup directories of sandbox id on the host.
func sandboxCgroups(cgroup, id string) []string {
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cgroup, id))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", cgroup, id)); err == nil {
		v1 = append(v1, filepath.Join("/sys/fs/cgroup", cgroup, id))
	}
	return v1
}

// isolationProbe prints what confines the sandbox's code: its id maps,
// seccomp and capabilities, and the errno of attacks seccomp refuses
// (a new user namespace, io_uring, ptrace of init).
const isolationProbe = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return 0 if rc == 0 else ctypes.get_errno()
status = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")}
params = ctypes.create_string_buffer(120)
print(open("/proc/self/uid_map").read().split(), open("/proc/self/gid_map").read().split(), os.getuid(),
      status["Seccomp"], status["NoNewPrivs"], status["CapEff"], status["CapBnd"],
      errno_of(libc.unshare(0x10000000)), errno_of(libc.syscall(425, 1, params)),
      errno_of(libc.ptrace(16, 1, None, None)))
`

// TestPauseResume pauses and resumes a sandbox ten times: its Python
// variables, a file written before the first pause and two background
// processes started by the commands API (an HTTP server and a loop that
// writes) are all there after each resume; while paused no process and
// no cgroup of it is left on the host; the isolation after the resumes
// (id maps, seccomp, capabilities, the attacks seccomp refuses) is the
// one before. Odd rounds resume explicitly, even rounds by an execution
// (E2B's auto-resume).
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	m, cgroup, log := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	run(t, s, "python", `
x = 0
blob = bytes(range(256)) * (1 << 16)  # 16 MiB the kernel holds
open("/home/user/before.txt", "w").write("written before")`)
	server, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: []string{"-m", "http.server", "8765", "--bind", "127.0.0.1"}, Cwd: "/home/user"})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "sh", Args: []string{"-c", "while true; do echo tick >> /tmp/ticks; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	const fetch = `
import time, urllib.request
for _ in range(200):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8765/before.txt").read().decode()); break
    except OSError:
        time.sleep(0.05)
`
	if got := stdout(run(t, s, "python", fetch)); got != "written before\n" {
		t.Fatalf("the background server answers %q before the pause", got)
	}
	isolation := stdout(run(t, s, "python", isolationProbe))
	if f := strings.Fields(isolation); !strings.Contains(isolation, " 1000 2 1 0000000000000000 0000000000000000 ") ||
		len(f) < 3 || f[len(f)-3] == "0" || f[len(f)-2] == "0" || f[len(f)-1] == "0" {
		t.Fatalf("the probe does not see a confined sandbox before the pause (every attack refused): %s", isolation)
	}
	t.Logf("isolation: %s", strings.TrimSpace(isolation))
	initial := sandboxCgroups(cgroup, s.ID)
	if len(initial) == 0 {
		t.Fatalf("no cgroup of the sandbox under %s", cgroup)
	}
	// A stream following the loop's output does not hold the first
	// pause back: the pause cuts it (ERR_SANDBOX_STATE), the loop runs on.
	following := make(chan struct{})
	followed := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := s.Connect(ctx, loop, func(agentproto.Event) { once.Do(func() { close(following) }) })
		followed <- err
	}()
	<-following

	var pauses, resumes []time.Duration
	for round := 1; round <= 10; round++ {
		ticks := lineCount(t, s, "/tmp/ticks")
		began := time.Now()
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		pauses = append(pauses, time.Since(began))
		if st := s.State(); st != sandbox.StatePaused {
			t.Fatalf("round %d: state %s after the pause", round, st)
		}
		if round == 1 {
			if err := <-followed; apierr.CodeOf(err) != apierr.SandboxState {
				t.Fatalf("the stream following the loop ended with %v, want ERR_SANDBOX_STATE (cut by the pause)", err)
			}
		}
		// Nothing of it runs or holds memory: its cgroups are gone
		// (a cgroup cannot go while a process is in it).
		if left := sandboxCgroups(cgroup, s.ID); len(left) > 0 {
			t.Fatalf("round %d: cgroups of the paused sandbox: %v", round, left)
		}
		if _, err := s.Usage(ctx); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("round %d: usage of a paused sandbox: %v, want none (ErrNotFound)", round, err)
		}
		if err := s.Pause(ctx); err != nil {
			t.Errorf("round %d: a second pause: %v", round, err)
		}
		began = time.Now()
		var got string
		if round%2 == 1 {
			if err := s.Resume(ctx); err != nil {
				t.Fatalf("round %d: resume: %v", round, err)
			}
			resumes = append(resumes, time.Since(began))
			got = stdout(run(t, s, "python", "x += 1\nprint(x, len(blob))"))
		} else {
			got = stdout(run(t, s, "python", "x += 1\nprint(x, len(blob))")) // resumes it
		}
		if want := strconv.Itoa(round) + " 16777216\n"; got != want {
			t.Fatalf("round %d: the kernel says %q after the resume, want %q", round, got, want)
		}
		if st := s.State(); st != sandbox.StateRunning {
			t.Fatalf("round %d: state %s after the resume", round, st)
		}
		if got := stdout(run(t, s, "python", fetch)); got != "written before\n" {
			t.Fatalf("round %d: the background server answers %q after the resume", round, got)
		}
		// The loop writes on: its file grows past what it held before.
		for deadline := time.Now().Add(10 * time.Second); lineCount(t, s, "/tmp/ticks") <= ticks; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the background loop wrote nothing after the resume", round)
			}
		}
		procs, err := s.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		alive := map[int]bool{}
		for _, p := range procs {
			alive[p.PID] = true
		}
		if !alive[server] || !alive[loop] {
			t.Fatalf("round %d: background processes %d and %d not both listed after the resume: %+v", round, server, loop, procs)
		}
	}
	if got := stdout(run(t, s, "python", isolationProbe)); got != isolation {
		t.Errorf("isolation after ten resumes:\n%s\nbefore:\n%s", got, isolation)
	}
	if p, r := log.count(s.ID, events.SandboxPaused), log.count(s.ID, events.SandboxResumed); p != 10 || r != 10 {
		t.Errorf("%d sandbox.paused and %d sandbox.resumed events, want 10 of each", p, r)
	}
	t.Logf("pause %v, resume %v (16 MiB held, a server and a loop running)", pauses, resumes)
	// A paused sandbox is killed as a running one is (the cleanup checks
	// that nothing of it is left, its checkpoint included).
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPauseOutlivesAgentDeadline: the agent's own deadline runs on while
// the sandbox is frozen for its dump and from its restore until the
// resume's ping (the time namespace CRIU restores it in hides only the
// time it was paused); a pause whose dump and restore take longer than
// the agent had left (a sandbox paused at its lifetime's end on a busy
// host) must not find it ended by its agent at the restore. Its agent
// is left with the time it had left again after the resume.
func TestPauseOutlivesAgentDeadline(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	run(t, s, "python", "x = 41 + 1")
	// The agent's deadline as a slow pause would find it: close at hand.
	if err := sandbox.SetAgentLifetime(ctx, s, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // paused: no time of the agent's passes
	if got := stdout(run(t, s, "python", "print(x)")); strings.TrimSpace(got) != "42" {
		t.Fatalf("after the resume x printed %q", got)
	}
	left, err := sandbox.AgentLifetimeLeft(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if engine := time.Until(s.Deadline()); left > engine+sandbox.LifetimeGrace || left < engine {
		t.Errorf("the agent has %v left after the resume, the engine %v: want the engine's and its grace", left, engine)
	}
}

// TestPauseRefusedWhileBusy: a sandbox running an execution is not
// paused (ERR_SANDBOX_STATE) and runs on; once the execution ends it is.
func TestPauseRefusedWhileBusy(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := s.Execute(ctx, sandbox.ExecuteRequest{Language: "python", Code: `
import os, time
print("started", flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.02)
y = 7`}, func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventStdout {
				once.Do(func() { close(started) })
			}
			return nil
		})
		done <- err
	}()
	<-started
	err := s.Pause(ctx)
	if apierr.CodeOf(err) != apierr.SandboxState {
		t.Fatalf("pause during an execution: %v, want ERR_SANDBOX_STATE", err)
	}
	if st := s.State(); st != sandbox.StateRunning {
		t.Fatalf("state %s after a refused pause", st)
	}
	if _, err := s.WriteFile(ctx, "/tmp/go", strings.NewReader(""), 0o644, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the execution: %v", err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatalf("pause after the execution: %v", err)
	}
	if got := stdout(run(t, s, "python", "print(y)")); got != "7\n" {
		t.Fatalf("after the resume y is %q", got)
	}
}

// stdout is what an execution printed.
func stdout(ex *sandbox.Execution) string {
	return ex.Stdout
}

// lineCount counts the lines of a file in the sandbox (0 if missing).
func lineCount(t *testing.T, s *sandbox.Sandbox, path string) int {
	t.Helper()
	var b strings.Builder
	if _, err := s.ReadFile(context.Background(), path, &b, 1<<20); err != nil {
		if apierr.CodeOf(err) == apierr.NotFound {
			return 0
		}
		t.Fatal(err)
	}
	return strings.Count(b.String(), "\n")
}

// TestKillWhilePausing: a kill that comes while the sandbox is being
// checkpointed (or restored) stops it, and nothing of it is left (the
// cleanup checks mounts, cgroups, state and checkpoints).
func TestKillWhilePausing(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	for _, resume := range []bool{false, true} {
		s := newSandbox(t, m, sandbox.CreateOptions{})
		run(t, s, "python", "x = 1")
		if resume {
			if err := s.Pause(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The kill comes from the Pausing or Resumed hook: as the
		// checkpoint begins, or just after the restore.
		killed := make(chan error, 1)
		kill := func(sb *sandbox.Sandbox) {
			go func() { killed <- m.Kill(ctx, sb.ID) }()
			for deadline := time.Now().Add(5 * time.Second); sb.State() != sandbox.StateStopping && sb.State() != sandbox.StateStopped; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Error("the kill did not begin")
					return
				}
			}
		}
		if resume {
			m.SetHooks(sandbox.Hooks{Resumed: kill})
		} else {
			m.SetHooks(sandbox.Hooks{Pausing: kill})
		}
		var err error
		if resume {
			err = s.Resume(ctx)
		} else {
			err = s.Pause(ctx)
		}
		m.SetHooks(sandbox.Hooks{})
		if kerr := <-killed; kerr != nil {
			t.Fatalf("kill: %v", kerr)
		}
		t.Logf("resume %v: %v", resume, err)
		if st := s.State(); st != sandbox.StateStopped {
			t.Fatalf("state %s after the kill", st)
		}
	}
}

// TestPausedSandboxAfterRestart: a paused sandbox survives its engine's
// end, closed ("close") or dropped as a crash leaves it ("crash": the
// Manager is never closed, only the runtime's lock goes, as with the
// process): the next engine over the same runtime instance and checkpoint
// directory lists it paused, with its metadata and lifetime, and resumes
// it with its Python variable, its file and its background process. One
// whose checkpoint is broken ("broken": CRIU's images gone) is destroyed
// at the start, said why in Lost, and nothing of it is left.
func TestPausedSandboxAfterRestart(t *testing.T) {
	for _, end := range []string{"close", "crash", "broken"} {
		t.Run(end, func(t *testing.T) { testPausedAfterRestart(t, end) })
	}
}

func testPausedAfterRestart(t *testing.T, end string) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs, rcfg, rt, state, cgroup, dir := restartRig(t)
	cfg := sandbox.Config{Runtime: rt, CheckpointDir: filepath.Join(dir, "checkpoints"), KeepPaused: true,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}
	first, err := sandbox.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := first.Create(ctx, sandbox.CreateOptions{Timeout: 10 * time.Minute, Metadata: map[string]string{"kept": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s, "python", `
x = 41
open("/home/user/before.txt", "w").write("written before")`)
	const hostUID = "print(open('/proc/self/uid_map').read().split()[1])"
	uid := stdout(run(t, s, "python", hostUID))
	loop, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "sh", Args: []string{"-c", "while true; do echo tick >> /tmp/ticks; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); lineCount(t, s, "/tmp/ticks") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background loop writes nothing")
		}
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	switch end {
	case "close", "broken":
		if err := first.Close(ctx); err != nil {
			t.Fatalf("close the first engine: %v", err)
		}
	case "crash":
		// first is never closed
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("close the first runtime: %v", err)
	}
	if end == "broken" {
		if err := os.Remove(filepath.Join(cfg.CheckpointDir, s.ID, "inventory.img")); err != nil {
			t.Fatal(err)
		}
	}

	// The next engine, on the same runtime instance.
	m, rt2 := nextEngine(t, rcfg, cfg, state, cgroup, func() {
		if left, _ := os.ReadDir(cfg.CheckpointDir); len(left) != 0 {
			t.Errorf("checkpoints left: %v", left)
		}
	})
	if end == "broken" {
		if _, err := m.Get(s.ID); err == nil {
			t.Error("a sandbox whose checkpoint is broken was taken back")
		}
		if why := m.Lost()[s.ID]; why != "its checkpoint is missing or incomplete" {
			t.Errorf("Lost says %q of the broken sandbox, want why", why)
		}
		if ids, _ := rt2.List(ctx); len(ids) != 0 {
			t.Errorf("the runtime still holds %v", ids)
		}
		return
	}
	back, err := m.Get(s.ID)
	if err != nil {
		t.Fatalf("the paused sandbox is not there after the restart: %v (lost: %v)", err, m.Lost())
	}
	defer m.Kill(ctx, s.ID)
	info := back.Info()
	if info.State != sandbox.StatePaused || info.Metadata["kept"] != "yes" {
		t.Fatalf("after the restart: %+v, want paused with its metadata", info)
	}
	if left := time.Until(info.Deadline); left < 9*time.Minute || left > 10*time.Minute {
		t.Errorf("lifetime left after the restart: %v, want what it had at the pause (under 10 min)", left)
	}
	// Its host id range stays its own while it is paused: a new sandbox
	// gets another.
	if other := stdout(run(t, newSandbox(t, m, sandbox.CreateOptions{}), "python", hostUID)); other == uid {
		t.Errorf("a new sandbox got the paused one's host ids (%s)", strings.TrimSpace(uid))
	}
	if err := back.Resume(ctx); err != nil {
		t.Fatalf("resume after the restart: %v", err)
	}
	if got := stdout(run(t, back, "python", hostUID)); got != uid {
		t.Errorf("host uid after the restart and resume: %s, before: %s", got, uid)
	}
	if got := stdout(run(t, back, "python", "x += 1\nprint(x, open('/home/user/before.txt').read())")); got != "42 written before\n" {
		t.Fatalf("after the restart and resume the kernel says %q", got)
	}
	ticks := lineCount(t, back, "/tmp/ticks")
	for deadline := time.Now().Add(10 * time.Second); lineCount(t, back, "/tmp/ticks") <= ticks; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background loop wrote nothing after the restart and resume")
		}
	}
	procs, err := back.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || p.PID == loop
	}
	if !found {
		t.Errorf("background process %d not listed after the restart and resume: %+v", loop, procs)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPauseFailureRunsOn: a checkpoint that fails (here: its directory
// is under one the sandbox's host uid cannot pass through, which the
// runtime refuses) leaves the sandbox running as it was: ERR_INTERNAL,
// its variables, a new agent connection and its lifetime.
func TestPauseFailureRunsOn(t *testing.T) {
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: pause is refused (TestGVisorSandbox)")
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	rt, noLeaks := runcRuntime(t)
	dir := testutil.ShortTempDir(t)
	if err := os.Mkdir(filepath.Join(dir, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.New(ctx, sandbox.Config{Runtime: rt, CheckpointDir: filepath.Join(dir, "private", "checkpoints"),
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(ctx); err != nil {
			t.Error(err)
		}
		rt.Close()
		noLeaks()
	})
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "x = 3")
	deadline := s.Deadline()
	if err := s.Pause(ctx); apierr.CodeOf(err) != apierr.Internal {
		t.Fatalf("pause into an unreachable directory: %v, want ERR_INTERNAL", err)
	}
	if st := s.State(); st != sandbox.StateRunning {
		t.Fatalf("state %s after a failed pause", st)
	}
	if got := mainText(run(t, s, "python", "x * 2")); got != "6" {
		t.Fatalf("after the failed pause x * 2 is %q", got)
	}
	if d := s.Deadline(); d.Before(deadline.Add(-time.Second)) || d.After(deadline.Add(time.Second)) {
		t.Errorf("the deadline moved from %v to %v", deadline, d)
	}
}

// freezerState reads the freezer state of sandbox id's cgroup: FROZEN or
// THAWED (v1 freezer.state; v2 cgroup.freeze 1 or 0).
func freezerState(t *testing.T, cgroup, id string) string {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", cgroup, id, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cgroup, id, "cgroup.freeze"))
	if err != nil {
		t.Fatalf("no freezer of the sandbox: %v", err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return "FROZEN"
	}
	return "THAWED"
}

// TestFreezeResume: Freeze stops the sandbox's processes in their cgroup
// (the freezer says FROZEN), keeps their memory charged to it, and a
// request resumes it quickly with its variables and its background loop
// going on; a frozen sandbox is killed as a running one is.
func TestFreezeResume(t *testing.T) {
	ctx := context.Background()
	m, cgroup, log := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "x = 20\nblob = bytes(range(256)) * (1 << 16)")
	if _, err := s.Start(ctx, sandbox.ProcessSpec{Cmd: "sh", Args: []string{"-c", "while true; do echo tick >> /tmp/ticks; sleep 0.05; done"}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); lineCount(t, s, "/tmp/ticks") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the loop does not write")
		}
	}
	var freezes, thaws []time.Duration
	for round := 1; round <= 3; round++ {
		ticks := lineCount(t, s, "/tmp/ticks")
		began := time.Now()
		if err := s.Freeze(ctx); err != nil {
			t.Fatalf("round %d: freeze: %v", round, err)
		}
		freezes = append(freezes, time.Since(began))
		if st := s.State(); st != sandbox.StatePaused {
			t.Fatalf("round %d: state %s after the freeze", round, st)
		}
		if fs := freezerState(t, cgroup, s.ID); fs != "FROZEN" {
			t.Fatalf("round %d: the sandbox's freezer is %s", round, fs)
		}
		if u, err := s.Usage(ctx); err != nil || u.MemoryBytes < 16<<20 {
			t.Fatalf("round %d: a frozen sandbox's usage %+v %v: want its memory still charged", round, u, err)
		}
		began = time.Now()
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		thaws = append(thaws, time.Since(began))
		if fs := freezerState(t, cgroup, s.ID); fs != "THAWED" {
			t.Fatalf("round %d: the sandbox's freezer is %s after the resume", round, fs)
		}
		if got := mainText(run(t, s, "python", "x += 1\nx, len(blob)")); got != fmt.Sprintf("(%d, 16777216)", 20+round) {
			t.Fatalf("round %d: after the resume the kernel says %q", round, got)
		}
		for deadline := time.Now().Add(10 * time.Second); lineCount(t, s, "/tmp/ticks") <= ticks; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the loop wrote nothing after the resume", round)
			}
		}
	}
	if p, r := log.count(s.ID, events.SandboxPaused), log.count(s.ID, events.SandboxResumed); p != 3 || r != 3 {
		t.Errorf("%d sandbox.paused and %d sandbox.resumed events, want 3 of each", p, r)
	}
	t.Logf("freeze %v, thaw %v", freezes, thaws)
	// An execution resumes a frozen sandbox too; then a frozen one is
	// killed (the cleanup checks nothing is left).
	if err := s.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mainText(run(t, s, "python", "x")); got != "23" {
		t.Fatalf("an execution after a freeze says %q", got)
	}
	if err := s.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}
