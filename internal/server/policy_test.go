package server_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// recorder keeps the events an engine emits.
type recorder struct {
	mu  sync.Mutex
	evs []events.Event
}

func (r *recorder) Emit(e events.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) find(typ events.Type, sandboxID string) []events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []events.Event
	for _, e := range r.evs {
		if e.Type == typ && e.SandboxID == sandboxID {
			out = append(out, e)
		}
	}
	return out
}

func withEvents(rec *recorder) func(*sandbox.Config) {
	return func(c *sandbox.Config) { c.Events = rec }
}

// TestPolicyBlockedModule is the vertical slice: a policy given at create
// blocks an import, the execution fails with ERR_MODULE_BLOCKED, and a
// security_violation event names the module and the execution.
func TestPolicyBlockedModule(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newEnv(t, server.Config{}, withEvents(rec))
	free := e.create(e.keyA, nil)
	code := map[string]any{"code": "import os\nos.getpid() > 0"}
	if ex := e.do("POST", "/v1/sandboxes/"+free+"/execute", e.keyA, code).json(t); ex["status"] != "success" {
		t.Fatalf("without a policy the import works: %v", ex)
	}
	id := e.create(e.keyA, map[string]any{"security_policy": map[string]any{
		"access_control": map[string]any{"blocked_modules": []string{"os", "socket"}}}})
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, code)
	want(t, r, http.StatusOK, "")
	ex := r.json(t)
	errObj, _ := ex["error"].(map[string]any)
	if ex["status"] != "error" || ex["error_code"] != "ERR_MODULE_BLOCKED" || errObj["value"] != "Module 'os' is blocked by security policy" {
		t.Fatalf("execution %s", r.body)
	}
	vs := rec.find(events.SecurityViolation, id)
	if len(vs) != 1 || vs[0].Details["kind"] != events.KindModuleBlocked || vs[0].Details["target"] != "os" || !strings.HasPrefix(vs[0].ExecutionID, "exe_") {
		t.Fatalf("events %+v", vs)
	}
	got := e.do("GET", "/v1/sandboxes/"+id+"/policy", e.keyA, nil).json(t)
	if pol, _ := got["policy"].(map[string]any); pol["access_control"] == nil {
		t.Fatalf("GET policy %v", got)
	}
	rec2, err := e.store.GetSandbox(t.Context(), id)
	if err != nil || !strings.Contains(string(rec2.Policy), `"blocked_modules":["os","socket"]`) {
		t.Fatalf("stored policy %s (%v)", rec2.Policy, err)
	}
}

// TestPolicyShorthand: the seeds' sandbox_config maps onto the policy.
func TestPolicyShorthand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, map[string]any{"sandbox_config": map[string]any{"allowed_modules": []string{"json", "math"}, "max_memory_mb": 256}})
	ex := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "import json, math\njson.dumps(math.pi > 3)"}).json(t)
	if ex["status"] != "success" {
		t.Fatalf("allowed modules: %v", ex)
	}
	ex = e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "import subprocess"}).json(t)
	if ex["error_code"] != "ERR_MODULE_BLOCKED" {
		t.Fatalf("a module outside the allowlist: %v", ex)
	}
	pol := e.do("GET", "/v1/sandboxes/"+id+"/policy", e.keyA, nil).json(t)["policy"].(map[string]any)
	if rl, _ := pol["resource_limits"].(map[string]any); rl["memory_mb"] != 256.0 {
		t.Fatalf("policy %v", pol)
	}
}

