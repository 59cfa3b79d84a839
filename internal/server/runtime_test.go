package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestRuntimeGVisorNotInstalled: on a server without gVisor, runtime
// "gvisor" is refused with ERR_NOT_SUPPORTED saying it is not installed,
// from the /v1 create and from E2B's metadata sheepfold.runtime alike; an
// unknown runtime is ERR_BAD_REQUEST; the control (no runtime) starts.
func TestRuntimeGVisorNotInstalled(t *testing.T) {
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"runtime": "gvisor"})
	want(t, r, http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	if !strings.Contains(string(r.body), "not installed") {
		t.Fatalf("message: %s", r.body)
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"runtime": "kata"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	r = e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"sheepfold.runtime": "gvisor"}})
	if r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "not installed") {
		t.Fatalf("E2B create with sheepfold.runtime gvisor: %d %s", r.status, r.body)
	}
	e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"other": "x"}})
}

// TestAccountRuntimeAdmin: an account's default runtime is set by admin
// keys alone (a tenant's own key is refused, so it cannot pick or unlock
// its own), checked against what the server offers, shown on the
// account, and used by its creates that name none, from /v1 and E2B
// alike; locked, a create naming another runtime is refused (the attack:
// a tenant whose operator chose gvisor asks for runc); another account
// is untouched; cleared, the server's default comes back.
func TestAccountRuntimeAdmin(t *testing.T) {
	e := newEnv(t, server.Config{})
	e.rt.Choices = []string{"fake", "gvisor", "runc"}
	admin := e.adminKey()
	acct := e.do("GET", "/v1/account", e.keyA, nil).json(t)["id"].(string)
	path := "/v1/admin/accounts/" + acct + "/runtime"
	chosen := func(key string, body map[string]any) string {
		t.Helper()
		return e.rt.Chosen(e.create(key, body))
	}
	// The control: before any setting, a create naming runc gets it.
	if got := chosen(e.keyA, map[string]any{"runtime": "runc"}); got != "runc" {
		t.Fatalf("control: runtime %q", got)
	}

	want(t, e.do("POST", path, e.keyA, map[string]any{"runtime": "runc"}), http.StatusForbidden, "ERR_FORBIDDEN")
	wantMsg(t, e.do("POST", path, admin, map[string]any{"runtime": "kata"}), http.StatusBadRequest, "ERR_BAD_REQUEST", "not offered")
	wantMsg(t, e.do("POST", path, admin, map[string]any{"runtime": "", "locked": true}), http.StatusBadRequest, "ERR_BAD_REQUEST", "locked needs a runtime")
	wantMsg(t, e.do("POST", path, admin, map[string]any{}), http.StatusBadRequest, "ERR_BAD_REQUEST", "runtime is required")
	want(t, e.do("POST", "/v1/admin/accounts/nobody/runtime", admin, map[string]any{"runtime": "gvisor"}), http.StatusNotFound, "ERR_NOT_FOUND")

	// A default: used when the request names none; a request still
	// chooses.
	r := e.do("POST", path, admin, map[string]any{"runtime": "gvisor"})
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["runtime"] != "gvisor" || m["runtime_locked"] != nil {
		t.Fatalf("set: %s", r.body)
	}
	if got := chosen(e.keyA, map[string]any{}); got != "gvisor" {
		t.Errorf("the account's default: %q", got)
	}
	if got := chosen(e.keyA, map[string]any{"runtime": "runc"}); got != "runc" {
		t.Errorf("the request over the account's default: %q", got)
	}
	if got := chosen(e.keyB, map[string]any{}); got != "" {
		t.Errorf("another account: %q", got)
	}

	// Locked: the request cannot leave it, from /v1 or E2B.
	want(t, e.do("POST", path, admin, map[string]any{"runtime": "gvisor", "locked": true}), http.StatusOK, "")
	if m := e.do("GET", "/v1/account", e.keyA, nil).json(t); m["runtime"] != "gvisor" || m["runtime_locked"] != true {
		t.Errorf("the tenant's view: %v %v", m["runtime"], m["runtime_locked"])
	}
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"runtime": "runc"}), http.StatusForbidden, "ERR_FORBIDDEN", "set by the operator")
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"sheepfold.runtime": "runc"}}); r.status != http.StatusForbidden {
		t.Errorf("E2B create naming runc under a lock: %d %s", r.status, r.body)
	}
	if got := chosen(e.keyA, map[string]any{"runtime": "gvisor"}); got != "gvisor" {
		t.Errorf("locked, naming its own: %q", got)
	}
	if got := e.rt.Chosen(e.e2bCreate(e.keyA, map[string]any{"templateID": "base"}).ID); got != "gvisor" {
		t.Errorf("locked, E2B naming none: %q", got)
	}

	// Cleared: the server's default again.
	want(t, e.do("POST", path, admin, map[string]any{"runtime": ""}), http.StatusOK, "")
	if got := chosen(e.keyA, map[string]any{}); got != "" {
		t.Errorf("cleared: %q", got)
	}
}
