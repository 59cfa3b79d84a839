package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

const testCgroupParent = "sheepfold-test"

// runcRuntime is the real runc runtime with a state dir and a cgroup
// instance of its own; the caller closes it, then calls noLeaks to check
// that nothing of the instance is left on the host.
func runcRuntime(t testing.TB, opts ...func(*oci.Config)) (rt *oci.OCI, noLeaks func()) {
	t.Helper()
	state := testutil.ShortTempDir(t)
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	instance := "t" + hex.EncodeToString(b[:])
	cfg := oci.Config{
		RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
		CgroupParent: testCgroupParent, Instance: instance,
	}
	if testutil.GVisor() {
		// The suite's gVisor pass: every sandbox that names no runtime
		// runs under runsc.
		cfg.RunscPath, cfg.DefaultRuntime = testutil.Runsc(t), oci.RuntimeGVisor
	}
	for _, o := range opts {
		o(&cfg)
	}
	rt, err := oci.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cgroup := rt.CgroupPath()
	return rt, func() { assertNoLeaks(t, state, instance, cgroup) }
}

// runcEngine is a Manager on the real runc runtime with its own state dir
// and cgroup instance; its cleanup destroys everything and checks that no
// mount, cgroup or process of it is left. opts adjust the engine's Config.
func runcEngine(t testing.TB, opts ...func(*sandbox.Config)) *sandbox.Manager {
	t.Helper()
	return runcEngineWith(t, nil, opts...)
}

// runcEngineWith is runcEngine whose runtime's Config rt adjusts (nil:
// as it is).
func runcEngineWith(t testing.TB, rtOpt func(*oci.Config), opts ...func(*sandbox.Config)) *sandbox.Manager {
	t.Helper()
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	var rtOpts []func(*oci.Config)
	if rtOpt != nil {
		rtOpts = append(rtOpts, rtOpt)
	}
	rt, noLeaks := runcRuntime(t, rtOpts...)
	cfg := sandbox.Config{
		Runtime: rt,
		Templates: sandbox.TemplatesFunc(func(name string) (string, error) {
			if name != "python" {
				return "", os.ErrNotExist
			}
			return rootfs, nil
		}),
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
	})
	return m
}

// assertNoLeaks checks the host for anything of one engine instance, whose
// cgroup is cgroup in each hierarchy.
func assertNoLeaks(t testing.TB, state, instance, cgroup string) {
	t.Helper()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(state)) {
		t.Errorf("mounts left under %s", state)
	}
	for _, m := range []string{"memory", "pids", "cpu", "freezer", "unified", ""} {
		d := filepath.Join("/sys/fs/cgroup", m, cgroup)
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup left: %s", d)
		}
	}
	if _, err := os.Stat(filepath.Join(state, instance)); err == nil {
		t.Errorf("state dir left: %s", filepath.Join(state, instance))
	}
	// No loop device holds a disk image of the instance (one that clears
	// itself at its unmount does so asynchronously).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var left []string
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), state+"/") {
				left = append(left, f+": "+string(bytes.TrimSpace(b)))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices left: %v", left)
			break
		}
	}
	// A cgroup cannot be removed while a process is in it, so no cgroup
	// left also means no sandbox process left.
}

func newSandbox(t *testing.T, m *sandbox.Manager, opt sandbox.CreateOptions) *sandbox.Sandbox {
	t.Helper()
	s, err := m.Create(context.Background(), opt)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { _ = m.Kill(context.Background(), s.ID) })
	return s
}

func run(t *testing.T, s *sandbox.Sandbox, lang, code string) *sandbox.Execution {
	t.Helper()
	return runReq(t, s, sandbox.ExecuteRequest{Language: lang, Code: code})
}

func runReq(t *testing.T, s *sandbox.Sandbox, req sandbox.ExecuteRequest) *sandbox.Execution {
	t.Helper()
	ex, err := s.Execute(context.Background(), req, nil)
	if err != nil {
		t.Fatalf("execute %q: %v", req.Code, err)
	}
	return ex
}

