package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// startProcAgent serves an agent whose Home is a real temporary directory
// (processes are not confined to Root).
func startProcAgent(t *testing.T) *testAgent {
	t.Helper()
	return startAgent(t, Config{Root: "/", Home: t.TempDir(), Env: []string{"BASE=1", "PATH=/usr/bin:/bin"}})
}

func sh(script string) *agentproto.ProcessSpec {
	return &agentproto.ProcessSpec{Cmd: "sh", Args: []string{"-c", script}}
}

func TestProcessStreaming(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(
		`echo out1; echo err1 >&2; echo out2; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 3`)}).mustOK(t)
	if len(r.events) == 0 || r.events[0].Type != agentproto.EventStart || r.events[0].PID <= 1 {
		t.Fatalf("first event %+v", r.events)
	}
	if got := r.output(agentproto.EventStdout); got != "out1\nout2\n" {
		t.Errorf("stdout %q", got)
	}
	if got := r.output(agentproto.EventStderr); got != "err1\n" {
		t.Errorf("stderr %q", got)
	}
	d := r.done
	if d.ExitCode == nil || *d.ExitCode != 3 || d.Signal != 0 || d.Status != "" || d.Truncated {
		t.Errorf("done %+v", d)
	}
	if d.Stats == nil || d.Stats.DurationMS <= 0 || d.Stats.CPUTimeMS <= 0 || d.Stats.PeakMemoryBytes < 1<<10 {
		t.Errorf("stats %+v", d.Stats)
	}
}

func TestProcessEnvCwdPath(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	home := a.cfg.Home
	bin := filepath.Join(home, "bin")
	os.MkdirAll(filepath.Join(home, "sub"), 0o755)
	os.MkdirAll(bin, 0o755)
	if err := os.WriteFile(filepath.Join(bin, "mytool"), []byte("#!/bin/sh\necho \"tool $FOO $BASE $(pwd)\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// mytool is found only through the PATH of the request's environment.
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "mytool", Cwd: "sub", Env: map[string]string{"FOO": "bar", "PATH": bin + ":/usr/bin:/bin"},
	}}).mustOK(t)
	if got, want := r.output(agentproto.EventStdout), "tool bar 1 "+filepath.Join(home, "sub")+"\n"; got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
	// a relative command with a slash runs from the working directory
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "./bin/mytool"}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "tool  1 "+home+"\n" {
		t.Fatalf("stdout %q", got)
	}
	// stdin is /dev/null unless asked for
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "cat"}}).mustOK(t)
	if *r.done.ExitCode != 0 || r.output(agentproto.EventStdout) != "" {
		t.Fatalf("cat </dev/null: %+v", r.done)
	}

	os.WriteFile(filepath.Join(home, "noexec"), []byte("#!/bin/sh\n"), 0o644)
	errs := []struct {
		name string
		spec *agentproto.ProcessSpec
		code string
	}{
		{"command not in PATH", &agentproto.ProcessSpec{Cmd: "mytool"}, agentproto.CodeNotFound},
		{"missing file", &agentproto.ProcessSpec{Cmd: "/nonexistent/tool"}, agentproto.CodeNotFound},
		{"not executable", &agentproto.ProcessSpec{Cmd: "./noexec"}, agentproto.CodePermission},
		{"missing cwd", &agentproto.ProcessSpec{Cmd: "true", Cwd: "/nonexistent"}, agentproto.CodeBadRequest},
		{"cwd is a file", &agentproto.ProcessSpec{Cmd: "true", Cwd: "noexec"}, agentproto.CodeBadRequest},
	}
	for _, e := range errs {
		r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: e.spec})
		if r.done.Code != e.code || len(r.events) != 0 {
			t.Errorf("%s: done %+v, events %d, want %s", e.name, r.done, len(r.events), e.code)
		}
	}
}

