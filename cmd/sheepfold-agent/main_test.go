//go:build linux

package main

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/agenttls"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// agentProc is a running "sheepfold-agent init".
type agentProc struct {
	cmd  *exec.Cmd
	sock string
	exit chan error
}

// startInit runs the agent binary's init with a Root in a temporary
// directory, and serve's extra flags. With viaFD it passes a listening
// socket as fd 3, as runc does; otherwise init is told to --listen.
func startInit(t *testing.T, viaFD bool, extra ...string) *agentProc {
	t.Helper()

	bin := testutil.AgentBin(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testutil.ShortTempDir(t), "agent.sock")
	args := append([]string{"init", "--root", root, "--home", "/home/user"}, extra...)
	var lnFile *os.File
	if viaFD {
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		ul := ln.(*net.UnixListener)
		ul.SetUnlinkOnClose(false)
		lnFile, err = ul.File()
		if err != nil {
			t.Fatal(err)
		}
		ln.Close() // the dup in lnFile keeps the socket listening
	} else {
		args = append(args, "--listen", sock)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	if lnFile != nil {
		cmd.ExtraFiles = []*os.File{lnFile}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if lnFile != nil {
		lnFile.Close()
	}
	a := &agentProc{cmd: cmd, sock: sock, exit: make(chan error, 1)}
	go func() { a.exit <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-a.exit
		a.exit <- nil
	})
	return a
}

// call performs one request, retrying the dial until the agent listens.
func (a *agentProc) call(t *testing.T, req agentproto.Request) agentproto.Event {
	t.Helper()
	var c net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("unix", a.sock); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("dial agent: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	done, err := agentproto.Call(c, req, nil, agentproto.Handlers{})
	if err != nil {
		t.Fatalf("%s: %v", req.Op, err)
	}
	return done
}

// waitExit returns init's exit code.
func (a *agentProc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case err := <-a.exit:
		a.exit <- err
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("init did not exit")
	}
	return -1
}

// children lists the child pids of pid (of all its threads: a Go
// program forks from any of them).
func children(pid int) []int {
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, name := range files {
		b, _ := os.ReadFile(name)
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
	}
	return out
}

func state(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// TestInitOverFD3 is the production path: the listener arrives as fd 3.
func TestInitOverFD3(t *testing.T) {
	t.Parallel()
	a := startInit(t, true)
	done := a.call(t, agentproto.Request{Op: agentproto.OpPing})
	if done.Code != "" || done.Agent == nil || done.Agent.Version != version || done.Agent.ProtocolVersion != agentproto.ProtocolVersion {
		t.Fatalf("ping: %+v", done)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	if code := a.waitExit(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
}

// TestInitReapsAndForwards: orphans of started processes are reaped by
// init; SIGTERM reaches serve, which kills its processes; init exits with
// serve's status.
func TestInitReapsAndForwards(t *testing.T) {
	t.Parallel()
	a := startInit(t, false)
	a.call(t, agentproto.Request{Op: agentproto.OpPing})
	kids := children(a.cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("init has children %v, want serve alone", kids)
	}
	serve := kids[0]

	// sh exits at once; its sleep becomes an orphan, reparented to init.
	done := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "sh", Args: []string{"-c", "sleep 0.3 >/dev/null 2>&1 &"}, Cwd: "/",
	}})
	if done.Code != "" || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Fatalf("start: %+v", done)
	}
	// Wait until it is reparented (sh may still be exiting), well within
	// its 0.3 s life.
	var orphan int
	for deadline := time.Now().Add(5 * time.Second); orphan == 0; time.Sleep(5 * time.Millisecond) {
		for _, k := range children(a.cmd.Process.Pid) {
			if k != serve {
				orphan = k
			}
		}
		if orphan == 0 && time.Now().After(deadline) {
			t.Fatal("the orphan was not reparented to init")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := state(orphan); st != ""; st = state(orphan) {
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped (state %s)", orphan, st)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// a background process, killed when serve stops
	c, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	pc := agentproto.NewConn(c)
	pc.WriteJSON(agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"60"}, Cwd: "/"}})
	var start agentproto.Event
	if err := pc.ReadJSON(&start); err != nil || start.PID == 0 {
		t.Fatalf("start: %+v %v", start, err)
	}
	c.Close()

	a.cmd.Process.Signal(syscall.SIGTERM)
	if code := a.waitExit(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	for _, pid := range []int{serve, start.PID} {
		if st := state(pid); st != "" && st != "Z" {
			t.Errorf("process %d survived init (state %s)", pid, st)
		}
	}
}

func TestInitExitsWithServeStatus(t *testing.T) {
	t.Parallel()
	a := startInit(t, false)
	a.call(t, agentproto.Request{Op: agentproto.OpPing})
	kids := children(a.cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("children %v", kids)
	}
	syscall.Kill(kids[0], syscall.SIGKILL)
	if code := a.waitExit(t); code != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit code %d, want %d", code, 128+int(syscall.SIGKILL))
	}
}

