package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
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

// TestExampleBlackFridayConcurrent: the Must-hold load through
// black_friday.py's own path: 200 tickets (each of the 4 kinds 50 times)
// from 8 clients at once, each with its own session, the scripted model
// answering at once, none failed (sheepfold bench runs the same load and
// reports the time per ticket).
func TestExampleBlackFridayConcurrent(t *testing.T) {
	s := start(t)
	out := runExample(t, s, "examples/black_friday.py", "--out", t.TempDir(), "--quiet", "--repeat", "50", "--concurrency", "8")
	if !regexp.MustCompile(`(?m)^200 tickets in .* 0 failed`).MatchString(out) {
		t.Fatalf("output:\n%s", out)
	}
	t.Logf("%s", lastLines([]byte(out), 2))
}

// TestExampleBatchScore runs examples/batch_score.py: seed 000's
// scoring of documents as one batch through sheepfold.function's .map,
// every remote score equal to the function's own, the batch's usage
// reported.
func TestExampleBatchScore(t *testing.T) {
	s := start(t)
	out := runExample(t, s, "examples/batch_score.py", "--docs", "60")
	for _, want := range []string{
		`(?m)^scored 60 documents in [\d.]+ s \([\d.]+ docs/s\), 0 failed$`,
		`(?m)^  0\.\d{3}  \S.* #\d+$`,
		`(?m)^remote scores match local: True$`,
		// One execution per document: the code's check runs on the
		// host (its Python is the template's), in no sandbox.
		`(?m)^usage: [1-9] sandboxes, 60 executions, [\d.]+ CPU-s, [\d.]+ GB-s, cost \S+$`,
		`(?m)^one call: 0\.\d{3}$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	t.Logf("%s", lastLines([]byte(out), 7))
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

// TestExampleE2BWithLLM runs examples/e2b_with_llm.mjs: the openai npm
// client and the unmodified E2B code interpreter SDK against this one
// server, each configured only through its own environment; the scripted
// model calls run_code, the E2B SDK runs it, the answer is printed.
func TestExampleE2BWithLLM(t *testing.T) {
	s := start(t)
	node := nodejs.LookNode(t)
	nodejs.NpmCI(t, "../../examples")
	key := e2bKey(t, s, "e2b-with-llm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "e2b_with_llm.mjs")
	cmd.Dir = "../../examples"
	cmd.Env = append(nodejs.Environ("E2B_", "OPENAI_"),
		// One server, one key: the e2b_ key also authenticates /v1.
		"OPENAI_BASE_URL="+s.url+"/v1", "OPENAI_API_KEY="+key,
		"E2B_API_KEY="+key, "E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url,
		"SHEEPFOLD_MODEL=scripted")
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node e2b_with_llm.mjs: %v\n%s", err, out)
	}
	for _, want := range []string{
		`(?m)^question: How many distinct orders are in orders\.csv\?$`,
		`(?m)^step 1 ran run_code: 40$`,
		`(?m)^answer: Result: 40$`,
		`(?m)^1 executions, [1-9]\d* tokens, \d+ ms$`,
	} {
		if !regexp.MustCompile(want).MatchString(string(out)) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	// The chat went through the relay: the provider saw the tool result.
	var relayed bool
	for _, r := range model.Requests() {
		if n := len(r.Chat.Messages); n > 0 && r.Chat.Messages[n-1].Role == "tool" && strings.TrimSpace(r.Chat.Messages[n-1].Content) == "40" {
			relayed = true
		}
	}
	if !relayed {
		t.Errorf("the scripted provider never received the execution's output")
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