func TestProcessStdin(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "cat", Stdin: true}})
	start := s.next()
	if start.Type != agentproto.EventStart {
		t.Fatalf("first event %+v", start)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: start.PID, Data: []byte("hello\n")}).mustOK(t)
	if ev := s.next(); ev.Type != agentproto.EventStdout || string(ev.Data) != "hello\n" {
		t.Fatalf("echo %+v", ev)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: start.PID, Data: []byte("bye"), EOF: true}).mustOK(t)
	done, out := s.until(agentproto.EventDone)
	if out != "bye" || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Fatalf("after EOF: out %q, done %+v", out, done)
	}
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: start.PID, Data: []byte("x")}); r.done.Code == "" {
		t.Fatalf("input after EOF accepted: %+v", r.done)
	}

	// a process without stdin refuses input
	s = a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"30"}}})
	pid := s.next().PID
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: []byte("x")}); r.done.Code != agentproto.CodeBadRequest {
		t.Fatalf("input without stdin: %+v", r.done)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessSignal, PID: pid, Signal: 9}).mustOK(t)
	s.until(agentproto.EventDone)
}

// TestProcessPTY: a process on a terminal of its own: it is a tty of the
// size asked for, output comes as pty events, input is typed (and echoed),
// the size changes, and closing its input is refused.
func TestProcessPTY(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sh",
		PTY: &agentproto.TermSize{Cols: 77, Rows: 11}}})
	pid := s.next().PID
	var out strings.Builder
	read := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			ev := s.next()
			if ev.Type != agentproto.EventPTY {
				t.Fatalf("event %+v while waiting for %q in %q", ev, want, out.String())
			}
			out.Write(ev.Data)
		}
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: []byte("test -t 0 && stty size && echo tty-$((2*3))\n")}).mustOK(t)
	read("tty-6")
	if !strings.Contains(out.String(), "11 77") || !strings.Contains(out.String(), "echo tty-$((2*3))") {
		t.Fatalf("terminal output %q: want its size and the echoed input", out.String())
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessResize, PID: pid, Size: &agentproto.TermSize{Cols: 120, Rows: 40}}).mustOK(t)
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: []byte("stty size\n")}).mustOK(t)
	read("40 120")
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, EOF: true}); r.done.Code != agentproto.CodeBadRequest {
		t.Errorf("closing a terminal's stdin: %+v", r.done)
	}
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessResize, PID: pid, Size: &agentproto.TermSize{}}); r.done.Code != agentproto.CodeBadRequest {
		t.Errorf("a 0x0 terminal: %+v", r.done)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: []byte("exit 4\n")}).mustOK(t)
	for {
		ev := s.next()
		if ev.Type == agentproto.EventDone {
			if ev.ExitCode == nil || *ev.ExitCode != 4 {
				t.Fatalf("done %+v", ev)
			}
			break
		}
	}
	// a process without a terminal cannot be resized
	p := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"30"}}})
	pid = p.next().PID
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessResize, PID: pid, Size: &agentproto.TermSize{Cols: 1, Rows: 1}}); r.done.Code != agentproto.CodeBadRequest {
		t.Errorf("resizing a process without a terminal: %+v", r.done)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessSignal, PID: pid, Signal: 9}).mustOK(t)
	p.until(agentproto.EventDone)
}

// TestProcessSignalGroup: a signal reaches the whole process group, so a
// shell's children die with it.
func TestProcessSignalGroup(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`sleep 30 & echo child $!; wait`)})
	pid := s.next().PID
	ev, _ := s.until(agentproto.EventStdout)
	child, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(ev.Data), "child ")))
	if err != nil {
		t.Fatalf("child pid from %q: %v", ev.Data, err)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpProcessSignal, PID: pid, Signal: int(unix.SIGTERM)}).mustOK(t)
	done, _ := s.until(agentproto.EventDone)
	if done.Signal != int(unix.SIGTERM) || done.ExitCode != nil {
		t.Fatalf("done %+v", done)
	}
	waitGone(t, child)
	if r := a.call(t, agentproto.Request{Op: agentproto.OpProcessSignal, PID: pid, Signal: 9}); r.done.Code != agentproto.CodeNotFound {
		t.Fatalf("signal after exit: %+v", r.done)
	}
}

// waitGone waits until pid no longer runs (gone or a zombie of someone
// else's).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d still runs", pid)
}

func TestProcessTimeout(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	start := time.Now()
	spec := sh(`sleep 30; echo never`)
	spec.TimeoutMS = 300
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: spec}).mustOK(t)
	if d := r.done; d.Status != agentproto.StatusTimeout || d.Signal != int(unix.SIGKILL) || d.ExitCode != nil {
		t.Fatalf("done %+v", d)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 5*time.Second {
		t.Fatalf("took %v", el)
	}
	// a process that ends in time is not marked
	spec = &agentproto.ProcessSpec{Cmd: "true", TimeoutMS: 10000}
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: spec}).mustOK(t)
	if r.done.Status != "" || *r.done.ExitCode != 0 {
		t.Fatalf("done %+v", r.done)
	}
}

