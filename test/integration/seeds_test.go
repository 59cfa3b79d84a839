package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// seedSandboxConfig is seed 002's sandbox_config, verbatim.
var seedSandboxConfig = map[string]any{
	"max_execution_time":         30,
	"max_memory_mb":              512,
	"allowed_modules":            []string{"json", "math", "re", "datetime"},
	"network_restricted":         true,
	"filesystem_readonly":        false,
	"filesystem_paths_whitelist": []string{"/tmp/sandbox/", "/var/tmp/"},
}

// accountKey makes an account of its own (through an admin key of the
// CLI) and returns a key of it.
func accountKey(t *testing.T, s *server, name string) string {
	t.Helper()
	out, err := exec.Command(s.bin, "--data-dir", s.dataDir, "keys", "create", "--admin", "--name", name+"-admin").CombinedOutput()
	if err != nil {
		t.Fatalf("keys create --admin: %v: %s", err, out)
	}
	admin := client.New(s.url, regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out)))
	ctx := context.Background()
	if _, err := admin.CreateAccount(ctx, name, nil); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, client.KeyRequest{Account: name, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return k.Key
}

// rest posts a JSON body with a key and returns the status and the
// decoded answer.
func rest(t *testing.T, s *server, key, path string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.url+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return res.StatusCode, m
}

// TestExampleSeed002 runs seed 002's workflow (examples/seed002_sandboxing.py,
// the article's code with only its import, its URL and its lost '#'
// markers changed) against the real server: the session, the execution,
// the recommended policy applied as written, the blocked import seen by
// the monitor, the alert and the terminated session, usage and credits.
func TestExampleSeed002(t *testing.T) {
	s := start(t)
	key := accountKey(t, s, "seed-workflow")
	cmd := exec.Command("/usr/bin/python3", "examples/seed002_sandboxing.py")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "YOUR_HOLYSHEEP_API_KEY="+key, "HOLYSHEEP_BASE_URL="+s.url+"/v1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the seed's workflow: %v\n%s", err, out)
	}
	for _, want := range []string{
		`(?m)^Session sandboxée créée: \S+$`,
		`(?m)^Résultat: Résultat: 4\.0$`,
		`(?m)^Statut: success$`,
		`(?m)^Temps d'exécution: [0-9.]+ms$`,
		`(?m)^Erreur: ERR_MODULE_BLOCKED: Module 'os' is blocked by security policy$`,
		`(?m)^\[[0-9-]+ [0-9:.+]+\] policy\.changed: .*'memory_mb': 256`,
		`(?m)^\[[0-9-]+ [0-9:.+]+\] security_violation: \{'kind': 'module_blocked', 'target': 'os'\}$`,
		`(?m)^\[[0-9-]+ [0-9:.+]+\] sandbox\.stopped: `,
		`(?m)^Usage actuel: \d+/ (\d+|None)$`,
		`(?m)^Crédits gratuits restants: `,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	c := client.New(s.url, key)
	alerts, err := c.Alerts(context.Background(), false)
	if err != nil || len(alerts) != 1 || alerts[0].Severity != "high" || !strings.HasPrefix(alerts[0].Message, "Violation détectée: ") {
		t.Fatalf("alerts %+v, %v", alerts, err)
	}
}