func mainText(ex *sandbox.Execution) string {
	for _, r := range ex.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

func TestRuncStatefulPython(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	if ex := run(t, s, "python", "x = 41"); ex.Status != sandbox.ExecSuccess {
		t.Fatalf("x = 41: %+v", ex)
	}
	if ex := run(t, s, "python", "x + 1"); mainText(ex) != "42" {
		t.Fatalf("x + 1 = %q, want 42 (%+v)", mainText(ex), ex)
	}
	ex := run(t, s, "python", "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('stock')\nplt.show()")
	if ex.Status != sandbox.ExecSuccess || len(ex.Results) == 0 || ex.Results[0].PNG == "" {
		t.Fatalf("matplotlib: no PNG result: %+v", ex)
	}
	if !strings.HasPrefix(ex.Results[0].PNG, "iVBORw0KGgo") { // base64 of the PNG magic
		t.Fatalf("result is not a PNG: %.20s", ex.Results[0].PNG)
	}
	ex = run(t, s, "python", "import pandas as pd\npd.DataFrame({'country': ['DE', 'FR'], 'amount': [10, 20], 'day': pd.to_datetime(['2024-01-02', '2024-03-04 05:06:07'])})")
	if len(ex.Results) == 0 || !strings.Contains(ex.Results[0].HTML, "<table") || !strings.Contains(ex.Results[0].Text, "country") {
		t.Fatalf("DataFrame: want html and text: %+v", ex)
	}
	// E2B's data: the columns as lists, timestamps in ISO 8601.
	if got, _ := json.Marshal(ex.Results[0].Extra["e2b/data"]); string(got) != `{"amount":[10,20],"country":["DE","FR"],"day":["2024-01-02T00:00:00","2024-03-04T05:06:07"]}` {
		t.Fatalf("DataFrame data: %s", got)
	}
	ex = run(t, s, "python", "def f():\n    raise ValueError('bad input')\nf()")
	if ex.Status != sandbox.ExecError || ex.Error == nil || ex.Error.Name != "ValueError" ||
		ex.Error.Value != "bad input" || !strings.Contains(ex.Error.Traceback, "f()") {
		t.Fatalf("exception: %+v", ex.Error)
	}
}

func TestRuncJavaScriptAndBash(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "javascript", "let n = 20")
	if ex := run(t, s, "javascript", "console.log('hi'); n * 2 + 2"); mainText(ex) != "42" || ex.Stdout != "hi\n" {
		t.Fatalf("javascript state: %q %q", mainText(ex), ex.Stdout)
	}
	run(t, s, "bash", "cd /tmp && GREETING=hello")
	if ex := run(t, s, "bash", `echo "$GREETING from $(pwd)"`); ex.Stdout != "hello from /tmp\n" {
		t.Fatalf("bash state: %q", ex.Stdout)
	}
}

func TestRuncTimeoutKeepsSandboxUsable(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	start := time.Now()
	ex := runReq(t, s, sandbox.ExecuteRequest{Code: "while True:\n    pass", Timeout: time.Second})
	if ex.Status != sandbox.ExecTimeout || ex.ErrorCode != "ERR_SANDBOX_TIMEOUT" {
		t.Fatalf("want timeout, got %+v", ex)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %s", d)
	}
	if ex := run(t, s, "python", "6 * 7"); mainText(ex) != "42" {
		t.Fatalf("sandbox unusable after timeout: %+v", ex)
	}
}

// TestRuncOutputCap: an endless print loop's output is cut at the cap with
// a marker and the loop runs on to its timeout (seed 002's error 2); under
// output_filtering.stop_on_output_cap it is stopped at the cap.
func TestRuncOutputCap(t *testing.T) {
	m := runcEngine(t)
	loop := sandbox.ExecuteRequest{Code: "while True:\n    print('x' * 1000)", MaxOutput: 64 << 10, Timeout: 2 * time.Second}
	s := newSandbox(t, m, sandbox.CreateOptions{})
	ex := runReq(t, s, loop)
	marker := fmt.Sprintf(agentproto.OutputCapMarker, 64<<10)
	if ex.ErrorCode != "ERR_SANDBOX_TIMEOUT" || !ex.Truncated || len(ex.Stdout) != 64<<10+len(marker) || !strings.HasSuffix(ex.Stdout, marker) {
		t.Fatalf("want the output cut at 64 KiB, then the timeout: code %q truncated %v len %d", ex.ErrorCode, ex.Truncated, len(ex.Stdout))
	}
	if ex := run(t, s, "python", "1 + 1"); mainText(ex) != "2" {
		t.Fatalf("sandbox unusable after output cap: %+v", ex)
	}
	stop := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{OutputFiltering: &policy.OutputFiltering{StopOnOutputCap: pb(true)}}})
	loop.Timeout = 20 * time.Second
	start := time.Now()
	ex = runReq(t, stop, loop)
	if ex.ErrorCode != "ERR_OUTPUT_LIMIT" || !ex.Truncated || len(ex.Stdout) > 64<<10 || len(ex.Stdout) < 32<<10 || time.Since(start) > 15*time.Second {
		t.Fatalf("want output cap at 64 KiB: code %q truncated %v len %d", ex.ErrorCode, ex.Truncated, len(ex.Stdout))
	}
	if ex := run(t, stop, "python", "1 + 1"); mainText(ex) != "2" {
		t.Fatalf("sandbox unusable after output cap: %+v", ex)
	}
}

