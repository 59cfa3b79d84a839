package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/server"
)

// seedSandboxConfig and seedPolicy are seed 002's, verbatim (the
// article's sandbox_config and its "recommended" security_policy).
const (
	seedSandboxConfig = `{
    "max_execution_time": 30,
    "max_memory_mb": 512,
    "allowed_modules": ["json", "math", "re", "datetime"],
    "network_restricted": true,
    "filesystem_readonly": false,
    "filesystem_paths_whitelist": ["/tmp/sandbox/", "/var/tmp/"]
}`
	seedPolicy = `{
    "resource_limits": {
        "cpu_time_seconds": 10,
        "memory_mb": 256,
        "disk_write_mb": 50,
        "network_requests": 5,
        "file_size_upload_mb": 10
    },
    "access_control": {
        "allow_subprocess": false,
        "allow_import_system": false,
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
        "strip_sensitive_data": true,
        "sanitize_errors": true
    },
    "rate_limiting": {
        "requests_per_minute": 60,
        "concurrent_sessions": 5
    }
}`
)

// TestSeedApplyPolicy: seed 002's policy is applied verbatim to a session
// made with the seed's sandbox_config. The sections it leaves out (the
// filesystem rules from sandbox_config) keep their rules; memory_mb and
// disk_write_mb lower the running sandbox's limits; raising them past
// the account's maxima is 400.
func TestSeedApplyPolicy(t *testing.T) {
	rec := &recorder{}
	e, _ := newModelEnv(t, 0, false, server.Config{}, withEvents(rec))
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "seed", "limits": map[string]any{"max_memory_mb": 1024, "max_disk_mb": 512}}), 201, "")
	r := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "seed"})
	want(t, r, 201, "")
	key := r.json(t)["key"].(string)

	id := e.session(key, map[string]any{"model": "small", "sandbox_config": json.RawMessage(seedSandboxConfig)})
	if got := e.rt.Resized(id); got.MemoryBytes != 0 {
		t.Fatalf("resized before any policy: %+v", got)
	}
	r = e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, seedPolicy)
	want(t, r, http.StatusOK, "")
	pol := r.json(t)["policy"].(map[string]any)
	fs, ok := pol["filesystem"].(map[string]any)
	if !ok || len(fs["writable_paths"].([]any)) != 2 {
		t.Fatalf("the filesystem rules of sandbox_config are lost: %v", pol)
	}
	if pol["rate_limiting"].(map[string]any)["concurrent_sessions"] != 5.0 || pol["network"].(map[string]any)["mode"] != "none" {
		t.Fatalf("policy %v", pol)
	}
	if got := e.rt.Resized(id); got.MemoryBytes != 256<<20 || got.DiskBytes != 50<<20 {
		t.Fatalf("the running sandbox was resized to %+v, want 256 MiB of memory and 50 MiB of disk", got)
	}
	r = e.do("GET", "/v1/sessions/"+id, key, nil)
	if res := r.json(t)["resources"].(map[string]any); res["memory_mb"] != 256.0 || res["disk_mb"] != 50.0 {
		t.Fatalf("session resources %v", res)
	}
	if ch := rec.find(events.PolicyChanged, id); len(ch) != 1 || ch[0].Details["memory_mb"] != int64(256) {
		t.Fatalf("policy.changed %+v", ch)
	}
	// The same call again changes nothing and is accepted.
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, seedPolicy), http.StatusOK, "")

	// Raising within the account's maxima resizes; past them is 400.
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, `{"resource_limits":{"memory_mb":1024,"disk_write_mb":100}}`), http.StatusOK, "")
	if got := e.rt.Resized(id); got.MemoryBytes != 1024<<20 || got.DiskBytes != 100<<20 {
		t.Fatalf("raised to %+v", got)
	}
	wantMsg(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, `{"resource_limits":{"memory_mb":2048}}`),
		http.StatusBadRequest, "ERR_INVALID_POLICY", "resource_limits.memory_mb")
	wantMsg(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, `{"resource_limits":{"disk_write_mb":4096}}`),
		http.StatusBadRequest, "ERR_INVALID_POLICY", "resource_limits.disk_write_mb")
	if got := e.rt.Resized(id); got.MemoryBytes != 1024<<20 {
		t.Fatalf("a refused raise resized: %+v", got)
	}
	// The filesystem rules are still fixed.
	wantMsg(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", key, `{"filesystem":{"readonly":true}}`),
		http.StatusBadRequest, "ERR_INVALID_POLICY", "fixed when the sandbox is created")
}

