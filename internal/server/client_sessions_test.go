package server_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKSessions drives the Go SDK's session calls against a server
// whose model is the scripted brain.
func TestGoSDKSessions(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	prov.SetHandler(llmtest.Brain)
	ctx := context.Background()
	c := client.New(e.url, e.keyA)
	var apiErr *client.Error

	models, err := c.Models(ctx)
	if err != nil || len(models) != 2 || models[0].ID != "big" || models[0].OwnedBy != "dear" {
		t.Fatalf("Models = %+v, %v", models, err)
	}
	_, err = c.CreateSession(ctx, client.SessionRequest{Model: "nope"})
	if !errors.As(err, &apiErr) || apiErr.Code != "ERR_MODEL_NOT_FOUND" {
		t.Fatalf("unknown model: %v", err)
	}
	_, err = client.New(e.url, e.revoked).CreateSession(ctx, client.SessionRequest{Model: "small"})
	if !errors.As(err, &apiErr) || apiErr.Code != "ERR_AUTHENTICATION_FAILED" || apiErr.Message != "Authentication failed. Invalid API key" {
		t.Fatalf("revoked key: %v", err)
	}
	s, err := c.CreateSession(ctx, client.SessionRequest{Model: "small",
		SandboxConfig: map[string]any{"allowed_modules": []string{"time"}, "network_restricted": true}})
	if err != nil || s.State != "running" || s.SandboxID != s.ID {
		t.Fatalf("CreateSession = %+v, %v", s, err)
	}
	if _, err := client.New(e.url, e.keyB).GetSession(ctx, s.ID); !errors.As(err, &apiErr) || apiErr.Code != "ERR_SESSION_NOT_FOUND" {
		t.Fatalf("another owner's session: %v", err)
	}

	ex, err := c.SessionExecute(ctx, s.ID, client.SessionExecuteRequest{Code: "print(6*7)", Language: "python", TimeoutMS: 30000})
	if err != nil || ex.Output != "42\n" || ex.Status != "success" || ex.Err() != nil {
		t.Fatalf("SessionExecute = %+v, %v", ex, err)
	}
	for _, c2 := range []struct{ code, status, errCode, msg string }{
		{"import time\ntime.sleep(5)", "timeout", "ERR_SANDBOX_TIMEOUT", "Sandbox execution timeout after 200ms"},
		{"import os", "error", "ERR_MODULE_BLOCKED", "Module 'os' is blocked by security policy"},
	} {
		req := client.SessionExecuteRequest{Code: c2.code}
		if c2.status == "timeout" {
			req.TimeoutMS = 200
		}
		ex, err := c.SessionExecute(ctx, s.ID, req)
		if err != nil || ex.Status != c2.status || ex.Error == nil || ex.Error.Code != c2.errCode || ex.Error.Message != c2.msg {
			t.Fatalf("%q: %+v (%+v), %v", c2.code, ex, ex.Error, err)
		}
	}

	var steps []string
	ans, err := c.AskStream(ctx, s.ID, client.AskRequest{Prompt: "RUN:\nprint(open('a.txt').read().upper())",
		Files: []client.AskFile{client.TextFile("a.txt", "shout")}}, func(st client.AskStep) { steps = append(steps, st.Type) })
	if err != nil || ans.Text != "Result: SHOUT" || len(ans.Executions) != 1 || ans.Tokens.TotalTokens == 0 ||
		strings.Join(steps, ",") != "model,execution,model" {
		t.Fatalf("AskStream = %+v (steps %v), %v", ans, steps, err)
	}
	ans, err = c.Ask(ctx, s.ID, client.AskRequest{Prompt: "FENCE:\nprint(1+1)"})
	if err != nil || ans.Text != "Result: 2" || ans.Executions[0].Code != "print(1+1)\n" || ans.StopReason != "answered" {
		t.Fatalf("Ask = %+v, %v", ans, err)
	}
	u, err := c.Usage(ctx, client.UsageQuery{})
	if err != nil || u.TokensUsed == 0 || len(u.Models) != 1 || u.Models[0].Model != "small" {
		t.Fatalf("Usage = %+v, %v", u, err)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSession(ctx, s.ID); err != nil || got.State != "stopped" {
		t.Fatalf("after delete: %+v, %v", got, err)
	}
}

// TestPythonSDKSessions runs sdk/python/tests/test_sessions.py against a
// server whose model is the scripted brain.
func TestPythonSDKSessions(t *testing.T) {
	e, prov := newModelEnv(t, 20, false, server.Config{})
	prov.SetHandler(llmtest.Brain)
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_sessions")
	cmd.Dir = "../../sdk/python/tests"
	cmd.Env = append(os.Environ(), "SHEEPFOLD_SESSIONS_URL="+e.url, "SHEEPFOLD_SESSIONS_KEY="+e.keyA,
		"SHEEPFOLD_SESSIONS_MODEL=small", "SHEEPFOLD_SESSIONS_QUOTA_MODEL=big")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python session client: %v\n%s", err, out)
	}
}
