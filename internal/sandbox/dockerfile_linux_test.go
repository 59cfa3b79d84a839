package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// stepRunner is internal/engine's StepRunner (the wiring's), here so that
// this package's tests need not import the engine.
type stepRunner struct{ r oci.StepRunner }

func (s stepRunner) RunStep(ctx context.Context, st template.RunStep, out io.Writer) error {
	return s.r.Run(ctx, oci.Step{RootFS: st.RootFS, Args: st.Args, Env: st.Env, Cwd: st.Cwd,
		UID: st.UID, GID: st.GID, HostID: st.UIDShift}, out)
}

// dockerfileDataDir is a data dir of the test's own whose python template
// is the shared one (a symbolic link: never written), and a StepRunner on
// the real runc. Its cleanup checks that no build left a mount, a runc
// container, a bundle or a cgroup.
func dockerfileDataDir(t *testing.T) (string, template.StepRunner) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.TemplateRootFS(t, "python")
	data, err := os.MkdirTemp("/var/tmp", "sf-dockerfile-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(data, 0o755); err != nil { // the steps' root traverses it
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(data, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(testutil.DataDir(), "templates", "python"), filepath.Join(data, "templates", "python")); err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(data, "runs")
	r := oci.StepRunner{RuntimePath: testutil.Runc(t), Dir: runs}
	t.Cleanup(func() {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mi, []byte(data)) {
			t.Errorf("mounts left under %s", data)
		}
		for _, d := range []string{filepath.Join(runs, "runc"), filepath.Join(runs, "bundles")} {
			if ents, _ := os.ReadDir(d); len(ents) > 0 {
				t.Errorf("left in %s: %v", d, ents)
			}
		}
		if left, _ := filepath.Glob(r.CgroupGlob()); len(left) > 0 { // this data dir's steps
			t.Errorf("build step cgroups left: %v", left)
		}
		if err := os.RemoveAll(data); err != nil {
			t.Errorf("remove %s: %v", data, err)
		}
	})
	return data, stepRunner{r}
}

// TestDockerfileTemplateSandbox builds a template FROM python with RUN
// steps in runc sandboxes (as root and as USER user), starts a sandbox on
// it, reads the file a step wrote and runs Python.
func TestDockerfileTemplateSandbox(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	ctxDir := t.TempDir()
	testutil.WriteTree(t, ctxDir, map[string]string{"hello.py": "GREETING = 'from the context'\n"})
	src := `FROM python
ENV APP=/opt/app
WORKDIR $APP
COPY hello.py ./
RUN echo built-by-run > made.txt && python3 -c "import sys; open('py.txt', 'w').write(sys.version.split()[0])"
USER user
RUN id -u > /tmp/uid.txt
`
	info, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
		DataDir: data, Name: "demo", Context: ctxDir, UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Templates = sandbox.TemplatesFunc(func(name string) (string, error) {
			i, err := template.Get(data, name)
			return i.Path, err
		})
	})
	s := newSandbox(t, m, sandbox.CreateOptions{Template: info.Name})
	var buf bytes.Buffer
	if _, err := s.ReadFile(context.Background(), "/opt/app/made.txt", &buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "built-by-run\n" {
		t.Errorf("made.txt = %q", buf.String())
	}
	ex := run(t, s, "python", "import sys; sys.path.insert(0, '/opt/app'); import hello\n"+
		"print(hello.GREETING, open('/opt/app/py.txt').read() == sys.version.split()[0], open('/tmp/uid.txt').read().strip())\n1+1")
	if ex.Error != nil || strings.TrimSpace(ex.Stdout) != "from the context True 1000" || mainText(ex) != "2" {
		t.Fatalf("execution: stdout %q result %q error %+v", ex.Stdout, mainText(ex), ex.Error)
	}
}