func TestServeWithoutListener(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(testutil.AgentBin(t), "serve", "--root", t.TempDir()).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "fd 3") {
		t.Fatalf("err %v, output %s", err, out)
	}
}

// TestInitEndsSandboxAtDeadline: init ends the sandbox when the lifetime
// the host gave passes, with no host engine involved; a later ping moves
// the deadline; no process serve starts holds the pipe the deadline
// travels on. (Here init is not a pid namespace's pid 1, as serve refuses
// to run as pid 1 outside a sandbox, so it ends serve itself; that pid
// 1's exit ends every process of a real sandbox is
// internal/sandbox.TestRuncLifetimeHoldsWithoutEngine.)
func TestInitEndsSandboxAtDeadline(t *testing.T) {
	t.Parallel()
	a := startInit(t, true)
	start := time.Now()
	if done := a.call(t, agentproto.Request{Op: agentproto.OpPing, LifetimeMS: 400}); done.Code != "" {
		t.Fatalf("ping with a lifetime: %+v", done)
	}
	if done := a.call(t, agentproto.Request{Op: agentproto.OpPing, LifetimeMS: 1500}); done.Code != "" {
		t.Fatalf("extend: %+v", done)
	}
	kids := children(a.cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("init has children %v, want serve alone", kids)
	}
	serve := kids[0]
	fdList := filepath.Join(t.TempDir(), "fds")
	done := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "sh", Args: []string{"-c", "exec ls /proc/self/fd >" + fdList}, Cwd: "/",
	}})
	if done.Code != "" {
		t.Fatalf("start: %+v", done)
	}
	// (fds the test runner itself leaked may show; the pipe is serve's fd 4)
	if b, err := os.ReadFile(fdList); err != nil || slices.Contains(strings.Fields(string(b)), strconv.Itoa(lifetimeFD)) {
		t.Fatalf("a started process holds fds %q (%v): the lifetime pipe leaked", b, err)
	}
	if code := a.waitExit(t); code != exitLifetime {
		t.Fatalf("init exited with %d, want %d (lifetime)", code, exitLifetime)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("init ended the sandbox after %s: the extension to 1.5 s was not kept", took)
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := state(serve); st != "" && st != "Z"; st = state(serve) {
		if time.Now().After(deadline) {
			t.Fatalf("serve (%d) outlived the sandbox's lifetime", serve)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInitOverTLS is the Pod path: init --listen-tcp with a credential
// directory. The server's client is served; a client without the server's
// certificate is refused before any request.
func TestInitOverTLS(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ca, err := agenttls.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	agentCred, err := ca.IssueAgent("sbx-tls", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverCred, err := ca.IssueServer(now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := agenttls.NewClient(serverCred, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{agenttls.CertFile: agentCred.CertPEM, agenttls.KeyFile: agentCred.KeyPEM, agenttls.CAFile: ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A free port: listen, note it, close; init listens there next.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()

	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "home/user"), 0o755)
	cmd := exec.Command(testutil.AgentBin(t), "init", "--root", root, "--home", "/home/user", "--listen-tcp", addr, "--tls-dir", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })

	dial := func(cfg *tls.Config) (*tls.Conn, error) {
		var c *tls.Conn
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if c, err = tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
				break
			}
		}
		return c, err
	}
	c, err := dial(client.Config("sbx-tls"))
	if err != nil {
		t.Fatalf("dial as the server: %v", err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	done, err := agentproto.Call(c, agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{})
	c.Close()
	if err != nil || done.Agent == nil || done.Agent.Version != version {
		t.Fatalf("ping over TLS: %+v, %v", done, err)
	}

	// The same, without a client certificate: TLS 1.3 finishes the
	// client's side of the handshake first; the agent's refusal arrives
	// at the first read.
	anon := client.Config("sbx-tls")
	anon.Certificates, anon.ClientSessionCache = nil, nil
	if c, err := dial(anon); err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = agentproto.Call(c, agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{})
		c.Close()
		if err == nil {
			t.Fatal("the agent answered a client without the server's certificate")
		}
	}
}

// TestListenTCPNeedsCredential: --listen-tcp without a credential does not
// serve in the clear.
func TestListenTCPNeedsCredential(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"no --tls-dir":    {"serve", "--listen-tcp", "127.0.0.1:0"},
		"empty --tls-dir": {"serve", "--listen-tcp", "127.0.0.1:0", "--tls-dir", t.TempDir()},
	} {
		out, err := exec.Command(testutil.AgentBin(t), args...).CombinedOutput()
		if code := exitCode(err); code != 1 {
			t.Errorf("%s: exit %d (%v), want 1; output %s", name, code, err, out)
		}
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// nproc-exec bounds the tasks of its program's uid: a user at its limit
// cannot fork, while the same program under a higher limit can (the
// attack works where it is not confined). Run as a uid no one else uses.
func TestNprocExec(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.AgentBin(t)
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"nproc-exec"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 54321, Gid: 54321}}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	const fork = "/bin/true && echo forked"
	if out, code := run("1000", "/bin/sh", "sh", "-c", fork); code != 0 || out != "forked\n" {
		t.Fatalf("under 1000: exit %d, %q", code, out)
	}
	if out, code := run("1", "/bin/sh", "sh", "-c", fork); code == 0 || strings.Contains(out, "forked") {
		t.Fatalf("under 1: exit %d, %q: the fork went through", code, out)
	}
	if out, _ := run("9", "/bin/cat", "cat", "/proc/self/limits"); !regexp.MustCompile(`(?m)^Max processes\s+9\s+9\s`).MatchString(out) {
		t.Fatalf("limits %q", out)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"9", "/bin/sh"}, 2},
		{[]string{"x", "/bin/sh", "sh"}, 2},
		{[]string{"0", "/bin/sh", "sh"}, 2},
		{[]string{"9", "/nonexistent", "x"}, 127},
		{[]string{"9", "/etc/passwd", "x"}, 126},
	} {
		if out, code := run(tc.args...); code != tc.code {
			t.Errorf("nproc-exec %q: exit %d (%q), want %d", tc.args, code, out, tc.code)
		}
	}
}

