package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestDashboardLogin: the dashboard's pages are served with a strict CSP;
// its login turns a key into an HttpOnly, SameSite=Strict session cookie
// that authenticates only with the X-Sheepfold-UI header, ends at logout,
// and ends at once when the key is revoked.
func TestDashboardLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	for _, p := range []string{"/ui/", "/ui/sandbox/abc"} {
		r := e.do("GET", p, "", nil)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `<div id="app">`) ||
			!strings.Contains(r.header.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Fatalf("GET %s: %d %q %v", p, r.status, r.body, r.header)
		}
	}

	ui := []string{"X-Sheepfold-UI", "1"}
	want(t, e.do("POST", "/ui/login", "", map[string]string{"key": e.keyA}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/ui/login", "", map[string]string{"key": "sf_wrong"}, ui...), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	want(t, e.do("POST", "/ui/login", "", `{"key": 5}`, ui...), http.StatusBadRequest, "ERR_BAD_REQUEST")

	ctx := context.Background()
	k, secret, err := auth.Create(ctx, e.store, auth.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/ui/login", "", map[string]string{"key": secret}, ui...)
	want(t, r, http.StatusNoContent, "")
	var cookie *http.Cookie
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == "sheepfold_ui" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || strings.Contains(cookie.Value, secret) {
		t.Fatalf("login cookie: %+v", cookie)
	}
	session := cookie.Name + "=" + cookie.Value
	want(t, e.do("GET", "/v1/account", "", nil, "Cookie", session), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	want(t, e.do("GET", "/v1/account", "", nil, append(ui, "Cookie", session)...), http.StatusOK, "")
	want(t, e.do("GET", "/v1/account", "", nil, append(ui, "Cookie", "sheepfold_ui=forged")...), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")

	// Logout ends the session; a revoked key ends its other sessions.
	r2 := e.do("POST", "/ui/login", "", map[string]string{"key": secret}, ui...)
	other := ""
	for _, c := range (&http.Response{Header: r2.header}).Cookies() {
		other = c.Name + "=" + c.Value
	}
	want(t, e.do("POST", "/ui/logout", "", nil, append(ui, "Cookie", session)...), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/account", "", nil, append(ui, "Cookie", session)...), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	want(t, e.do("GET", "/v1/account", "", nil, append(ui, "Cookie", other)...), http.StatusOK, "")
	if err := e.store.RevokeKey(ctx, k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	want(t, e.do("GET", "/v1/account", "", nil, append(ui, "Cookie", other)...), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
}

// TestListSandboxesUsage: ?usage=1 adds each running sandbox's CPU time
// and memory now (the dashboard's live columns).
func TestListSandboxesUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	e.rt.Used = runtime.Usage{CPUNanos: 1_500_000_000, MemoryBytes: 30 << 20}
	e.create(e.keyA, nil)
	r := e.do("GET", "/v1/sandboxes?usage=1", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	l := r.json(t)["sandboxes"].([]any)
	u, _ := l[0].(map[string]any)["usage"].(map[string]any)
	if len(l) != 1 || u == nil || u["cpu_seconds"] != 1.5 || u["memory_bytes"] != float64(30<<20) {
		t.Fatalf("usage=1: %s", r.body)
	}
	if _, ok := e.do("GET", "/v1/sandboxes", e.keyA, nil).json(t)["sandboxes"].([]any)[0].(map[string]any)["usage"]; ok {
		t.Fatal("usage without ?usage=1")
	}
	want(t, e.do("GET", "/v1/sandboxes?usage=maybe", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
}

// TestGetSandboxUsage: one sandbox's live figures, PSI included where the
// runtime reads it (cgroup v2), and none without ?usage=1.
func TestGetSandboxUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	e.rt.Used = runtime.Usage{CPUNanos: 2_000_000_000, MemoryBytes: 30 << 20, MemoryPeakBytes: 40 << 20, MemoryLimit: 512 << 20,
		Pids: 3, DiskBytes: 4096, Pressure: &runtime.Pressure{CPUSome: 1.5, MemorySome: 12.25, MemoryFull: 3}}
	id := e.create(e.keyA, nil)
	r := e.do("GET", "/v1/sandboxes/"+id+"?usage=1", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	u, _ := r.json(t)["usage"].(map[string]any)
	p, _ := u["pressure"].(map[string]any)
	if u["cpu_seconds"] != 2.0 || u["memory_peak_bytes"] != float64(40<<20) || u["memory_limit_bytes"] != float64(512<<20) ||
		u["pids"] != 3.0 || u["disk_bytes"] != 4096.0 || p == nil || p["memory_some_avg10"] != 12.25 || p["cpu_some_avg10"] != 1.5 {
		t.Fatalf("usage=1: %s", r.body)
	}
	if _, ok := e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil).json(t)["usage"]; ok {
		t.Fatal("usage without ?usage=1")
	}
	want(t, e.do("GET", "/v1/sandboxes/"+id+"?usage=2", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
}