func TestProcessOutputCap(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	spec := &agentproto.ProcessSpec{Cmd: "yes", Args: []string{"0123456789"}, MaxOutputBytes: 100000}
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: spec}).mustOK(t)
	if got := len(r.output(agentproto.EventStdout)); got != 100000 {
		t.Fatalf("%d bytes of output, want exactly the cap", got)
	}
	if d := r.done; !d.Truncated || d.Status != agentproto.StatusOutputLimit || d.Signal != int(unix.SIGKILL) {
		t.Fatalf("done %+v", d)
	}
}

// TestProcessBackground: a process outlives the connection that started
// it, is listed, and process.connect re-attaches: output from then on, then
// Done. After the exit, connect still gets the Done for a while.
func TestProcessBackground(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	spec := sh(`echo first; read x </dev/null; i=0; while [ $i -lt 15 ]; do sleep 0.1; echo tick; i=$((i+1)); done; exit 5`)
	spec.Tag = "bg"
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: spec})
	pid := s.next().PID
	// a loaded host may deliver a tick in the same read as "first"
	if ev := s.next(); !strings.HasPrefix(string(ev.Data), "first\n") {
		t.Fatalf("first output %q", ev.Data)
	}
	s.nc.Close() // the client goes away; the process must not

	other := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"30"}, Tag: "other"}})
	otherPID := other.next().PID

	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessList}).mustOK(t)
	var tags []string
	for _, p := range r.done.Processes {
		tags = append(tags, p.Tag)
		if p.Tag == "bg" && (p.PID != pid || p.Cmd != "sh" || len(p.Args) != 2 || p.Cwd != a.cfg.Home || p.Started.IsZero()) {
			t.Errorf("listed %+v", p)
		}
	}
	if strings.Join(tags, ",") != "bg,other" && strings.Join(tags, ",") != "other,bg" {
		t.Fatalf("listed tags %v", tags)
	}
	if pid > otherPID && tags[0] != "other" || pid < otherPID && tags[0] != "bg" {
		t.Fatalf("list not sorted by pid: %+v", r.done.Processes)
	}

	c := a.open(t, agentproto.Request{Op: agentproto.OpProcessConnect, PID: pid})
	if ev := c.next(); ev.Type != agentproto.EventStart || ev.PID != pid {
		t.Fatalf("connect: first event %+v", ev)
	}
	done, out := c.until(agentproto.EventDone)
	if strings.Contains(out, "first") || !strings.Contains(out, "tick\n") {
		t.Fatalf("re-attached output %q", out)
	}
	if done.ExitCode == nil || *done.ExitCode != 5 {
		t.Fatalf("done %+v", done)
	}

	// exited: no longer listed, but its Done is retained
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessList}).mustOK(t)
	if len(r.done.Processes) != 1 || r.done.Processes[0].PID != otherPID {
		t.Fatalf("after exit, listed %+v", r.done.Processes)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessConnect, PID: pid}).mustOK(t)
	if len(r.events) != 1 || r.events[0].Type != agentproto.EventStart || *r.done.ExitCode != 5 {
		t.Fatalf("connect after exit: %+v %+v", r.events, r.done)
	}

	a.call(t, agentproto.Request{Op: agentproto.OpProcessSignal, PID: otherPID, Signal: 9}).mustOK(t)
	other.until(agentproto.EventDone)

	for _, op := range []string{agentproto.OpProcessConnect, agentproto.OpProcessInput, agentproto.OpProcessSignal} {
		if r := a.call(t, agentproto.Request{Op: op, PID: 1 << 30, Signal: 9}); r.done.Code != agentproto.CodeNotFound {
			t.Errorf("%s of an unknown pid: %+v", op, r.done)
		}
	}
}

