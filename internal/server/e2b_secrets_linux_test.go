package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// lateSecrets is the gateways' resolver, set once the server (whose
// store it reads) exists, before any sandbox does.
type lateSecrets struct{ egress.Secrets }

// echoServer is a loopback HTTP server standing for the hosts a sandbox's
// gateway routes to it: it answers "ok" and records one line per request.
type echoServer struct {
	addr netip.AddrPort
	mu   sync.Mutex
	seen []string
}

// startEcho serves until the test ends; line says what to record of a
// request and its body.
func startEcho(t *testing.T, line func(r *http.Request, body []byte) string) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{addr: netip.MustParseAddrPort(ln.Addr().String())}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, line(r, b))
		s.mu.Unlock()
		fmt.Fprint(w, "ok")
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return s
}

// received returns what was recorded since the last call.
func (s *echoServer) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.seen
	s.seen = nil
	return out
}

// egressEnv is a runc server whose gateways resolve api.test (203.0.113.10)
// and other.test (203.0.113.11), route both to echo, and read secrets from
// the server's own store as the real server wires them; more adjusts the
// engine's config further.
func egressEnv(t *testing.T, cfg server.Config, echo *echoServer, more func(*sandbox.Config)) (*env, *server.EgressSecrets) {
	t.Helper()
	api, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	late := &lateSecrets{}
	e := runcEnvWith(t, cfg, func(c *sandbox.Config) {
		c.Egress.Secrets = late
		c.Egress.Test = &egress.TestNet{
			Hosts:  map[string][]netip.Addr{"api.test": {api}, "other.test": {other}},
			Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 80): echo.addr, netip.AddrPortFrom(other, 80): echo.addr},
		}
		if more != nil {
			more(c)
		}
	})
	res := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	t.Cleanup(res.Close)
	late.Secrets = res
	return e, res
}

