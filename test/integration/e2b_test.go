package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// e2bDir holds the E2B JS SDK suite: package.json pins e2b and
// @e2b/code-interpreter, package-lock.json is committed, node_modules is
// gitignored and reused while the lock file is unchanged.
const e2bDir = "../e2b"

// TestE2BJSSDK runs the unmodified official E2B JS SDKs (test/e2b) against
// the server: lifecycle, commands, files, the code interpreter and ten
// sandboxes at once. Node and npm are required like the runtime and the
// template: missing, they fail the test.
func TestE2BJSSDK(t *testing.T) {
	s := start(t)
	node := lookNode(t)

	key := e2bKey(t, s, "e2b-js-suite")
	npmCI(t, e2bDir)

	all, err := filepath.Glob(filepath.Join(e2bDir, "*.test.mjs"))
	if err != nil || len(all) == 0 {
		t.Fatalf("no test files in %s (%v)", e2bDir, err)
	}
	var files []string
	for _, f := range all {
		if f := filepath.Base(f); f != openAITest { // TestOpenAINodeClient's
			files = append(files, f)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	// Two test files at a time (the CI machine has two cores); inside a file
	// tests run in order. Each test has its own timeout; the last flag bounds
	// any test that forgot one.
	args := append([]string{"--test", "--test-concurrency=2", "--test-reporter=spec", "--test-timeout=600000"}, files...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = e2bDir
	cmd.Env = append(e2bEnviron(),
		"E2B_API_KEY="+key,
		"E2B_API_URL="+s.url,
		"E2B_SANDBOX_URL="+s.url,
		"NO_COLOR=1",
	)
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("node --test took %s", time.Since(start).Round(time.Second))
	sum := nodeSummary(out)
	if err != nil || sum["fail"] != 0 || sum["cancelled"] != 0 || sum["skipped"] != 0 || sum["todo"] != 0 || sum["pass"] == 0 || sum["pass"] != sum["tests"] {
		t.Fatalf("E2B JS SDK suite: %v (summary %v)\n%s", err, sum, out)
	}
	t.Logf("E2B JS SDK suite: %d tests passed", sum["pass"])
}

// openAITest is the file of test/e2b that drives the openai npm client.
const openAITest = "openai.test.mjs"

// TestOpenAINodeClient runs the official `openai` npm client, unchanged and
// configured only through its environment, against /v1: models, a chat
// completion as JSON and streamed, tool calls (plain and through the
// streaming helper) and typed errors (test/e2b/openai.test.mjs).
func TestOpenAINodeClient(t *testing.T) {
	s := start(t)
	node := lookNode(t)
	npmCI(t, e2bDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "--test-timeout=300000", openAITest)
	cmd.Dir = e2bDir
	cmd.Env = append(openAIEnviron(),
		"OPENAI_BASE_URL="+s.url+"/v1",
		"OPENAI_API_KEY="+s.key,
		"SHEEPFOLD_MODEL=scripted",
		"NO_COLOR=1",
	)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	sum := nodeSummary(out)
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

// lookNode finds node and checks it is new enough for the pinned SDKs.
func lookNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (install Node.js >= 20.18.1): %v", err)
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatalf("npm not found: %v", err)
	}
	v, err := exec.Command(node, "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	m := regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)`).FindStringSubmatch(strings.TrimSpace(string(v)))
	if m == nil {
		t.Fatalf("node --version printed %q", v)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	patch, _ := strconv.Atoi(m[3])
	if major < 20 || major == 20 && (minor < 18 || minor == 18 && patch < 1) || major == 21 {
		t.Fatalf("node %s is too old for e2b@2.51.0 (needs >=20.18.1 <21 or >=22)", strings.TrimSpace(string(v)))
	}
	return node
}

// npmCI installs the locked dependencies into dir/node_modules (test/e2b,
// examples) unless the install there already matches the lock file and
// node version. A lock serialises concurrent test runs in the same tree;
// npm's download cache lives in the test's temporary directory.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatalf("read lock file: %v", err)
	}
	nodeVersion, _ := exec.Command("node", "--version").Output()
	sum := sha256.Sum256(append(lock, nodeVersion...))
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".sheepfold-installed")

	lf, err := os.OpenFile(filepath.Join(os.TempDir(), "sheepfold-e2b-npm.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("flock: %v", err)
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)

	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	cmd.Env = append(e2bEnviron(), "npm_config_cache="+filepath.Join(t.TempDir(), "npm-cache"), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
}

// e2bEnviron is the environment without anything that would send the SDK
// elsewhere: E2B_* settings of the caller's own, and proxies for loopback.
func e2bEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "E2B_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
}

// openAIEnviron is the environment without the caller's own OPENAI_*
// settings, and without proxies for loopback.
func openAIEnviron() []string {
	var env []string
	for _, kv := range e2bEnviron() {
		if !strings.HasPrefix(kv, "OPENAI_") {
			env = append(env, kv)
		}
	}
	return env
}

// nodeSummary reads the counters that node's spec reporter prints last
// ("ℹ tests 12", "ℹ pass 12", ...).
func nodeSummary(out []byte) map[string]int {
	sum := map[string]int{}
	re := regexp.MustCompile(`(?m)^ℹ (tests|suites|pass|fail|cancelled|skipped|todo) (\d+)$`)
	for _, m := range re.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(m[2]))
		sum[string(m[1])] = n
	}
	return sum
}
