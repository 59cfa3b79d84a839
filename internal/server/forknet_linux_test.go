package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestForkWithNetwork forks, through /v1, a sandbox whose allowlist has a
// rule putting the account's secret into its requests to api.test. Each
// fork has a gateway of its own with the parent's policy: the secret
// goes into its requests to api.test (the gateway resolves it by the
// fork's own id) and a name outside the allowlist does not resolve,
// while the parent reaches api.test as before; so does a sandbox started
// from a snapshot of it. A snapshot of the networked sandbox holds no byte of the
// secret's value. The control: a sandbox whose allowlist names
// other.test reaches it.
func TestForkWithNetwork(t *testing.T) {
	const value = "sk-FORK-5e4d3c2b1a0f"
	echo := startEcho(t, func(r *http.Request, _ []byte) string { return r.Host + " " + r.Header.Get("Authorization") })
	e, _ := egressEnv(t, server.Config{}, echo, nil)
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "api_key", "value": value}), http.StatusCreated, "")

	network := func(allow ...string) map[string]any {
		return map[string]any{"network": map[string]any{"mode": "allowlist", "allow": allow,
			"rules": []any{map[string]any{"host": "api.test", "transform": map[string]any{
				"headers": map[string]string{"Authorization": "Bearer ${secrets.api_key}"}}}}}}
	}
	received := echo.received
	const calls = `
import urllib.request
def get(host):
    try:
        return urllib.request.urlopen("http://%s/x" % host, timeout=10).read().decode()
    except Exception as e:
        return type(e).__name__
print(get("api.test"), get("other.test"), sep="|")
`
	run := func(id string) string {
		t.Helper()
		return strings.TrimSpace(e.execIn(e.keyA, id, calls))
	}

	ctl := e.create(e.keyA, map[string]any{"security_policy": network("api.test", "other.test")})
	if got := run(ctl); got != "ok|ok" {
		t.Fatalf("the control reaches %q", got)
	}
	received()

	parent := e.create(e.keyA, map[string]any{"security_policy": network("api.test")})
	e.execIn(e.keyA, parent, "x = 7")
	if got := run(parent); got != "ok|URLError" {
		t.Fatalf("the parent: %q", got)
	}
	if got := received(); len(got) != 1 || got[0] != "api.test Bearer "+value {
		t.Fatalf("the parent's request reached the server as %q", got)
	}
	r := e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": 2})
	want(t, r, http.StatusCreated, "")
	for _, f := range r.json(t)["sandboxes"].([]any) {
		id := f.(map[string]any)["id"].(string)
		if got := e.execIn(e.keyA, id, "print(x)"); got != "7\n" {
			t.Fatalf("fork %s: x = %q", id, got)
		}
		if got := run(id); got != "ok|URLError" {
			t.Fatalf("fork %s reaches %q, want api.test alone", id, got)
		}
		if got := received(); len(got) != 1 || got[0] != "api.test Bearer "+value {
			t.Fatalf("fork %s's request reached the server as %q, want the secret put in", id, got)
		}
		want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
	if got := run(parent); got != "ok|URLError" {
		t.Fatalf("the parent after the fork: %q", got)
	}
	received()
	want(t, e.do("POST", "/v1/sandboxes/"+parent+"/snapshots", e.keyA, map[string]any{"name": "net"}), http.StatusCreated, "")
	if hits := filesHolding(t, e.engine.SnapshotDir(), value); len(hits) != 0 {
		t.Errorf("the secret's value is in the snapshot of a networked sandbox: %v", hits)
	}
	from := e.create(e.keyA, map[string]any{"snapshot": "net"})
	if got := run(from); got != "ok|URLError" {
		t.Fatalf("a sandbox from the snapshot reaches %q", got)
	}
	if got := received(); len(got) != 1 || got[0] != "api.test Bearer "+value {
		t.Fatalf("its request reached the server as %q", got)
	}
	for _, id := range []string{from, parent, ctl} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
	want(t, e.do("DELETE", "/v1/snapshots/net", e.keyA, nil), http.StatusNoContent, "")
}