// TestDockerfileRunNoNetwork: a RUN step reaches no host address, neither
// the host's loopback nor its external one. Control: the same listeners
// answer a dial from the host.
func TestDockerfileRunNoNetwork(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	var addrs []string
	for _, host := range []string{"127.0.0.1", externalIPv4(t)} {
		ln, accepted := testutil.ClosingListener(t, net.JoinHostPort(host, "0"))
		// Control: reachable from the host.
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatalf("control: dial %s from the host: %v", ln.Addr(), err)
		}
		c.Close()
		testutil.Receive(t, accepted, "the control's connection")
		addrs = append(addrs, ln.Addr().String())
		t.Cleanup(func() {
			if len(accepted) > 0 {
				t.Errorf("a build step connected to %s", ln.Addr())
			}
		})
	}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		src := "FROM python\nRUN python3 -c \"import socket; socket.create_connection(('" + host + "', " + port + "), timeout=3); print('CONN' + 'ECTED')\"\n"
		_, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
			DataDir: data, Name: "net", UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
		})
		var be *template.BuildError
		if !errors.As(err, &be) || strings.Contains(be.Output, "CONNECTED") || !strings.Contains(be.Output, "Error") {
			t.Errorf("RUN connecting to %s: err = %v", a, err)
		}
	}
}

// externalIPv4 is an address of the host's other than loopback.
func externalIPv4(t *testing.T) string {
	t.Helper()
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ifs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("the host has no IPv4 address but loopback")
	return ""
}

// TestDockerfileRunFailsCleanly: a failing RUN that left a process behind
// reports its command and last output, and leaves no process, runc
// container, cgroup, mount or half-built layer (dockerfileDataDir's
// cleanup checks the rest).
func TestDockerfileRunFailsCleanly(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	src := "FROM python\nRUN sleep 617 & sleep 0.2; grep '^Name' /proc/$!/status; echo last-words; exit 7\n"
	_, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
		DataDir: data, Name: "bad", UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
	})
	var be *template.BuildError
	if !errors.As(err, &be) || !strings.Contains(be.Step, "line 2: RUN sleep 617") ||
		!strings.Contains(be.Output, "last-words") || !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("err = %v", err)
	}
	// Control: the background process did run in the step.
	if !strings.Contains(be.Output, "Name:\tsleep") {
		t.Fatalf("control: the step's background process was not seen:\n%s", be.Output)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); string(b) == "sleep\x00617\x00" {
			t.Errorf("the step's background process outlived it: %s", p)
		}
	}
	if _, err := template.Get(data, "bad"); !errors.Is(err, template.ErrNotBuilt) {
		t.Errorf("template after a failed build: %v", err)
	}
	layers, _ := os.ReadDir(filepath.Join(data, "templates", ".layers"))
	if len(layers) != 0 {
		t.Errorf("layers left: %v", layers)
	}
}

// signalWriter closes seen once want has been written to it.
type signalWriter struct {
	buf  testutil.Buffer
	want string
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) && w.seen != nil {
		close(w.seen)
		w.seen = nil
	}
	return n, err
}

// TestDockerfileRunCancelled: a build cancelled while a RUN runs ends the
// step's processes and leaves nothing (dockerfileDataDir's cleanup checks
// runc's state, bundles, cgroups and mounts).
func TestDockerfileRunCancelled(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	seen := make(chan struct{})
	log := &signalWriter{want: "step-started", seen: seen}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := template.BuildDockerfile(ctx, []byte("FROM python\nRUN echo step-started; sleep 618\n"), template.DockerfileOptions{
			DataDir: data, Name: "cut", UIDShift: oci.DefaultIDMap.HostID, Runner: runner, Log: log,
		})
		done <- err
	}()
	testutil.Receive(t, seen, "the step's start")
	cancel()
	err := testutil.Receive(t, done, "the build's end")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); string(b) == "sleep\x00618\x00" {
			t.Errorf("the cancelled step's process outlived it: %s", p)
		}
	}
}