// TestSeedConcurrentSessions: rate_limiting.concurrent_sessions caps the
// account's running sessions while a session under that policy runs,
// checked at sessions.create.
func TestSeedConcurrentSessions(t *testing.T) {
	e, _ := newModelEnv(t, 0, false, server.Config{})
	capped := e.session(e.keyA, map[string]any{"model": "small"})
	want(t, e.do("PUT", "/v1/sandboxes/"+capped+"/policy", e.keyA, `{"rate_limiting":{"concurrent_sessions":2}}`), http.StatusOK, "")
	second := e.session(e.keyA, map[string]any{"model": "small"})
	wantMsg(t, e.do("POST", "/v1/sessions", e.keyA, map[string]any{"model": "small"}), http.StatusTooManyRequests,
		"ERR_RATE_LIMITED", "concurrent_sessions allows is 2")
	// Another account is not counted; plain sandboxes are not sessions.
	e.session(e.keyB, map[string]any{"model": "small"})
	e.create(e.keyA, nil)
	want(t, e.do("DELETE", "/v1/sessions/"+second, e.keyA, nil), http.StatusNoContent, "")
	third := e.session(e.keyA, map[string]any{"model": "small"})
	// A new session's own cap counts too.
	wantMsg(t, e.do("POST", "/v1/sessions", e.keyB, map[string]any{"model": "small",
		"security_policy": map[string]any{"rate_limiting": map[string]any{"concurrent_sessions": 1}}}), http.StatusTooManyRequests,
		"ERR_RATE_LIMITED", "the new session's")
	// Once the capped session ends, its cap goes with it.
	want(t, e.do("DELETE", "/v1/sessions/"+capped, e.keyA, nil), http.StatusNoContent, "")
	e.session(e.keyA, map[string]any{"model": "small"})
	e.session(e.keyA, map[string]any{"model": "small"})
	_ = third
}

// TestSeedSessionQuotaAtCreate: seed 002's error 4: a session of a model
// past its monthly quota is refused at sessions.create, with the seed's
// code and message; a model with quota left is not.
func TestSeedSessionQuotaAtCreate(t *testing.T) {
	e, prov := newModelEnv(t, 50, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "big"})
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 60}})
	want(t, e.do("POST", "/v1/sessions/"+id+"/ask", e.keyA, map[string]any{"prompt": "go"}), 200, "")
	r := e.do("POST", "/v1/sessions", e.keyA, map[string]any{"model": "big"})
	wantMsg(t, r, http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "Monthly quota exceeded for model big")
	if m := r.json(t)["error"].(map[string]any)["message"]; m != "Monthly quota exceeded for model big" {
		t.Fatalf("message %q", m)
	}
	e.session(e.keyA, map[string]any{"model": "small"})
	e.session(e.keyB, map[string]any{"model": "big"}) // another account's quota is its own
	if !strings.Contains(string(e.do("GET", "/v1/account/usage", e.keyA, nil).body), "big") {
		t.Fatal("usage does not show the model")
	}
}

