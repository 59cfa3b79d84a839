package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// builtTemplates are a data dir's templates with their start commands,
// as the engine's wiring gives them (internal/engine's templates).
type builtTemplates struct{ dataDir string }

func (b builtTemplates) RootFS(name string) (string, error) {
	i, err := template.Get(b.dataDir, name)
	return i.Path, err
}

func (b builtTemplates) StartOf(name string) (sandbox.TemplateStart, error) {
	i, err := template.Get(b.dataDir, name)
	return sandbox.TemplateStart{Command: i.Start, Ready: i.Ready, User: i.User, WorkDir: i.WorkDir, Env: i.Env}, err
}

// startTemplates are the python template's rootfs under several names,
// each with a start command of its own.
type startTemplates struct {
	rootfs string
	starts map[string]sandbox.TemplateStart
}

func (s startTemplates) RootFS(name string) (string, error) { return s.rootfs, nil }

func (s startTemplates) StartOf(name string) (sandbox.TemplateStart, error) {
	return s.starts[name], nil
}

// TestTemplateStartReadyByPort builds a template FROM python whose
// LABELs start a web server as its USER, in its WORKDIR, with its ENV,
// ready once port 5173 accepts: a create returns with the port open
// (dialled once, no retry), the command tagged in the process list; a
// pooled sandbox of it is handed out started, the port open at once.
func TestTemplateStartReadyByPort(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	src := `FROM python
ENV GREETING=from-env
WORKDIR /home/user/site
RUN echo served-page > index.html
USER user
LABEL sheepfold.start="echo \"$GREETING $(id -un) $(pwd)\" > /tmp/start.txt; exec python3 -m http.server 5173 --bind 127.0.0.1"
LABEL sheepfold.ready="port:5173"
`
	info, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
		DataDir: data, Name: "web", UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Templates = builtTemplates{data}
		c.PoolTemplates, c.PoolSize = []string{"web"}, 1
	})
	ctx := context.Background()
	check := func(s *sandbox.Sandbox) {
		t.Helper()
		c, err := s.DialPort(ctx, 5173)
		if err != nil {
			t.Fatalf("port 5173 right after create: %v", err)
		}
		c.Close()
		var buf bytes.Buffer
		if _, err := s.ReadFile(ctx, "/tmp/start.txt", &buf, 1<<10); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(buf.String()); got != "from-env user /home/user/site" {
			t.Errorf("the start command ran with %q, want its ENV, USER and WORKDIR", got)
		}
		ps, err := s.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tagged := false
		for _, p := range ps {
			tagged = tagged || p.Tag == sandbox.StartTag
		}
		if !tagged {
			t.Errorf("no process tagged %s: %+v", sandbox.StartTag, ps)
		}
	}
	// A miss (the pool is still filling, or taken): the create waits.
	miss, err := m.Create(ctx, sandbox.CreateOptions{Template: info.Name, Env: map[string]string{"X": "not poolable"}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill(ctx, miss.ID)
	if miss.FromPool() {
		t.Fatal("a create with env came from the pool")
	}
	check(miss)
	deadline := time.Now().Add(90 * time.Second)
	for m.PoolStats().Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", m.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	began := time.Now()
	hit := newSandbox(t, m, sandbox.CreateOptions{Template: info.Name})
	took := time.Since(began)
	if !hit.FromPool() {
		t.Fatal("the create missed a full pool")
	}
	check(hit)
	t.Logf("pool hit in %s", took)
}

// startEngine2 is a runc engine whose templates are the python rootfs
// with starts.
func startEngine2(t *testing.T, timeout time.Duration, starts map[string]sandbox.TemplateStart) *sandbox.Manager {
	t.Helper()
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	return runcEngine(t, func(c *sandbox.Config) {
		c.Templates = startTemplates{rootfs: rootfs, starts: starts}
		c.StartTimeout = timeout
		c.PoolSize = 0
	})
}

// TestTemplateStartReadyByCommand: the ready check is a command, polled
// until it exits 0; the create returns only then (the file the start
// command makes after a while is there).
func TestTemplateStartReadyByCommand(t *testing.T) {
	m := startEngine2(t, 30*time.Second, map[string]sandbox.TemplateStart{"slow": {
		Command: "python3 -c 'import time; time.sleep(0.5)'; echo done > /tmp/made; exec sleep 1000",
		Ready:   "cmd:test -s /tmp/made",
	}})
	s := newSandbox(t, m, sandbox.CreateOptions{Template: "slow"})
	var buf bytes.Buffer
	if _, err := s.ReadFile(context.Background(), "/tmp/made", &buf, 1<<10); err != nil || buf.String() != "done\n" {
		t.Fatalf("after create: %q %v", buf.String(), err)
	}
}

// notReady checks err is ERR_TEMPLATE_NOT_READY for reason, naming want,
// and that the engine kept no sandbox (runcEngine's cleanup checks the
// host: containers, cgroups, mounts).
func notReady(t *testing.T, m *sandbox.Manager, err error, reason string, want ...string) {
	t.Helper()
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Code != apierr.TemplateNotReady || ae.Details["reason"] != reason {
		t.Fatalf("err = %v (%+v), want %s for %s", err, ae, apierr.TemplateNotReady, reason)
	}
	for _, w := range want {
		if !strings.Contains(ae.Message, w) {
			t.Errorf("the message lacks %q:\n%s", w, ae.Message)
		}
	}
	if l := m.List(); len(l) != 0 {
		t.Errorf("sandboxes left: %+v", l)
	}
}

// TestTemplateStartDies: a start command that fails (a status other than
// 0) before its ready check holds fails the create at once with
// ERR_TEMPLATE_NOT_READY, its exit status and last output, and leaves
// nothing (runcEngine's cleanup: no container, cgroup, mount or state).
// One that ends with 0 has done its work: the check decides (E2B's
// `set_start_cmd("touch /tmp/started", "[ -f /tmp/started ]")`), and
// the create waits for it; ended with 0 and never ready, it is the
// timeout's. Control: the failing command's server that does not die
// makes a sandbox.
func TestTemplateStartDies(t *testing.T) {
	m := startEngine2(t, time.Minute, map[string]sandbox.TemplateStart{
		"dies":     {Command: "echo starting-up; echo cannot-bind >&2; exit 3", Ready: "port:5173"},
		"control":  {Command: "echo starting-up; exec python3 -m http.server 5173", Ready: "port:5173"},
		"one-shot": {Command: "sleep 0.2; touch /tmp/started", Ready: "cmd:[ -f /tmp/started ]"},
	})
	one := newSandbox(t, m, sandbox.CreateOptions{Template: "one-shot"})
	m.Kill(context.Background(), one.ID)
	short := startEngine2(t, 2*time.Second, map[string]sandbox.TemplateStart{
		"no-show": {Command: "echo done-early", Ready: "cmd:[ -f /tmp/never ]"},
	})
	_, err := short.Create(context.Background(), sandbox.CreateOptions{Template: "no-show"})
	notReady(t, short, err, "timeout", "[ -f /tmp/never ]", "done-early")
	began := time.Now()
	_, err = m.Create(context.Background(), sandbox.CreateOptions{Template: "dies"})
	notReady(t, m, err, "exited", "exit 3", "cannot-bind", "starting-up")
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("the failure took %s: it waited for the timeout", took)
	}
	s := newSandbox(t, m, sandbox.CreateOptions{Template: "control"})
	m.Kill(context.Background(), s.ID)
}