// TestSeed002ErrorsGoSDK: the seed's five error cases give the seed's
// codes and messages through the Go SDK (typed errors) and the REST API.
// The Python SDK's are in sdk/python/tests/test_e2e.py (TestSeed002Errors).
func TestSeed002ErrorsGoSDK(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key := accountKey(t, s, "seed-errors-go")
	c := client.New(s.url, key)

	// Error 1: a wrong key.
	_, err := client.New(s.url, "votre_cle_incorrecte").CreateSession(ctx, client.SessionRequest{Model: "claude-sonnet-4.5"})
	var apiErr *client.Error
	if !errors.Is(err, client.ErrAuthenticationFailed) || !errors.As(err, &apiErr) || apiErr.Status != 401 ||
		apiErr.Message != "Authentication failed. Invalid API key" {
		t.Fatalf("a wrong key: %v", err)
	}
	if st, m := rest(t, s, "votre_cle_incorrecte", "/v1/sessions", map[string]any{"model": "claude-sonnet-4.5"}); st != 401 ||
		m["error"].(map[string]any)["code"] != "ERR_AUTHENTICATION_FAILED" {
		t.Fatalf("REST, a wrong key: %d %v", st, m)
	}

	sess, err := c.CreateSession(ctx, client.SessionRequest{Model: "claude-sonnet-4.5", SandboxConfig: seedSandboxConfig})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), sess.ID)

	// Error 2: the endless print loop runs to the session's 30 s.
	loop := "\n# Code qui boucle infiniment\nwhile True:\n    print(\"Boucle infinie\")\n"
	ex, err := c.SessionExecute(ctx, sess.ID, client.SessionExecuteRequest{Code: loop, Language: "python"})
	if err != nil || ex.Status != "timeout" || !errors.Is(ex.Err(), client.ErrSandboxTimeout) ||
		ex.Error.Message != "Sandbox execution timeout after 30000ms" || !strings.Contains(ex.Output, "[output truncated at") {
		t.Fatalf("the loop: %+v, %v", ex.Error, err)
	}

	// Error 3: a blocked module, through the REST API too.
	blocked := "\nimport os\nprint(os.listdir('/'))\n"
	ex, err = c.SessionExecute(ctx, sess.ID, client.SessionExecuteRequest{Code: blocked, Language: "python"})
	if err != nil || !errors.Is(ex.Err(), client.ErrModuleBlocked) || ex.Error.Message != "Module 'os' is blocked by security policy" {
		t.Fatalf("blocked module: %+v, %v", ex.Error, err)
	}
	if st, m := rest(t, s, key, "/v1/sessions/"+sess.ID+"/execute", map[string]any{"code": blocked, "language": "python"}); st != 200 ||
		m["error"].(map[string]any)["code"] != "ERR_MODULE_BLOCKED" {
		t.Fatalf("REST, blocked module: %d %v", st, m)
	}

	// Error 4: the model's monthly quota (1 token here) used up by one
	// ask: the next session of that model is refused at create.
	if _, err := c.Ask(ctx, sess.ID, client.AskRequest{Prompt: "SAY: bonjour"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateSession(ctx, client.SessionRequest{Model: "claude-sonnet-4.5"})
	if !errors.Is(err, client.ErrSessionQuotaExceeded) || !errors.As(err, &apiErr) || apiErr.Status != 429 ||
		apiErr.Message != "Monthly quota exceeded for model claude-sonnet-4.5" {
		t.Fatalf("past the quota: %v", err)
	}
	if st, m := rest(t, s, key, "/v1/sessions", map[string]any{"model": "claude-sonnet-4.5"}); st != 429 ||
		m["error"].(map[string]any)["message"] != "Monthly quota exceeded for model claude-sonnet-4.5" {
		t.Fatalf("REST, past the quota: %d %v", st, m)
	}
	cheap, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2"})
	if err != nil {
		t.Fatalf("the seed's economical model: %v", err)
	}
	c.DeleteSession(ctx, cheap.ID)

	// Error 5: the network, by name and by address, from Python, Node
	// and a shell command, in a session with network_restricted.
	restricted, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2", SandboxConfig: map[string]any{"network_restricted": true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), restricted.ID)
	for _, tc := range []struct{ lang, code, target string }{
		{"python", "\nimport urllib.request\nresponse = urllib.request.urlopen('https://api.example.com')\n", "api.example.com"},
		{"python", "import socket\nsocket.create_connection(('203.0.113.7', 80), timeout=5)", "203.0.113.7:80"},
		{"javascript", "const dns = require('dns');\nawait dns.promises.lookup('api.example.com');", "api.example.com"},
		{"javascript", "const net = require('net');\nawait new Promise((ok, ko) => net.connect(80, '203.0.113.7', ok).on('error', ko));", "203.0.113.7:80"},
		{"bash", "curl -sS --max-time 5 https://api.example.com", "api.example.com"},
	} {
		ex, err := c.SessionExecute(ctx, restricted.ID, client.SessionExecuteRequest{Code: tc.code, Language: tc.lang})
		if err != nil || ex.Status != "error" || !errors.Is(ex.Err(), client.ErrNetworkRestricted) ||
			ex.Error.Message != "Network access is restricted in sandbox mode" {
			t.Errorf("%s %q: %+v (output %q), %v", tc.lang, tc.code, ex.Error, ex.Output, err)
			continue
		}
		v1, err := c.Execute(ctx, restricted.ID, client.ExecuteRequest{Code: tc.code, Language: tc.lang})
		if err != nil || v1.ErrorCode != string(client.ErrNetworkRestricted) {
			t.Errorf("/v1 execute, %s %q: %+v, %v", tc.lang, tc.code, v1, err)
		}
		evs, err := c.ListEvents(ctx, client.EventQuery{SandboxID: restricted.ID, Types: []string{"security_violation"}, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range evs.Events {
			found = found || e.Details["kind"] == "network_denied" && e.Details["target"] == tc.target
		}
		if !found {
			t.Errorf("%s %q: no network_denied event for %s in %+v", tc.lang, tc.code, tc.target, evs.Events)
		}
	}

	// The seed's way out: a session with network_restricted false has a
	// network (an interface besides lo; its calls are not refused as
	// restricted).
	_, err = c.CreateSession(ctx, client.SessionRequest{Model: "claude-sonnet-4.5", SandboxConfig: map[string]any{"network_restricted": false}})
	if err == nil || !errors.Is(err, client.ErrSessionQuotaExceeded) {
		t.Fatalf("the seed's last example names the model past its quota: %v", err)
	}
	open, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2", SandboxConfig: map[string]any{"network_restricted": false}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), open.ID)
	pol, err := c.GetPolicy(ctx, open.ID)
	if err != nil || !strings.Contains(string(pol.Policy), `"mode":"public"`) {
		t.Fatalf("policy %s, %v", pol.Policy, err)
	}
	ex, err = c.SessionExecute(ctx, open.ID, client.SessionExecuteRequest{Code: "import os\nprint(sorted(os.listdir('/sys/class/net')))\n" +
		"import urllib.request\ntry:\n    urllib.request.urlopen('https://api.example.com', timeout=5)\nexcept Exception as e:\n    print(type(e).__name__)"})
	if err != nil || ex.Status != "success" || !regexp.MustCompile(`\['\w+', 'lo'\]|\['lo', '\w+'\]`).MatchString(ex.Output) ||
		strings.Contains(ex.Output, "NetworkRestricted") {
		t.Fatalf("network_restricted false: %+v %q, %v", ex.Error, ex.Output, err)
	}
}

// seedPolicy is seed 002's recommended security_policy, verbatim.
const seedPolicy = `{
    "resource_limits": {
        "cpu_time_seconds": 10,
        "memory_mb": 256,
        "disk_write_mb": 50,
        "network_requests": 5,
        "file_size_upload_mb": 10
    },
    "access_control": {
        "allow_subprocess": False,
        "allow_import_system": False,
        "allowed_imports": [
            "json", "math", "random", "datetime", 
            "re", "collections", "itertools", "functools"
        ],
        "blocked_modules": [
            "os", "sys", "subprocess", "socket",
            "urllib", "requests", "ctypes", "sqlite3"
        ]
    },
    "output_filtering": {
        "max_output_length": 10000,
        "strip_sensitive_data": True,
        "sanitize_errors": True
    },
    "rate_limiting": {
        "requests_per_minute": 60,
        "concurrent_sessions": 5
    }
}`

// TestSeedPolicyFieldsGoSDK: seed 002's policy applied verbatim to a
// running session of the seed's sandbox_config on a real server, each
// field doing what its name says: memory and disk lowered on the live
// sandbox, the filesystem rules of sandbox_config kept, uploads over
// 10 MiB refused, the 61st execution of a minute refused, a sixth
// running session of the account refused.
func TestSeedPolicyFieldsGoSDK(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := client.New(s.url, accountKey(t, s, "seed-policy-go"))
	sess, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2", SandboxConfig: seedSandboxConfig})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), sess.ID)
	if sess.Resources.MemoryMB != 512 {
		t.Fatalf("created with %+v", sess.Resources)
	}
	// The article's dict, in Python: True and False become JSON.
	body := strings.NewReplacer("True", "true", "False", "false").Replace(seedPolicy)
	ans, err := c.SetPolicy(ctx, sess.ID, json.RawMessage(body))
	if err != nil {
		t.Fatalf("the seed's policy: %v", err)
	}
	if !strings.Contains(string(ans.Policy), `"writable_paths":["/tmp/sandbox/","/var/tmp/"]`) {
		t.Fatalf("the filesystem rules of sandbox_config are lost: %s", ans.Policy)
	}
	got, err := c.GetSession(ctx, sess.ID)
	if err != nil || got.Resources.MemoryMB != 256 || got.Resources.DiskMB != 50 {
		t.Fatalf("resources after the policy: %+v, %v", got.Resources, err)
	}
	// file_size_upload_mb: 10 MiB.
	if _, err := c.WriteFile(ctx, sess.ID, "/tmp/sandbox/big.bin", bytes.NewReader(make([]byte, 11<<20))); !errors.Is(err, client.ErrFileTooLarge) {
		t.Fatalf("an 11 MiB upload: %v", err)
	}
	if _, err := c.WriteFile(ctx, sess.ID, "/tmp/sandbox/ok.bin", bytes.NewReader(make([]byte, 1<<20))); err != nil {
		t.Fatalf("a 1 MiB upload: %v", err)
	}
	// requests_per_minute: a minute's worth (60) at once, and one more
	// each second, then ERR_RATE_LIMITED.
	var last error
	began, n := time.Now(), 0
	for ; n < 200 && last == nil; n++ {
		_, last = c.SessionExecute(ctx, sess.ID, client.SessionExecuteRequest{Code: "1"})
	}
	if !errors.Is(last, client.ErrRateLimited) || n-1 < 60 || float64(n-1) > 61+time.Since(began).Seconds() {
		t.Fatalf("after %d executions in %s: %v", n-1, time.Since(began), last)
	}
	// concurrent_sessions: 5 running sessions of the account.
	for i := 0; i < 4; i++ {
		o, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2"})
		if err != nil {
			t.Fatalf("session %d of 5: %v", i+2, err)
		}
		defer c.DeleteSession(context.Background(), o.ID)
	}
	if _, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-v3.2"}); !errors.Is(err, client.ErrRateLimited) {
		t.Fatalf("a sixth session: %v", err)
	}
}