// TestSeedInfiniteLoop: seed 002's error 2. A `while True: print(...)`
// loop's output is cut at the cap with a marker and the code runs on to
// its timeout: ERR_SANDBOX_TIMEOUT "Sandbox execution timeout after
// Nms". A policy with output_filtering.stop_on_output_cap stops it at the
// cap instead (ERR_OUTPUT_LIMIT).
func TestSeedInfiniteLoop(t *testing.T) {
	e, _ := newModelEnv(t, 0, false, server.Config{})
	id := e.session(e.keyA, map[string]any{"model": "small", "sandbox_config": json.RawMessage(seedSandboxConfig)})
	loop := "\nwhile True:\n    print(\"Boucle infinie\")\n"
	r := e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, map[string]any{"code": loop, "language": "python", "timeout_ms": 1500})
	want(t, r, http.StatusOK, "")
	ex := r.json(t)
	errObj, _ := ex["error"].(map[string]any)
	if ex["status"] != "timeout" || errObj == nil || errObj["code"] != "ERR_SANDBOX_TIMEOUT" ||
		errObj["message"] != "Sandbox execution timeout after 1500ms" || ex["execution_time_ms"].(float64) < 1500 {
		t.Fatalf("the loop: status %v error %v after %v ms", ex["status"], errObj, ex["execution_time_ms"])
	}
	// The loop writes past the 1 MiB cap in 1.5 s unless the host is
	// loaded (then it stops short of it, with no marker); the cap itself
	// is what stop_on_output_cap meets below.
	if out := ex["output"].(string); !strings.HasPrefix(out, "Boucle infinie\n") ||
		len(out) >= 1<<20 && !strings.Contains(out, "[output truncated at 1048576 bytes") {
		t.Fatalf("output of %d bytes without the cut's marker: ...%s", len(out), out[max(0, len(out)-200):])
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"output_filtering":{"stop_on_output_cap":true}}`), http.StatusOK, "")
	r = e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, map[string]any{"code": loop, "timeout_ms": 20000})
	ex = r.json(t)
	if errObj, _ = ex["error"].(map[string]any); errObj == nil || errObj["code"] != "ERR_OUTPUT_LIMIT" || ex["execution_time_ms"].(float64) >= 20000 {
		t.Fatalf("stop_on_output_cap: %v %v", ex["status"], errObj)
	}
}

// TestSeedNetworkRestricted: seed 002's error 5. urlopen of a name in a
// session with network_restricted is refused at the name's resolution:
// ERR_NETWORK_RESTRICTED "Network access is restricted in sandbox mode"
// and a security_violation naming the host, although urllib wraps the
// refusal in its URLError; by address, the same code.
func TestSeedNetworkRestricted(t *testing.T) {
	rec := &recorder{}
	e, _ := newModelEnv(t, 0, false, server.Config{}, withEvents(rec))
	id := e.session(e.keyA, map[string]any{"model": "small", "sandbox_config": map[string]any{"network_restricted": true}})
	for _, c := range []struct{ code, target string }{
		{"\nimport urllib.request\nresponse = urllib.request.urlopen('https://api.example.com')\n", "api.example.com"},
		{"import urllib.request\nurllib.request.urlopen('http://203.0.113.7/', timeout=2)", "203.0.113.7:80"},
	} {
		r := e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, map[string]any{"code": c.code, "language": "python"})
		want(t, r, http.StatusOK, "")
		ex := r.json(t)
		errObj, _ := ex["error"].(map[string]any)
		if ex["status"] != "error" || errObj == nil || errObj["code"] != "ERR_NETWORK_RESTRICTED" ||
			errObj["message"] != "Network access is restricted in sandbox mode" || errObj["name"] != "URLError" {
			t.Fatalf("%q: %v %v", c.code, ex["status"], errObj)
		}
		// The /v1 shape says it too.
		r = e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": c.code})
		if got := r.json(t)["error_code"]; got != "ERR_NETWORK_RESTRICTED" {
			t.Fatalf("/v1 execute error_code %v: %s", got, r.body)
		}
		found := false
		for _, v := range rec.find(events.SecurityViolation, id) {
			found = found || v.Details["kind"] == "network_denied" && v.Details["target"] == c.target
		}
		if !found {
			t.Fatalf("no network_denied event for %s: %+v", c.target, rec.find(events.SecurityViolation, id))
		}
	}
	// An error of the code's own is not a network refusal.
	r := e.do("POST", "/v1/sessions/"+id+"/execute", e.keyA, map[string]any{"code": "raise OSError('disk says no')"})
	if errObj := r.json(t)["error"].(map[string]any); errObj["code"] != nil && errObj["code"] != "" {
		t.Fatalf("a plain OSError: %v", errObj)
	}
}

// TestSeedResizeIsMetered: reserved memory is billed at the limit in
// force: after a policy lowers a running sandbox's memory_mb from 1024 to
// 256, its GB-seconds reserved grow at a quarter of the rate.
func TestSeedResizeIsMetered(t *testing.T) {
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond}})
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 1024}})
	usage := func() (wall, gb float64) {
		u := e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyA, nil).json(t)
		return u["sandbox_seconds"].(float64), u["gb_seconds_reserved"].(float64)
	}
	grow := func(from float64) (wall, gb float64) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if wall, gb = usage(); wall >= from+0.4 {
				return wall, gb
			}
		}
		t.Fatalf("the meter did not sample")
		return 0, 0
	}
	w0, g0 := grow(0)
	if !near(g0, w0, 1e-6) {
		t.Fatalf("1 GiB for %g s: %g GB-s", w0, g0)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"resource_limits":{"memory_mb":256}}`), http.StatusOK, "")
	w1, g1 := usage()
	w2, g2 := grow(w1)
	// One sample interval (20 ms) straddles the change.
	if got, want := g2-g1, (w2-w1)/4; !near(got, want, 0.03) {
		t.Fatalf("after the resize: %g GB-s for %g s, want %g", got, w2-w1, want)
	}
}

// TestSeedResizeIsAdmitted: raising a running sandbox's memory through
// its policy is held to the host's memory as a new sandbox is: past it,
// ERR_CAPACITY and nothing changes; what a lowering frees, a new sandbox
// may take.
func TestSeedResizeIsAdmitted(t *testing.T) {
	e := newEnv(t, server.Config{HostMemoryBytes: 1 << 30, Overcommit: 1})
	e.rt.DiskMemory.Store(true)                                                                           // disks count as memory, as a tmpfs's do
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 128}}) // 384 MiB
	e.create(e.keyB, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 128}})       // 768 MiB
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"resource_limits":{"memory_mb":640}}`), http.StatusServiceUnavailable, "ERR_CAPACITY")
	if got := e.rt.Resized(id); got.MemoryBytes != 0 {
		t.Fatalf("a refused raise resized: %+v", got)
	}
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"resource_limits":{"memory_mb":384}}`), http.StatusOK, "") // 896 MiB
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 128, "disk_mb": 64}}),
		http.StatusServiceUnavailable, "ERR_CAPACITY")
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, `{"resource_limits":{"memory_mb":128,"disk_write_mb":64}}`), http.StatusOK, "") // 576 MiB
	e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 128}})
}