// serve's --nproc reaches the processes it starts, through init as in a
// Pod (the kubernetes runtime passes it after its own flags).
func TestServeNprocFlag(t *testing.T) {
	a := startInit(t, false, "--nproc", "55")
	var out strings.Builder
	c, err := net.Dial("unix", a.sock)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c, err = net.Dial("unix", a.sock)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	done, err := agentproto.Call(c, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "cat", Args: []string{"/proc/self/limits"}, Cwd: "/"}}, nil, agentproto.Handlers{Event: func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventStdout {
			out.Write(ev.Data)
		}
		return nil
	}})
	if err != nil || done.Code != "" {
		t.Fatalf("process.start: %v %+v", err, done)
	}
	if !regexp.MustCompile(`(?m)^Max processes\s+55\s+55\s`).MatchString(out.String()) {
		t.Fatalf("limits %q", out.String())
	}
}

// TestInitEndsUnpingedSandbox: an agent started with --lifetime (a Pod's)
// ends the sandbox when it passes though no ping ever came: a warm pool
// member whose server was killed while its Pod started, before the first
// ping gave it its lease, no longer runs for ever (the leftover Pod of the
// Kubernetes e2e test's TestSandboxesAsPods). The control, started with
// it and without the flag, still runs when the first has ended.
func TestInitEndsUnpingedSandbox(t *testing.T) {
	t.Parallel()
	control := startInit(t, true)
	start := time.Now()
	a := startInit(t, true, "--lifetime", "1s")
	if code := a.waitExit(t); code != exitLifetime {
		t.Fatalf("init exited with %d, want %d (lifetime)", code, exitLifetime)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("init ended the sandbox after %s, before its lifetime of 1 s", took)
	}
	select {
	case err := <-control.exit:
		t.Fatalf("the control, never given a lifetime, ended too: %v", err)
	default:
	}
	if done := control.call(t, agentproto.Request{Op: agentproto.OpPing}); done.Code != "" || done.Agent.LifetimeLeftMS != 0 {
		t.Fatalf("the control's ping: %+v", done)
	}
}
