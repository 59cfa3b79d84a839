package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// TestDashboardSecrets: the dashboard's secrets view (web/src/secrets.ts)
// in Chromium lists the account's secrets with their use counts and last
// use, and a secret's recent uses (sandbox, host, method, path, time,
// outcome) as the gateway recorded them; another account's secret of
// the same name and its uses are not shown, and no page or answer the
// page received holds a value.
func TestDashboardSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	const value = "sk-DASHBOARD-7c6b5a4d3e2f"
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "openai", "value": value}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "gh-token", "value": "ghp-unused-0000"}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/secrets", e.keyB, map[string]any{"name": "openai", "value": "theirs-0000"}), http.StatusCreated, "")
	id := e.create(e.keyA, nil)
	theirs := e.create(e.keyB, nil)

	rec := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	rec.Used(egress.SecretUse{Secret: "openai", SandboxID: id, Host: "api.openai.test", Method: "POST", Path: "/v1/chat/completions", Outcome: egress.OutcomeInjected, At: at})
	rec.Used(egress.SecretUse{Secret: "openai", SandboxID: id, Host: "evil.test", Method: "GET", Path: "/steal", Outcome: egress.OutcomeMisdirected, At: at.Add(time.Second)})
	rec.Used(egress.SecretUse{Secret: "openai", SandboxID: theirs, Host: "b-only.test", Method: "PUT", Path: "/b", Outcome: egress.OutcomeInjected, At: at})
	rec.Close() // writes what is queued

	node := nodejs.LookNode(t)
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatalf("chromium is missing (scripts/setup.sh installs it): %v", err)
	}
	uiDir, err := filepath.Abs("../../test/ui")
	if err != nil {
		t.Fatal(err)
	}
	nodejs.NpmCI(t, uiDir)
	api, _ := serveBrowsable(t, e.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "secrets.mjs")
	cmd.Dir = uiDir
	cmd.Env = append(nodejs.Environ(), "SHEEPFOLD_URL="+api, "SHEEPFOLD_API_KEY="+e.keyA, "SECRET=openai", "VALUE="+value,
		"CHROMIUM=/usr/bin/chromium", "ARTIFACTS="+os.Getenv("SHEEPFOLD_ARTIFACTS"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("secrets.mjs: %v\n%s\n%s", err, stdout, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var got struct {
		List      [][]string `json:"list"`
		Info      string     `json:"info"`
		Uses      [][]string `json:"uses"`
		ValueSeen bool       `json:"valueSeen"`
		Answers   int        `json:"answers"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("secrets.mjs printed %q: %v", stdout, err)
	}
	t.Logf("%+v", got)
	// The list: Name, Version, Uses, Last use, Updated.
	if len(got.List) != 2 || got.List[0][0] != "gh-token" || got.List[0][2] != "0" || got.List[0][3] != "never" ||
		got.List[1][0] != "openai" || got.List[1][2] != "1" || got.List[1][3] == "never" || got.List[1][3] == "" {
		t.Fatalf("the list: %q", got.List)
	}
	if !strings.Contains(got.Info, "1 uses") {
		t.Fatalf("the secret's line: %q", got.Info)
	}
	// The uses, newest first: Time, Sandbox, Host, Method, Path, Outcome.
	if len(got.Uses) != 2 ||
		!slices.Equal(got.Uses[0][1:], []string{id, "evil.test", "GET", "/steal", "misdirected"}) ||
		!slices.Equal(got.Uses[1][1:], []string{id, "api.openai.test", "POST", "/v1/chat/completions", "injected"}) ||
		got.Uses[0][0] == "" {
		t.Fatalf("the uses: %q", got.Uses)
	}
	if got.ValueSeen || got.Answers < 4 {
		t.Fatalf("a page or an answer held the value (%v), or the page's answers were not read (%d)", got.ValueSeen, got.Answers)
	}
}