// TestPolicyInvalid: every bad value is 400 ERR_INVALID_POLICY naming the
// field, at create and at PUT.
func TestPolicyInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	tests := []struct{ name, policy, field string }{
		{"unknown top field", `{"resource_limit":{}}`, "resource_limit"},
		{"unknown nested field", `{"access_control":{"allow_subprocesses":false}}`, "access_control.allow_subprocesses"},
		{"not an object", `"strict"`, "must be an object"},
		{"cpu wrong type", `{"resource_limits":{"cpu_time_seconds":"10"}}`, "resource_limits.cpu_time_seconds"},
		{"cpu zero", `{"resource_limits":{"cpu_time_seconds":0}}`, "resource_limits.cpu_time_seconds"},
		{"cpu huge", `{"resource_limits":{"cpu_time_seconds":1e9}}`, "resource_limits.cpu_time_seconds"},
		{"memory small", `{"resource_limits":{"memory_mb":4}}`, "resource_limits.memory_mb"},
		{"memory fraction", `{"resource_limits":{"memory_mb":64.5}}`, "resource_limits.memory_mb"},
		{"disk zero", `{"resource_limits":{"disk_write_mb":0}}`, "resource_limits.disk_write_mb"},
		{"network requests negative", `{"resource_limits":{"network_requests":-1}}`, "resource_limits.network_requests"},
		{"upload zero", `{"resource_limits":{"file_size_upload_mb":0}}`, "resource_limits.file_size_upload_mb"},
		{"subprocess not bool", `{"access_control":{"allow_subprocess":"no"}}`, "access_control.allow_subprocess"},
		{"import system not bool", `{"access_control":{"allow_import_system":0}}`, "access_control.allow_import_system"},
		{"allowed import not a name", `{"access_control":{"allowed_imports":["json","os;rm"]}}`, "access_control.allowed_imports[1]"},
		{"blocked not strings", `{"access_control":{"blocked_modules":[1]}}`, "access_control.blocked_modules[0]"},
		{"readonly not bool", `{"filesystem":{"readonly":"yes"}}`, "filesystem.readonly"},
		{"writable relative", `{"filesystem":{"writable_paths":["tmp"]}}`, "filesystem.writable_paths[0]"},
		{"writable dotdot", `{"filesystem":{"writable_paths":["/tmp/../etc"]}}`, "filesystem.writable_paths[0]"},
		{"writable proc", `{"filesystem":{"writable_paths":["/proc/sys"]}}`, "filesystem.writable_paths[0]"},
		{"writable root", `{"filesystem":{"writable_paths":["/"]}}`, "filesystem.writable_paths[0]"},
		{"network mode", `{"network":{"mode":"open"}}`, "network.mode"},
		{"network allow entry", `{"network":{"mode":"allowlist","allow":["api.github.com","exa mple.com"]}}`, "network.allow[1]"},
		{"network allow not a list", `{"network":{"mode":"allowlist","allow":"api.github.com"}}`, "network.allow"},
		{"network allow port", `{"network":{"mode":"allowlist","allow":["api.github.com:99999"]}}`, "network.allow[0]"},
		{"strip not bool", `{"output_filtering":{"strip_sensitive_data":"yes"}}`, "output_filtering.strip_sensitive_data"},
		{"sanitize not bool", `{"output_filtering":{"sanitize_errors":1}}`, "output_filtering.sanitize_errors"},
		{"on violation not a string", `{"on_violation":true}`, "on_violation"},
		{"output length", `{"output_filtering":{"max_output_length":0}}`, "output_filtering.max_output_length"},
		{"rate", `{"rate_limiting":{"requests_per_minute":0}}`, "rate_limiting.requests_per_minute"},
		{"on violation", `{"on_violation":"panic"}`, "on_violation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []resp{
				e.do("POST", "/v1/sandboxes", e.keyA, `{"security_policy":`+tt.policy+`}`),
				e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, tt.policy),
			} {
				want(t, r, http.StatusBadRequest, "ERR_INVALID_POLICY")
				if !strings.Contains(string(r.body), tt.field) {
					t.Fatalf("the message does not name %s: %s", tt.field, r.body)
				}
			}
		})
	}
	for _, sc := range []struct{ body, field string }{
		{`{"sandbox_config":{"allowed_modules":"json"}}`, "sandbox_config.allowed_modules"},
		{`{"sandbox_config":{"filesystem_paths_whitelist":["rel"]}}`, "sandbox_config.filesystem_paths_whitelist[0]"},
		{`{"sandbox_config":{"max_memory_mb":1}}`, "sandbox_config.max_memory_mb"},
		{`{"sandbox_config":{"no_such":1}}`, "sandbox_config.no_such"},
	} {
		r := e.do("POST", "/v1/sandboxes", e.keyA, sc.body)
		want(t, r, http.StatusBadRequest, "ERR_INVALID_POLICY")
		if !strings.Contains(string(r.body), sc.field) {
			t.Fatalf("the message does not name %s: %s", sc.field, r.body)
		}
	}
	if got := e.do("GET", "/v1/sandboxes/"+id+"/policy", e.keyA, nil).json(t); len(got["policy"].(map[string]any)) != 0 {
		t.Fatalf("refused PUTs changed the policy: %v", got)
	}
}

// TestPolicyReplace: tightening keeps the interpreter's state, loosening
// a rule only a fresh interpreter can drop says restart_required and
// restarts the context, filesystem rules cannot change, and every change
// is a policy.changed event. A section the body sets replaces the
// current one, a section it leaves out keeps its rules, {} clears it.
func TestPolicyReplace(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newEnv(t, server.Config{}, withEvents(rec))
	id := e.create(e.keyA, map[string]any{"security_policy": map[string]any{"filesystem": map[string]any{"readonly": false}}})
	exec := func(code string) map[string]any {
		return e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": code}).json(t)
	}
	put := func(body string) map[string]any {
		r := e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, body)
		want(t, r, http.StatusOK, "")
		return r.json(t)
	}
	exec("x = 42")
	tighten := `{"filesystem":{"readonly":false},"access_control":{"blocked_modules":["socket"]}}`
	if got := put(tighten); got["restart_required"] != false {
		t.Fatalf("tightening: %v", got)
	}
	if ex := exec("x"); ex["status"] != "success" {
		t.Fatalf("state after tightening: %v", ex)
	}
	if ex := exec("import socket"); ex["error_code"] != "ERR_MODULE_BLOCKED" {
		t.Fatalf("the new rule applies at the next execution: %v", ex)
	}
	if got := put(`{"on_violation":"report"}`); got["restart_required"] != false ||
		!strings.Contains(string(e.do("GET", "/v1/sandboxes/"+id+"/policy", e.keyA, nil).body), `"blocked_modules":["socket"]`) {
		t.Fatalf("a section left out lost its rules: %v", got)
	}
	got := put(`{"access_control":{}}`)
	if got["restart_required"] != true || !strings.Contains(string(e.do("GET", "/v1/sandboxes/"+id+"/policy", e.keyA, nil).body), `"policy":{"filesystem"`) {
		t.Fatalf("loosening: %v", got)
	}
	if ex := exec("import socket\n'x' in dir()"); ex["status"] != "success" {
		t.Fatalf("after a loosening restart: %v", ex)
	} else if res := ex["results"].([]any); len(res) != 1 || res[0].(map[string]any)["text"] != "False" {
		t.Fatalf("the context restarted, so x is gone: %v", ex)
	}
	r := e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"filesystem":{"readonly":true}}`)
	want(t, r, http.StatusBadRequest, "ERR_INVALID_POLICY")
	if !strings.Contains(string(r.body), "fixed when the sandbox is created") {
		t.Fatalf("filesystem change: %s", r.body)
	}
	if n := len(rec.find(events.PolicyChanged, id)); n != 3 {
		t.Fatalf("%d policy.changed events, want 3", n)
	}
}
