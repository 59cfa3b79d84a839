package integration

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// e2bDir holds the E2B JS SDK suite: package.json pins e2b and
// @e2b/code-interpreter, package-lock.json is committed, node_modules is
// gitignored and reused while the lock file is unchanged.
const e2bDir = "../e2b"

// TestE2BJSSDK runs the unmodified official E2B JS SDKs (test/e2b) against
// the server: lifecycle, commands, files, the code interpreter and ten
// sandboxes at once.
func TestE2BJSSDK(t *testing.T) {
	s := start(t)
	nodejs.E2BSuite(t, e2bDir, s.url, e2bKey(t, s, "e2b-js-suite"), nil)
}

// TestOpenAINodeClient runs the official `openai` npm client, unchanged and
// configured only through its environment, against /v1: models, a chat
// completion as JSON and streamed, tool calls (plain and through the
// streaming helper) and typed errors (test/e2b/openai.test.mjs).
func TestOpenAINodeClient(t *testing.T) {
	s := start(t)
	node := nodejs.LookNode(t)
	nodejs.NpmCI(t, e2bDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "--test-timeout=300000", nodejs.OpenAITest)
	cmd.Dir = e2bDir
	cmd.Env = append(nodejs.Environ("E2B_", "OPENAI_"),
		"OPENAI_BASE_URL="+s.url+"/v1",
		"OPENAI_API_KEY="+s.key,
		"SHEEPFOLD_MODEL=scripted",
		"NO_COLOR=1",
	)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	sum := nodejs.Summary(out)
	if err != nil || sum["fail"] != 0 || sum["cancelled"] != 0 || sum["skipped"] != 0 || sum["pass"] < 6 || sum["pass"] != sum["tests"] {
		t.Fatalf("openai npm client: %v (summary %v)\n%s", err, sum, out)
	}
	t.Logf("openai npm client: %d tests passed", sum["pass"])
}

// e2bKey mints an e2b_ key for a new account named owner.
func e2bKey(t *testing.T, s *server, owner string) string {
	t.Helper()
	out, err := exec.Command(s.bin, "--data-dir", s.dataDir, "keys", "create", "--e2b", "--name", owner, "--owner", owner).CombinedOutput()
	if err != nil {
		t.Fatalf("keys create --e2b: %v\n%s", err, out)
	}
	key := regexp.MustCompile(`e2b_[0-9a-f]{40}`).FindString(string(out))
	if key == "" {
		t.Fatalf("keys create --e2b printed no e2b_ key: %s", out)
	}
	return key
}

// TestE2BPythonSDK runs E2B's own Python SDK (test/e2b/python/vendor: e2b
// 2.34.0 and e2b_code_interpreter 2.9.1, with the Debian packages
// scripts/setup.sh installs) against the server: seed 000's client
// (requests to /v1/chat/completions, the model's pandas group-by run by
// run_in_e2b on an uploaded orders.csv, the article's create-with-timeout
// / run_code loop / kill), then the SDK's files, commands, env vars, code
// contexts, charts and DataFrames, and AsyncSandbox.
func TestE2BPythonSDK(t *testing.T) {
	s := start(t)
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", "../e2b/python/vendor/e2b-python-2.34.0.tar.gz", "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("unpack the vendored SDK: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-m", "unittest", "-v", "test_e2b_python")
	cmd.Dir = "../e2b/python"
	cmd.Env = append(nodejs.Environ("E2B_", "HOLYSHEEP_", "PYTHON"),
		"PYTHONPATH="+filepath.Join(dir, "e2b-python", "site"),
		"E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url, "E2B_API_KEY="+e2bKey(t, s, "e2b-python-suite"),
		"HOLYSHEEP_URL="+s.url+"/v1/chat/completions", "HOLYSHEEP_KEY="+s.key)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "skipped") {
		t.Fatalf("E2B's Python SDK: %v\n%s", err, out)
	}
	t.Logf("%s", lastLines(out, 3))
}

// TestE2BJSSDKGVisor runs the E2B JS SDKs' core files (code, commands,
// files, terminals: nodejs.E2BCoreFiles) unmodified against the server
// for an account whose runtime the operator set to gvisor, locked
// (`sheepfold accounts set-runtime --lock`), on a server whose default is
// runc: every sandbox the suite makes runs under gVisor. Checked first:
// the account's sandbox runs on gVisor's kernel, not the host's, and a
// create asking for runc is refused (403 ERR_FORBIDDEN).
func TestE2BJSSDKGVisor(t *testing.T) {
	testutil.Runsc(t)
	s := start(t)
	key := e2bKey(t, s, "e2b-js-gvisor")
	if out, err := exec.Command(s.bin, "--data-dir", s.dataDir, "accounts", "set-runtime", "e2b-js-gvisor", "gvisor", "--lock").CombinedOutput(); err != nil {
		t.Fatalf("accounts set-runtime: %v\n%s", err, out)
	}
	c := client.New(s.url, key)
	ctx := context.Background()
	var ce *client.Error
	if _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: "runc"}); !errors.As(err, &ce) || ce.Code != "ERR_FORBIDDEN" {
		t.Fatalf("the gvisor account asking for runc: %v", err)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import os; os.uname().release"})
	c.Kill(context.WithoutCancel(ctx), sb.ID)
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	if err != nil || len(ex.Results) != 1 || ex.Results[0].Text == "'"+unix.ByteSliceToString(host.Release[:])+"'" {
		t.Fatalf("the account's sandbox is not under gVisor: %v %+v", err, ex)
	}
	nodejs.E2BFiles(t, e2bDir, s.url, key, nodejs.E2BCoreFiles, nil)
}
