package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// autoEnv is runcEnvWith with a one-second auto-pause notice.
func autoEnv(t *testing.T, cfg server.Config) *env {
	t.Helper()
	return runcEnvWith(t, cfg, func(c *sandbox.Config) { c.AutoPauseNotice = time.Second })
}

// waitState waits until GET /v1/sandboxes/{id} says want, and the
// sandbox's events hold a sandbox.paused when want is paused (the state
// turns paused as the pause begins).
func (e *env) waitState(id, want string) {
	e.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)
		st, _ := r.json(e.t)["state"].(string)
		if st == want && (want != "paused" || strings.Contains(string(e.do("GET", "/v1/sandboxes/"+id+"/events", e.keyA, nil).body), `"sandbox.paused"`)) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s is %q, not %q: %s", id, st, want, r.body)
		}
	}
}

// TestAutoPauseAPI: a sandbox created through /v1 with auto_pause is
// described so, and paused (not stopped) at the end of its lifetime once
// idle, sandbox.pausing before sandbox.paused in its events; an execution
// resumes it with its variable. Through E2B, autoPause (as the SDK sends
// it for lifecycle onTimeout pause) does the same, its detail says
// onTimeout pause, and connect resumes it with connect's timeout. A
// filesystem-only auto-pause is refused.
func TestAutoPauseAPI(t *testing.T) {
	e := autoEnv(t, server.Config{})
	id := e.create(e.keyA, map[string]any{"timeout": 2, "auto_pause": true})
	r := e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)
	if ap, _ := r.json(t)["auto_pause"].(bool); !ap {
		t.Fatalf("the sandbox is not described auto_pause: %s", r.body)
	}
	exec := func(id, code string) string {
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": code})
		want(t, r, http.StatusOK, "")
		return r.json(t)["stdout"].(string)
	}
	exec(id, "x = 6 * 7")
	e.waitState(id, "paused")
	evs := string(e.do("GET", "/v1/sandboxes/"+id+"/events", e.keyA, nil).body)
	if i, j := strings.Index(evs, `"sandbox.pausing"`), strings.Index(evs, `"sandbox.paused"`); i < 0 || j < 0 || i > j {
		t.Errorf("events: want sandbox.pausing before sandbox.paused: %s", evs)
	}
	if strings.Contains(evs, `"sandbox.stopped"`) {
		t.Fatalf("the auto-pause sandbox was stopped: %s", evs)
	}
	if got := exec(id, "print(x)"); got != "42\n" {
		t.Fatalf("after the auto-resume x is %q", got)
	}

	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "timeout": 2, "autoPause": true, "autoResume": map[string]any{"enabled": true}})
	r = e.e2bDo("GET", "/sandboxes/"+sb.ID, e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if lc, _ := r.json(t)["lifecycle"].(map[string]any); lc["onTimeout"] != "pause" || lc["autoResume"] != true {
		t.Errorf("E2B's lifecycle: %s", r.body)
	}
	exec(sb.ID, "y = 'kept'")
	e.waitState(sb.ID, "paused")
	r = e.e2bDo("POST", "/v2/sandboxes/"+sb.ID+"/connect", e.keyA, map[string]any{"timeout": 60})
	if r.status != http.StatusOK && r.status != http.StatusCreated {
		t.Fatalf("connect: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/v1/sandboxes/"+sb.ID, e.keyA, nil)
	exp, err := time.Parse(time.RFC3339Nano, r.json(t)["expires_at"].(string))
	if err != nil || r.json(t)["state"] != "running" || time.Until(exp) < 50*time.Second {
		t.Errorf("after connect: %s", r.body)
	}
	if got := exec(sb.ID, "print(y)"); got != "kept\n" {
		t.Fatalf("after connect y is %q", got)
	}
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "autoPause": true, "autoPauseMemory": false}); r.status != http.StatusBadRequest {
		t.Errorf("a filesystem-only auto-pause: %d %s, want 400", r.status, r.body)
	}
}
