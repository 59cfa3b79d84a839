package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// TestPolicyGoSDK: a security policy given at create through the Go SDK
// is enforced by a real server (a blocked import, a CPU time limit on a
// background process, secrets redacted from code and command output),
// read and replaced with GetPolicy/SetPolicy, refused with
// ERR_INVALID_POLICY naming the field, and reported as events, listed and
// streamed.
func TestPolicyGoSDK(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := client.New(s.url, s.key)
	const secret = "s3cr3t-abcdefgh-12345678"
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 2 * time.Minute, Env: map[string]string{"API_TOKEN": secret},
		SecurityPolicy: map[string]any{
			"access_control":   map[string]any{"blocked_modules": []string{"socket"}},
			"output_filtering": map[string]any{"strip_sensitive_data": true},
			"resource_limits":  map[string]any{"cpu_time_seconds": 0.5},
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)

	got, err := c.GetPolicy(ctx, sb.ID)
	if err != nil || !strings.Contains(string(got.Policy), `"blocked_modules":["socket"]`) {
		t.Fatalf("GetPolicy %s, %v", got.Policy, err)
	}
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import socket"})
	if err != nil || ex.ErrorCode != "ERR_MODULE_BLOCKED" {
		t.Fatalf("blocked import: %+v, %v", ex, err)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import subprocess, sys, time\n" +
		"subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\ntime.sleep(30)"})
	if err != nil || ex.ErrorCode != "ERR_CPU_TIME_EXCEEDED" {
		t.Fatalf("a background process burning CPU: %+v, %v", ex, err)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import os\nprint('tok', os.environ['API_TOKEN'])"})
	if err != nil || ex.Stdout != "tok [REDACTED:secret_env]\n" {
		t.Fatalf("redacted execution: %+v, %v", ex, err)
	}
	cmd, err := c.RunCommand(ctx, sb.ID, client.CommandRequest{Cmd: "bash", Args: []string{"-c", "echo tok $API_TOKEN"}})
	if err != nil || cmd.Stdout != "tok [REDACTED:secret_env]\n" {
		t.Fatalf("redacted command: %+v, %v", cmd, err)
	}

	changed, err := c.SetPolicy(ctx, sb.ID, json.RawMessage(`{"access_control":{},"resource_limits":{}}`))
	if err != nil || !changed.RestartRequired || !strings.Contains(strings.Join(changed.Loosened, " "), "access_control.blocked_modules") {
		t.Fatalf("SetPolicy %+v, %v", changed, err)
	}
	_, err = c.SetPolicy(ctx, sb.ID, map[string]any{"filesystem": map[string]any{"readonly": true}})
	wantCode(t, err, "ERR_INVALID_POLICY")
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{SecurityPolicy: map[string]any{"resource_limits": map[string]any{"cpu_time_seconds": "10"}}})
	wantCode(t, err, "ERR_INVALID_POLICY")
	if !strings.Contains(err.Error(), "resource_limits.cpu_time_seconds") {
		t.Fatalf("the error does not name the field: %v", err)
	}

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var streamed []string
	err = c.StreamEvents(ctx, client.EventQuery{SandboxID: sb.ID, Types: []string{"security_violation", "resource_exceeded", "policy.changed", "sandbox.stopped"}},
		func(ev client.Event) error {
			streamed = append(streamed, ev.Type+":"+detail(ev, "kind")+detail(ev, "resource"))
			return nil
		})
	want := "security_violation:module_blocked resource_exceeded:cpu_time policy.changed: sandbox.stopped:"
	if err != nil || strings.Join(streamed, " ") != want {
		t.Fatalf("streamed %v, %v; want %s", streamed, err, want)
	}
	page, err := c.ListEvents(ctx, client.EventQuery{SandboxID: sb.ID, Types: []string{"resource_exceeded"}})
	if err != nil || len(page.Events) != 1 || page.Events[0].Details["observed"].(float64) < 500 {
		t.Fatalf("listed %+v, %v", page, err)
	}
}

func detail(ev client.Event, key string) string {
	s, _ := ev.Details[key].(string)
	return s
}
