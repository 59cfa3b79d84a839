// Package nodejs runs Node.js test suites from Go tests: the official
// E2B SDKs' suite (test/e2b), the openai npm client and the examples,
// against the local server (test/integration) and against a
// Kubernetes-backed one (test/kubernetes/e2e). Node and npm are required
// like the runtime: missing, they fail the test.
package nodejs

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

// LookNode finds node and checks it is new enough for the pinned SDKs.
func LookNode(t testing.TB) string {
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

// NpmCI installs the locked dependencies into dir/node_modules (test/e2b,
// examples) unless the install there already matches the lock file and
// node version. A lock serialises concurrent test runs in the same tree;
// npm's download cache lives in the test's temporary directory.
func NpmCI(t testing.TB, dir string) {
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
	cmd.Env = append(Environ("E2B_"), "npm_config_cache="+filepath.Join(t.TempDir(), "npm-cache"), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Environ is the environment without the caller's own variables of
// these prefixes (E2B_ and OPENAI_ settings, which would send the clients
// elsewhere), and without proxies for loopback.
func Environ(drop ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !slicesHasPrefix(kv, drop) {
			env = append(env, kv)
		}
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
}

func slicesHasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Summary reads the counters that node's spec reporter prints last
// ("ℹ tests 12", "ℹ pass 12", ...).
func Summary(out []byte) map[string]int {
	sum := map[string]int{}
	re := regexp.MustCompile(`(?m)^ℹ (tests|suites|pass|fail|cancelled|skipped|todo) (\d+)$`)
	for _, m := range re.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(m[2]))
		sum[string(m[1])] = n
	}
	return sum
}

// OpenAITest is the file of test/e2b that drives the openai npm client,
// not the E2B SDKs.
const OpenAITest = "openai.test.mjs"

// E2BSuite runs the unmodified official E2B JS SDKs' suite in dir
// (test/e2b) against the server at url with an e2b_ key: every file but
// OpenAITest, two at a time. Anything but every test passing fails t,
// except the known failures: test names (the start of their title) the
// caller knows to fail, with why. Each of those must fail (one that
// passes fails t too: the entry is stale), and nothing else may.
func E2BSuite(t testing.TB, dir, url, key string, known map[string]string) {
	t.Helper()
	all, err := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if err != nil || len(all) == 0 {
		t.Fatalf("no test files in %s (%v)", dir, err)
	}
	var files []string
	for _, f := range all {
		if f := filepath.Base(f); f != OpenAITest {
			files = append(files, f)
		}
	}
	E2BFiles(t, dir, url, key, files, known)
}

// E2BCoreFiles are the files of the suite that drive what runs in a
// sandbox (code, commands, files, terminals), for a second pass under
// another runtime where the whole suite would take too long.
var E2BCoreFiles = []string{"code.test.mjs", "commands.test.mjs", "files.test.mjs", "pty.test.mjs"}

// E2BFiles runs the named test files of the suite in dir, as E2BSuite
// runs them all; a file that does not exist fails t.
func E2BFiles(t testing.TB, dir, url, key string, files []string, known map[string]string) {
	t.Helper()
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("E2B suite file %s: %v", f, err)
		}
	}
	node := LookNode(t)
	NpmCI(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	// Two test files at a time (the CI machine has two cores); inside a file
	// tests run in order. Each test has its own timeout; the last flag bounds
	// any test that forgot one.
	args := append([]string{"--test", "--test-concurrency=2", "--test-reporter=spec", "--test-timeout=600000"}, files...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = dir
	cmd.Env = append(Environ("E2B_"),
		"E2B_API_KEY="+key,
		"E2B_API_URL="+url,
		"E2B_SANDBOX_URL="+url,
		"NO_COLOR=1",
	)
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("node --test took %s", time.Since(start).Round(time.Second))
	sum := Summary(out)
	failed := regexp.MustCompile(`(?m)^\s*✖ (.+?)(?: \([0-9.]+m?s\))?$`).FindAllSubmatch(out, -1)
	unknown := 0
	seen := map[string]bool{}
	for _, f := range failed {
		name := string(f[1])
		if name == "failing tests:" {
			continue
		}
		k := knownAs(name, known)
		if k == "" {
			unknown++
		} else {
			seen[k] = true
		}
	}
	for k, why := range known {
		if !seen[k] {
			t.Errorf("E2B JS SDK suite: %q, known to fail (%s), did not fail: drop it from the known failures", k, why)
		}
	}
	if unknown > 0 || sum["fail"] != len(known) || sum["cancelled"] != 0 || sum["skipped"] != 0 || sum["todo"] != 0 || sum["pass"] == 0 ||
		sum["pass"]+len(known) != sum["tests"] || (err != nil && len(known) == 0) {
		t.Fatalf("E2B JS SDK suite: %v (summary %v, known failures %d)\n%s", err, sum, len(known), out)
	}
	t.Logf("E2B JS SDK suite: %d tests passed, %d known failures", sum["pass"], len(known))
	for k, why := range known {
		t.Logf("known failure %q: %s", k, why)
	}
}

// knownAs returns the known failure name starts with, or "".
func knownAs(name string, known map[string]string) string {
	for k := range known {
		if strings.HasPrefix(name, k) {
			return k
		}
	}
	return ""
}