// TestE2BSecretInjected: a real sandbox created through the E2B surface
// (POST /v2/sandboxes) whose envVars hold E2B's placeholder
// ${e2b.secrets.openai-api-key} and whose network.rules set
// Authorization from it for api.test. Its request to api.test reaches the
// server with the value; the placeholder sent to other.test, in a header
// or the body, is refused (403 ERR_SECRET_MISDIRECTED) and nothing of it
// arrives; the uses are recorded. A new version (E2B's POST
// /secrets/{secretID}) is on the next request; once the secret is
// deleted (DELETE /secrets/{secretID}) the request fails closed (502
// ERR_SECRET_UNAVAILABLE) and nothing is sent. The control: a sandbox
// created the same way without rules sends the placeholder to other.test
// as it is written, so the refusal is the gateway's. No value is in the
// account's events (what webhooks deliver) or the database files.
func TestE2BSecretInjected(t *testing.T) {
	const v1, v2 = "sk-E2B-RULE-1a2b3c4d5e", "sk-E2B-RULE-9f8e7d6c5b"
	echo := startEcho(t, func(r *http.Request, b []byte) string {
		return r.Host + " " + r.Header.Get("Authorization") + " " + string(b)
	})
	e, _ := egressEnv(t, server.Config{}, echo, nil)

	r := e.e2bDo("POST", "/secrets", e.keyA, map[string]any{"name": "openai-api-key", "value": v1})
	if r.status != http.StatusCreated {
		t.Fatalf("create the secret: %d %s", r.status, r.body)
	}
	secretID := r.json(t)["secretID"].(string)
	const placeholder = "${e2b.secrets.openai-api-key}"
	create := func(rules bool) string {
		network := map[string]any{"allowOut": []string{"api.test", "other.test"}}
		if rules {
			network["rules"] = map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{
				"headers": map[string]string{"Authorization": "Bearer " + placeholder}}}}}
		}
		sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "python", "timeout": 120,
			"envVars": map[string]string{"OPENAI_API_KEY": placeholder}, "network": network})
		t.Cleanup(func() { e.e2bDo("DELETE", "/sandboxes/"+sb.ID, e.keyA, nil) })
		return sb.ID
	}
	send := func(id, calls string) string {
		t.Helper()
		code := `
import os, urllib.request, urllib.error
def send(host, body=b"{}"):
    req = urllib.request.Request("http://%s/v1/chat" % host, data=body, headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().split(":")[0])
print(os.environ["OPENAI_API_KEY"], ` + calls + `, sep=" | ")
`
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": code})
		want(t, r, http.StatusOK, "")
		return strings.TrimSpace(r.json(t)["stdout"].(string))
	}
	received := echo.received

	// The control: without rules the placeholder leaves as it is written.
	ctl := create(false)
	if got := send(ctl, `send("other.test")`); got != placeholder+" | ok" {
		t.Fatalf("the control sandbox saw %q", got)
	}
	if got := received(); len(got) != 1 || got[0] != "other.test Bearer "+placeholder+" {}" {
		t.Fatalf("the control: the server got %q", got)
	}

	id := create(true)
	got := send(id, `send("api.test"), send("other.test"), send("other.test", b'{"k": "${e2b.secrets.openai-api-key}"}')`)
	if got != placeholder+" | ok | 403 ERR_SECRET_MISDIRECTED | 403 ERR_SECRET_MISDIRECTED" {
		t.Fatalf("the sandbox saw %q", got)
	}
	if got := received(); len(got) != 1 || got[0] != "api.test Bearer "+v1+" {}" {
		t.Fatalf("the server got %q", got)
	}
	// The uses: one injected, two misdirected, for this sandbox.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.do("GET", "/v1/secrets/openai-api-key/uses", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		out := map[string]int{}
		for _, u := range r.json(t)["uses"].([]any) {
			m := u.(map[string]any)
			if m["sandbox_id"] == id {
				out[m["outcome"].(string)+" "+m["host"].(string)]++
			}
		}
		if out["injected api.test"] == 1 && out["misdirected other.test"] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("uses %v: %s", out, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A new version through E2B is on the next request.
	r = e.e2bDo("POST", "/secrets/"+secretID, e.keyA, map[string]any{"value": v2})
	if r.status != http.StatusOK {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if got := send(id, `send("api.test")`); got != placeholder+" | ok" {
		t.Fatalf("after the update the sandbox saw %q", got)
	}
	if got := received(); len(got) != 1 || got[0] != "api.test Bearer "+v2+" {}" {
		t.Fatalf("after the update the server got %q", got)
	}
	// Deleted through E2B: fails closed, nothing sent.
	if r := e.e2bDo("DELETE", "/secrets/"+secretID, e.keyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if got := send(id, `send("api.test")`); got != placeholder+" | 502 ERR_SECRET_UNAVAILABLE" {
		t.Fatalf("after the delete the sandbox saw %q", got)
	}
	if got := received(); len(got) != 0 {
		t.Fatalf("after the delete the server got %q", got)
	}

	// No value in the account's events (what webhooks deliver) nor in
	// the database files; the control: the secret's name is in both.
	r = e.do("GET", "/v1/events?type=secret.used&limit=1000", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var db []byte
	for _, f := range []string{e.dbPath, e.dbPath + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		db = append(db, b...)
	}
	for where, b := range map[string][]byte{"events": r.body, "database files": db} {
		if !bytes.Contains(b, []byte("openai-api-key")) {
			t.Errorf("control: the secret's name is not in the %s", where)
		}
		for _, v := range []string{v1, v2} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("a value is in the %s", where)
			}
		}
	}
}

// lateIdentity is the gateways' minter, set once the server exists.
type lateIdentity struct{ egress.Identity }

// TestE2BIdentityInjected: a real sandbox created through the E2B surface
// with E2B's workload identity (iam.tokens.aws, audience
// sts.amazonaws.com) and a rule whose Authorization holds
// ${e2b.identity.tokens.aws}: its request to api.test reaches the server
// with a token the gateway minted, which verifies against the served JWKS
// with that audience and the sandbox as its subject; the sandbox holds no
// token, and its own header holding E2B's placeholder is refused (403
// ERR_SECRET_MISDIRECTED), even to the rule's host.
func TestE2BIdentityInjected(t *testing.T) {
	echo := startEcho(t, func(r *http.Request, _ []byte) string { return r.Header.Get("Authorization") })
	is, err := identity.Load("https://sheepfold.example/", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lateID := &lateIdentity{}
	e, res := egressEnv(t, server.Config{Identity: is}, echo, func(c *sandbox.Config) { c.Egress.Identity = lateID })
	lateID.Identity = server.NewEgressIdentity(res, is)

	const placeholder = "${e2b.identity.tokens.aws}"
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "python", "timeout": 120,
		"iam": map[string]any{"tokens": map[string]any{"aws": map[string]string{"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}}},
		"network": map[string]any{"allowOut": []string{"api.test"}, "rules": map[string]any{"api.test": []any{map[string]any{
			"transform": map[string]any{"headers": map[string]string{"Authorization": "Bearer " + placeholder}}}}}}})
	t.Cleanup(func() { e.e2bDo("DELETE", "/sandboxes/"+sb.ID, e.keyA, nil) })
	code := `
import urllib.request, urllib.error
def send(headers):
    req = urllib.request.Request("http://api.test/v1/x", data=b"{}", headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().split(":")[0])
print(send({}), send({"X-Token": "` + placeholder + `"}), sep=" | ")
`
	r := e.do("POST", "/v1/sandboxes/"+sb.ID+"/execute", e.keyA, map[string]any{"code": code})
	want(t, r, http.StatusOK, "")
	if got := strings.TrimSpace(r.json(t)["stdout"].(string)); got != "ok | 403 ERR_SECRET_MISDIRECTED" {
		t.Fatalf("the sandbox saw %q", got)
	}
	got := echo.received()
	if len(got) != 1 || !strings.HasPrefix(got[0], "Bearer ey") {
		t.Fatalf("the server got %q", got)
	}
	r = e.do("GET", "/.well-known/jwks.json", "", nil)
	want(t, r, http.StatusOK, "")
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(r.body, &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", r.body, err)
	}
	p, err := jwt.ParseSigned(strings.TrimPrefix(got[0], "Bearer "), []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var std jwt.Claims
	if err := p.Claims(set.Keys[0].Key, &std); err != nil {
		t.Fatalf("the token does not verify against the served JWKS: %v", err)
	}
	rec, err := e.store.GetSandbox(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := std.Validate(jwt.Expected{Issuer: "https://sheepfold.example", Subject: "account:" + rec.Owner + ":sandbox:" + sb.ID,
		AnyAudience: jwt.Audience{"sts.amazonaws.com"}}); err != nil {
		t.Fatalf("claims %+v: %v", std, err)
	}
}
