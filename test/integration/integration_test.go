// Package integration drives a real `sheepfold serve` (runc sandboxes from
// the python template) over loopback through the Go SDK, the Python SDK and
// the CLI. It needs root, the runtime and the template, like CI has.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// server is one running `sheepfold serve` with its own data dir.
type server struct {
	url, key string
	bin      string // the sheepfold binary
	dataDir  string
}

var (
	srvOnce sync.Once
	srv     *server
	srvErr  error
	stop    func()
	model   *llmtest.Server // the sessions' scripted model
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stop != nil {
		stop()
	}
	os.Exit(code)
}

func build(dir string) error {
	for _, b := range []struct{ out, pkg, cgo string }{
		{"sheepfold", "./cmd/sheepfold", "1"},
		{"sheepfold-agent", "./cmd/sheepfold-agent", "0"},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// start builds the binaries and starts one server for the whole package.
func start(t *testing.T) *server {
	t.Helper()
	testutil.RequireRoot(t)
	runc := testutil.Runc(t)
	templates := filepath.Dir(testutil.TemplateRootFS(t, "python"))
	srvOnce.Do(func() { srv, srvErr = launch(runc, filepath.Dir(templates)) })
	if srvErr != nil {
		t.Fatal(srvErr)
	}
	return srv
}

func launch(runc, templates string) (*server, error) {
	dir, err := os.MkdirTemp("", "sfint")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	s := &server{bin: filepath.Join(dir, "bin", "sheepfold"), dataDir: dir}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return nil, err
	}
	if err := build(filepath.Join(dir, "bin")); err != nil {
		return nil, err
	}
	if err := os.Symlink(runc, filepath.Join(dir, "bin", "runc")); err != nil {
		return nil, err
	}
	// CRIU beside runc (the set-up builds both): pause and resume.
	if err := os.Symlink(filepath.Join(filepath.Dir(runc), "criu"), filepath.Join(dir, "bin", "criu")); err != nil {
		return nil, err
	}
	// gVisor's runsc too, where the set-up built it beside runc: the
	// accounts that ask for it (TestE2BJSSDKGVisor).
	if runsc := filepath.Join(filepath.Dir(runc), "runsc"); fileExists(runsc) {
		if err := os.Symlink(runsc, filepath.Join(dir, "bin", "runsc")); err != nil {
			return nil, err
		}
	}
	if err := os.Symlink(templates, filepath.Join(dir, "templates")); err != nil {
		return nil, err
	}
	out, err := exec.Command(s.bin, "--data-dir", dir, "keys", "create", "--name", "integration").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("keys create: %v: %s", err, out)
	}
	s.key = regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s.url = "http://" + addr
	// The model of sessions: the scripted brain on loopback, as a provider
	// of the config file (the examples' tests use it).
	model = llmtest.New(llmtest.Brain)
	model.RequireKey("sk-scripted")
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
[[providers]]
name = "scripted"
base_url = %q
api_key_env = "SCRIPTED_MODEL_KEY"
models = ["scripted"]
price_input_per_mtok = 0.27
price_output_per_mtok = 1.10
timeout_seconds = 30

# The seeds' model names, served by the same scripted brain: seed 002's
# sessions name claude-sonnet-4.5 (with a monthly quota of one token, so
# that one ask uses it up: error 4) and deepseek-v3.2.
[[providers]]
name = "seeds"
base_url = %q
api_key_env = "SCRIPTED_MODEL_KEY"
models = ["deepseek-v3.2", "deepseek-chat"]
price_input_per_mtok = 0.42
price_output_per_mtok = 0.42
timeout_seconds = 30

[[providers]]
name = "seeds-quota"
base_url = %q
api_key_env = "SCRIPTED_MODEL_KEY"
models = ["claude-sonnet-4.5"]
price_input_per_mtok = 15
price_output_per_mtok = 15
monthly_token_quota = 1
timeout_seconds = 30
`, model.URL, model.URL, model.URL)), 0o600); err != nil {
		return nil, err
	}
	// The webhook receivers of the tests (Go and Python) are on loopback,
	// which the operator must allow.
	// A short auto-pause notice: test/e2b's auto-pause case waits for it.
	cmd := exec.Command(s.bin, "--data-dir", dir, "serve", "--listen", addr, "--config", config, "--preview-domain", "localhost",
		"--webhook-allow-cidr", "127.0.0.0/8", "--auto-pause-notice", "2s")
	cmd.Env = append(os.Environ(), "SCRIPTED_MODEL_KEY=sk-scripted")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		model.Close()
		os.RemoveAll(dir)
	}
	c := client.New(s.url, s.key)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.Version(context.Background()); err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("server did not start: %s", log.String())
		}
	}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("error %v, want %s", err, code)
	}
}

const orders = "order_id,country,amount,sku\n1,DE,10.5,A\n2,FR,20,B\n3,DE,5,A\n4,US,7.25,C\n4,US,7.25,C\n"

func TestBlackFridayTicketGoSDK(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	c := client.New(s.url, s.key)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "orders.csv", strings.NewReader(orders)); err != nil {
		t.Fatal(err)
	}
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import pandas as pd\ndf = pd.read_csv('orders.csv')\nlen(df)"})
	if err != nil || ex.Status != "success" {
		t.Fatalf("first execution: %v %+v", err, ex)
	}
	var stdout strings.Builder
	ex, err = c.ExecuteStream(ctx, sb.ID, client.ExecuteRequest{Code: `
import matplotlib.pyplot as plt
by = df.groupby("country").amount.sum()
print("duplicates:", int(df.duplicated().sum()))
by.plot(kind="bar", title="revenue by country")
plt.show()
df.drop_duplicates().to_csv("clean.csv", index=False)
by.to_frame()`}, client.ExecuteHandlers{OnStdout: func(s string) { stdout.WriteString(s) }})
	if err != nil || ex.Status != "success" {
		t.Fatalf("second execution: %v %+v", err, ex)
	}
	if stdout.String() != "duplicates: 1\n" {
		t.Fatalf("streamed stdout %q", stdout.String())
	}
	var png, html bool
	for _, r := range ex.Results {
		if b, err := base64.StdEncoding.DecodeString(r.PNG); err == nil && bytes.HasPrefix(b, []byte("\x89PNG")) {
			png = true
		}
		html = html || strings.Contains(r.HTML, "<table")
	}
	if !png || !html {
		t.Fatalf("want a PNG chart and an HTML table: %+v", ex.Results)
	}
	clean, err := c.ReadFile(ctx, sb.ID, "clean.csv")
	if err != nil || strings.Count(string(clean), "\n") != 5 {
		t.Fatalf("download: %v %q", err, clean)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1"})
	var ce *client.Error
	if !errors.As(err, &ce) || (ce.Code != "ERR_SANDBOX_STATE" && ce.Code != "ERR_SANDBOX_NOT_FOUND") {
		t.Fatalf("execute after kill: %v", err)
	}
}

func TestPythonSDK(t *testing.T) {
	s := start(t)
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_e2e")
	cmd.Dir = "../../sdk/python/tests"
	out, err := exec.Command(s.bin, "--data-dir", s.dataDir, "keys", "create", "--admin", "--name", "python-sdk-admin").CombinedOutput()
	if err != nil {
		t.Fatalf("keys create --admin: %v: %s", err, out)
	}
	admin := regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out))
	cmd.Env = append(os.Environ(), "PYTHONPATH=..", "SHEEPFOLD_E2E_URL="+s.url, "SHEEPFOLD_E2E_KEY="+s.key, "SHEEPFOLD_E2E_ADMIN_KEY="+admin)
	out, err = cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python SDK end-to-end: %v\n%s", err, out)
	}
	t.Logf("%s", lastLines(out, 3))
}

func TestBadInput(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	c := client.New(s.url, s.key)
	_, err := client.New(s.url, "sf_"+strings.Repeat("0", 40)).ListSandboxes(ctx, false)
	wantCode(t, err, "ERR_AUTHENTICATION_FAILED")
	_, err = c.GetSandbox(ctx, "nope")
	wantCode(t, err, "ERR_SANDBOX_NOT_FOUND")
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	_, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1", Language: "cobol"})
	wantCode(t, err, "ERR_UNSUPPORTED_LANGUAGE")
	// ".." stops at the sandbox's root: this lands in its own /tmp.
	marker := fmt.Sprintf("/tmp/sheepfold-escape-%d", os.Getpid())
	fi, err := c.WriteFile(ctx, sb.ID, "../../../.."+marker, strings.NewReader("x"))
	if err != nil || fi.Path != marker {
		t.Fatalf("escape write: %v %+v", err, fi)
	}
	if _, err := os.Stat(marker); err == nil {
		os.Remove(marker)
		t.Fatal("the write reached the host")
	}
	// The sandbox user may not write the template's /etc.
	_, err = c.WriteFile(ctx, sb.ID, "/etc/passwd", strings.NewReader("x"))
	wantCode(t, err, "ERR_PATH_NOT_ALLOWED")
	_, err = c.WriteFile(ctx, sb.ID, "big", bytes.NewReader(make([]byte, 101<<20)))
	wantCode(t, err, "ERR_FILE_TOO_LARGE")
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "while True: pass", Timeout: time.Second})
	if err != nil || ex.Status != "timeout" || ex.ErrorCode != "ERR_SANDBOX_TIMEOUT" {
		t.Fatalf("timeout: %v %+v", err, ex)
	}
	// Malformed JSON, straight over HTTP.
	out, _ := exec.Command("curl", "-s", "-H", "Authorization: Bearer "+s.key, "-d", "{not json", s.url+"/v1/sandboxes").Output()
	if !bytes.Contains(out, []byte("ERR_BAD_REQUEST")) {
		t.Fatalf("malformed JSON: %s", out)
	}
}

func TestTwentyParallelSandboxes(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	c := client.New(s.url, s.key)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			defer c.Kill(ctx, sb.ID)
			ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: fmt.Sprintf("n = %d\nn * 2", i)})
			if err != nil || len(ex.Results) == 0 || ex.Results[0].Text != fmt.Sprint(i*2) {
				errs <- fmt.Errorf("sandbox %d: %v %+v", i, err, ex)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCLIRun(t *testing.T) {
	s := start(t)
	cmd := exec.Command(s.bin, "--data-dir", s.dataDir, "run", "--lang", "python", "-")
	cmd.Stdin = strings.NewReader("print(6*7)\n")
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "42\n" {
		t.Fatalf("sheepfold run: %v %q", err, out)
	}
	cmd = exec.Command(s.bin, "--data-dir", s.dataDir, "run", "--timeout", "1s", "-")
	cmd.Stdin = strings.NewReader("while True: pass\n")
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 124 || !bytes.Contains(out, []byte("ERR_SANDBOX_TIMEOUT")) {
		t.Fatalf("timeout: exit %d %q", cmd.ProcessState.ExitCode(), out)
	}
}

func lastLines(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestCLIAgainstServer(t *testing.T) {
	s := start(t)
	cli := func(stdin string, args ...string) (string, int) {
		cmd := exec.Command(s.bin, args...)
		cmd.Env = append(os.Environ(), "SHEEPFOLD_URL="+s.url, "SHEEPFOLD_API_KEY="+s.key)
		cmd.Stdin = strings.NewReader(stdin)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := cli("", "sandbox", "create", "--timeout", "1m")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) == 0 {
		t.Fatalf("sandbox create: %d %q", code, out)
	}
	if out, code = cli("x = 41\n", "exec", id, "-"); code != 0 {
		t.Fatalf("exec: %d %q", code, out)
	}
	if out, code = cli("x + 1\n", "exec", id); code != 0 || out != "42\n" {
		t.Fatalf("exec state: %d %q", code, out)
	}
	if out, code = cli("1/0\n", "exec", id); code != 1 || !strings.Contains(out, "ZeroDivisionError") {
		t.Fatalf("exec error: %d %q", code, out)
	}
	if out, _ = cli("", "sandbox", "list"); !strings.Contains(out, id) {
		t.Fatalf("list: %q", out)
	}
	if out, code = cli("", "sandbox", "kill", id); code != 0 {
		t.Fatalf("kill: %d %q", code, out)
	}
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}