// TestProcessTwoSubscribers: every subscriber gets the same output; the
// output cap belongs to the connection that set it.
func TestProcessTwoSubscribers(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "cat", Stdin: true}})
	pid := s.next().PID
	c := a.open(t, agentproto.Request{Op: agentproto.OpProcessConnect, PID: pid})
	c.next() // start: subscribed from now on
	a.call(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: []byte("shared"), EOF: true}).mustOK(t)
	d1, o1 := s.until(agentproto.EventDone)
	d2, o2 := c.until(agentproto.EventDone)
	if o1 != "shared" || o2 != "shared" || *d1.ExitCode != 0 || *d2.ExitCode != 0 {
		t.Fatalf("outputs %q %q, dones %+v %+v", o1, o2, d1, d2)
	}
}

// TestProcessSlowSubscriber: a client that does not read cannot block the
// process; it loses output past the lag bound and gets a truncated Done
// with the real exit status.
func TestProcessSlowSubscriber(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	const total = 40 << 20
	s := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "head", Args: []string{"-c", strconv.Itoa(total), "/dev/zero"},
	}})
	// Do not read until the process has exited.
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := a.call(t, agentproto.Request{Op: agentproto.OpProcessList}).mustOK(t)
		if len(r.done.Processes) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process was blocked by a client that does not read")
		}
		time.Sleep(50 * time.Millisecond)
	}
	done, out := s.until(agentproto.EventDone)
	if len(out) >= total || len(out) < maxLag/2 || !done.Truncated || done.ExitCode == nil || *done.ExitCode != 0 || done.Message == "" {
		t.Fatalf("got %d bytes, done %+v", len(out), done)
	}
}

// TestProcessLeftoverChildHoldsPipe: a background child that keeps the
// output pipe open delays Done only by the drain grace.
func TestProcessLeftoverChildHoldsPipe(t *testing.T) {
	t.Parallel()
	a := startProcAgent(t)
	start := time.Now()
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`sleep 3 & echo $!`)}).mustOK(t)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Done took %v", el)
	}
	if *r.done.ExitCode != 0 {
		t.Fatalf("done %+v", r.done)
	}
}

// TestTemplateUserWorkDir: a template's WORKDIR is where a process or a
// context naming no working directory starts, its USER the user a request
// naming none acts as; a request's own cwd and user win, and relative
// paths still start from the home.
func TestTemplateUserWorkDir(t *testing.T) {
	t.Parallel()
	home, work := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(home, "sub"), 0o755)
	a := startAgent(t, Config{Root: "/", Home: home, WorkDir: work, User: "root", Env: []string{"PATH=/usr/bin:/bin"}})
	pwd := func(p *agentproto.ProcessSpec) string {
		t.Helper()
		return strings.TrimSpace(a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: p}).mustOK(t).output(agentproto.EventStdout))
	}
	if got := pwd(&agentproto.ProcessSpec{Cmd: "pwd"}); got != work {
		t.Errorf("no cwd: in %q, want the WORKDIR %q", got, work)
	}
	if got := pwd(&agentproto.ProcessSpec{Cmd: "pwd", Cwd: "sub"}); got != filepath.Join(home, "sub") {
		t.Errorf("relative cwd: in %q, want it under the home", got)
	}
	if got := pwd(&agentproto.ProcessSpec{Cmd: "pwd", Cwd: "/"}); got != "/" {
		t.Errorf("explicit cwd: in %q", got)
	}
	var s *server
	select {
	case s = <-a.srv:
		a.srv <- s
	case <-time.After(10 * time.Second):
		t.Fatal("no server")
	}
	id, bad := s.user("", s.passwd)
	if bad != nil || id.name != agentproto.UserRoot || id.uid != 0 {
		t.Errorf("no user: %+v %v, want the template's root", id, bad)
	}
	id, bad = s.user(agentproto.UserDefault, s.passwd)
	if bad != nil || id.uid != defaultUID {
		t.Errorf("explicit user: %+v %v, want uid %d", id, bad, defaultUID)
	}
	if got := s.contextCwd(""); got != work {
		t.Errorf("context with no cwd starts in %q, want %q", got, work)
	}
	if got := s.contextCwd("sub"); got != filepath.Join(home, "sub") {
		t.Errorf("context with a relative cwd starts in %q", got)
	}

	// Without them, the defaults are the home and "user".
	b := startProcAgent(t)
	if got := strings.TrimSpace(b.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "pwd"}}).mustOK(t).output(agentproto.EventStdout)); got != b.cfg.Home {
		t.Errorf("default cwd %q, want the home %q", got, b.cfg.Home)
	}
	for _, c := range []Config{{WorkDir: "rel"}, {User: "a:b"}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