// TestTemplateStartNeverReady: a ready check that never holds fails the
// create after the timeout with ERR_TEMPLATE_NOT_READY (reason timeout)
// and leaves nothing, the start command included.
func TestTemplateStartNeverReady(t *testing.T) {
	m := startEngine2(t, 2*time.Second, map[string]sandbox.TemplateStart{
		"never": {Command: "echo waiting-forever; exec sleep 619", Ready: "port:5999"},
	})
	_, err := m.Create(context.Background(), sandbox.CreateOptions{Template: "never"})
	notReady(t, m, err, "timeout", "port:5999", "waiting-forever", "within 2s")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); string(b) == "sleep\x00619\x00" {
			t.Errorf("the start command outlived its sandbox: %s", p)
		}
	}
}

// TestTemplateEnv: a Dockerfile's ENV is in every process of the
// template's sandboxes, code included, cold or from the pool: a variable
// of its own, and one of the numerical libraries' thread counts, which
// the engine sets only where the template (or the create) does not; a
// create's own variable of the same name wins. The control: the python
// template's sandbox has none of it.
func TestTemplateEnv(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	src := "FROM python\nENV GREETING=from-template OMP_NUM_THREADS=3\n"
	if _, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
		DataDir: data, Name: "envy", UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
	}); err != nil {
		t.Fatal(err)
	}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Templates = builtTemplates{data}
		c.PoolTemplates, c.PoolSize = []string{"envy"}, 1
		c.DefaultLimits.CPUs = 1
	})
	const probe = "import os, subprocess\n(os.environ.get('GREETING'), os.environ.get('OMP_NUM_THREADS'), subprocess.run(['sh', '-c', 'echo $GREETING'], capture_output=True, text=True).stdout.strip())"
	waitPooled := func() {
		deadline := time.Now().Add(2 * time.Minute)
		for m.PoolStats().Ready < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the pool did not fill: %+v", m.PoolStats())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, tc := range []struct {
		name   string
		opt    sandbox.CreateOptions
		pooled bool
		want   string
	}{
		{"pool hit", sandbox.CreateOptions{Template: "envy"}, true, "('from-template', '3', 'from-template')"},
		{"cold, the create's own", sandbox.CreateOptions{Template: "envy", Env: map[string]string{"GREETING": "from-create"}}, false, "('from-create', '3', 'from-create')"},
		{"control: python", sandbox.CreateOptions{Template: "python", Env: map[string]string{"X": "1"}}, false, "(None, '1', '')"},
	} {
		if tc.pooled {
			waitPooled()
		}
		s := newSandbox(t, m, tc.opt)
		if s.FromPool() != tc.pooled {
			t.Fatalf("%s: pooled %v", tc.name, s.FromPool())
		}
		if got := mainText(run(t, s, "python", probe)); got != tc.want {
			t.Fatalf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestTemplateUserWorkDir: a template's last USER and WORKDIR are the
// defaults of its sandboxes (E2B's): a command and a Python execution
// that name neither run as that user, in that directory, in a sandbox
// created cold and in a warm pool member; a command's own user and
// cwd, and a code context's own cwd, still win. The control: the python
// template's sandbox runs both as "user" (uid 1000) in /home/user.
func TestTemplateUserWorkDir(t *testing.T) {
	data, runner := dockerfileDataDir(t)
	src := "FROM python\nWORKDIR /srv/x\nRUN echo here > mark\nUSER nobody:nogroup\n"
	if _, err := template.BuildDockerfile(context.Background(), []byte(src), template.DockerfileOptions{
		DataDir: data, Name: "owned", UIDShift: oci.DefaultIDMap.HostID, Runner: runner,
	}); err != nil {
		t.Fatal(err)
	}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Templates = builtTemplates{data}
		c.PoolTemplates, c.PoolSize = []string{"owned"}, 1
	})
	ctx := context.Background()
	const probe = "import os\n(os.getuid(), os.getcwd(), open('mark').read().strip())"
	cmd := func(s *sandbox.Sandbox, spec sandbox.ProcessSpec) string {
		t.Helper()
		var out strings.Builder
		spec.Cmd, spec.Args, spec.TimeoutMS = "/bin/sh", []string{"-c", "echo $(id -u) $(pwd)"}, 60_000
		if _, err := s.Run(ctx, spec, func(ev agentproto.Event) {
			if ev.Type == agentproto.EventStdout {
				out.Write(ev.Data)
			}
		}); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out.String())
	}
	check := func(what string, s *sandbox.Sandbox) {
		t.Helper()
		if got := mainText(run(t, s, "python", probe)); got != "(65534, '/srv/x', 'here')" {
			t.Errorf("%s: a Python execution: %s, want nobody's uid in /srv/x", what, got)
		}
		if got := cmd(s, sandbox.ProcessSpec{}); got != "65534 /srv/x" {
			t.Errorf("%s: a command: %q, want nobody's uid in /srv/x", what, got)
		}
		if got := cmd(s, sandbox.ProcessSpec{User: "root", Cwd: "/tmp"}); got != "0 /tmp" {
			t.Errorf("%s: a command as root in /tmp: %q", what, got)
		}
		if got := cmd(s, sandbox.ProcessSpec{User: "user"}); got != "1000 /srv/x" {
			t.Errorf("%s: a command as user: %q", what, got)
		}
		c, err := s.CreateContext(ctx, agentproto.ContextSpec{Language: "python", Cwd: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		ex := runReq(t, s, sandbox.ExecuteRequest{ContextID: c.ID, Code: "import os\n(os.getuid(), os.getcwd())"})
		if got := mainText(ex); got != "(65534, '/tmp')" {
			t.Errorf("%s: a context in /tmp: %s", what, got)
		}
	}
	check("cold", newSandbox(t, m, sandbox.CreateOptions{Template: "owned", Env: map[string]string{"X": "not poolable"}}))
	deadline := time.Now().Add(2 * time.Minute)
	for m.PoolStats().Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", m.PoolStats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	hit := newSandbox(t, m, sandbox.CreateOptions{Template: "owned"})
	if !hit.FromPool() {
		t.Fatal("the create missed a full pool")
	}
	check("pooled", hit)

	py := newSandbox(t, m, sandbox.CreateOptions{Template: "python"})
	if got := mainText(run(t, py, "python", "import os\n(os.getuid(), os.getcwd())")); got != "(1000, '/home/user')" {
		t.Errorf("control: python's Python execution: %s", got)
	}
	if got := cmd(py, sandbox.ProcessSpec{}); got != "1000 /home/user" {
		t.Errorf("control: python's command: %q", got)
	}
}
