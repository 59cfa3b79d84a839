package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runExample runs one of examples/ against the server, its model the
// scripted brain, and returns its output.
func runExample(t *testing.T, s *server, args ...string) string {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "SHEEPFOLD_API_KEY="+s.key, "SHEEPFOLD_URL="+s.url+"/v1", "SHEEPFOLD_MODEL=scripted")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestExampleBlackFriday: every ticket is answered by executed pandas
// code: totals per country, a PNG stock chart, the duplicates, an e-mail,
// and the time per ticket.
func TestExampleBlackFriday(t *testing.T) {
	s := start(t)
	dir := t.TempDir()
	out := runExample(t, s, "examples/black_friday.py", "--out", dir)
	for _, want := range []string{
		`(?m)^DE: \d+\.\d\d$`,
		`(?m)^low stock: `,
		`(?m)^3 duplicate orders: \d+, \d+, \d+$`,
		`(?m)^To: customer\d+@example\.com$`,
		`time per ticket: \d+ ms \(Sheepfold \d+ ms, model \d+ ms\)`,
		`(?m)^4 tickets in .* 0 failed`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	png, err := os.ReadFile(filepath.Join(dir, "chart_1.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("chart: %v (%d bytes)", err, len(png))
	}
	t.Logf("%s", lastLines([]byte(out), 2))
}

// TestExampleBlackFridayConcurrent: 4 clients, each with its own session,
// answer tickets at once with none failed (sheepfold bench sends 200 from 8).
func TestExampleBlackFridayConcurrent(t *testing.T) {
	s := start(t)
	out := runExample(t, s, "examples/black_friday.py", "--out", t.TempDir(), "--quiet", "--repeat", "5", "--concurrency", "4")
	if !regexp.MustCompile(`(?m)^20 tickets in .* 0 failed`).MatchString(out) {
		t.Fatalf("output:\n%s", out)
	}
	t.Logf("%s", lastLines([]byte(out), 2))
}

// TestExamplePolicyMonitor: a blocked import is seen by the monitor, an
// alert is raised and the session is terminated.
func TestExamplePolicyMonitor(t *testing.T) {
	s := start(t)
	out := runExample(t, s, "examples/policy_monitor.py")
	for _, want := range []string{
		"allowed: success 1.4142135623730951",
		"blocked: error ERR_MODULE_BLOCKED Module 'os' is blocked by security policy",
		"security_violation {'kind': 'module_blocked', 'target': 'os'}",
		"alert ", "session stopped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// TestExampleGo runs the Go example (examples/session).
func TestExampleGo(t *testing.T) {
	s := start(t)
	cmd := exec.Command("go", "run", "./examples/session")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "SHEEPFOLD_API_KEY="+s.key, "SHEEPFOLD_URL="+s.url+"/v1", "SHEEPFOLD_MODEL=scripted")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./examples/session: %v\n%s", err, out)
	}
	for _, want := range []string{"blocked: ERR_MODULE_BLOCKED Module 'os' is blocked by security policy",
		"step 1 ran: 3\n", "answer: Result: 3\n1 executions"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