func TestRuncMemoryBomb(t *testing.T) {
	testutil.SkipUnderGVisor(t, "the host OOM killer ends the whole sandbox (the Sentry): TestGVisorMemoryBomb")
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 192 << 20}})
	other := newSandbox(t, m, sandbox.CreateOptions{})
	ex := runReq(t, s, sandbox.ExecuteRequest{Code: "a = []\nwhile True:\n    a.append(bytearray(16 << 20))", Timeout: 30 * time.Second})
	if ex.Status != sandbox.ExecError || ex.ErrorCode != "ERR_OUT_OF_MEMORY" || ex.Error == nil || ex.Error.Name != "OutOfMemoryError" {
		t.Fatalf("want out of memory, got status %s code %q error %+v", ex.Status, ex.ErrorCode, ex.Error)
	}
	if ex := run(t, other, "python", "sum(range(10))"); mainText(ex) != "45" {
		t.Fatalf("neighbour sandbox broken: %+v", ex)
	}
	if ex := run(t, s, "python", "'still ' + 'here'"); mainText(ex) != "'still here'" {
		t.Fatalf("sandbox unusable after OOM: %+v", ex)
	}
}

// TestRuncContextCwdUserCannotEnter: a code context asked to start in a
// directory its user ("user") may not enter, /root, runs there in every
// language, as E2B's do: the interpreter's own working directory is /root
// (getcwd names it), still as "user", who can read nothing in it; a
// restart keeps it there. Node under allow_subprocess: false starts
// through the seccomp helper, in /root too. A missing directory or a file
// is refused before any kernel starts.
func TestRuncContextCwdUserCannotEnter(t *testing.T) {
	testutil.SkipUnderGVisor(t, "allow_subprocess: false is refused under gVisor (TestGVisorSandbox)")
	m := runcEngine(t)
	ctx := context.Background()
	no := false
	s := newSandbox(t, m, sandbox.CreateOptions{})
	strict := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{AccessControl: &policy.AccessControl{AllowSubprocess: &no}}})
	code := map[string]string{
		"python":     "import os\ntry:\n    os.listdir('.'); r = 'listed'\nexcept PermissionError:\n    r = 'denied'\nprint(os.getcwd(), os.getuid(), r)",
		"javascript": "let r; try { require('fs').readdirSync('.'); r = 'listed' } catch (e) { r = e.code === 'EACCES' ? 'denied' : e.code }\nconsole.log(process.cwd(), process.getuid(), r)",
		"typescript": "let r: string; try { require('fs').readdirSync('.'); r = 'listed' } catch (e: any) { r = e.code === 'EACCES' ? 'denied' : e.code }\nconsole.log(process.cwd(), process.getuid!(), r)",
		"bash":       `if ls . >/dev/null 2>&1; then r=listed; else r=denied; fi; echo "$(pwd -P) $(id -u) $r"`,
	}
	for _, c := range []struct {
		s    *sandbox.Sandbox
		lang string
	}{{s, "python"}, {s, "javascript"}, {s, "typescript"}, {s, "bash"}, {strict, "javascript"}} {
		info, err := c.s.CreateContext(ctx, agentproto.ContextSpec{Language: c.lang, Cwd: "/root"})
		if err != nil {
			t.Fatalf("%s context in /root: %v", c.lang, err)
		}
		if info.Cwd != "/root" || info.Language != c.lang {
			t.Errorf("%s context: %+v", c.lang, info)
		}
		for i := range 2 {
			ex := runReq(t, c.s, sandbox.ExecuteRequest{ContextID: info.ID, Code: code[c.lang]})
			if ex.Stdout != "/root 1000 denied\n" {
				t.Errorf("%s context (restarts: %d): stdout %q, error %+v", c.lang, i, ex.Stdout, ex.Error)
			}
			if _, err := c.s.RestartContext(ctx, info.ID); err != nil {
				t.Fatalf("restart %s context: %v", c.lang, err)
			}
		}
		all, err := c.s.Contexts(ctx)
		if err != nil || !slices.ContainsFunc(all, func(l agentproto.ContextInfo) bool { return l.ID == info.ID && l.Cwd == "/root" }) {
			t.Errorf("listed contexts %+v (%v), want %s in /root", all, err, info.ID)
		}
		if err := c.s.DeleteContext(ctx, info.ID); err != nil {
			t.Error(err)
		}
	}
	for cwd, code := range map[string]apierr.Code{"/no/such/dir": apierr.NotFound, "/etc/passwd": apierr.BadRequest} {
		if _, err := s.CreateContext(ctx, agentproto.ContextSpec{Language: "python", Cwd: cwd}); apierr.CodeOf(err) != code || !strings.Contains(err.Error(), cwd) {
			t.Errorf("context in %s: %v, want %s naming it", cwd, err, code)
		}
	}
}
