package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/server"
)

// signURL signs a /files URL as the E2B SDK does (no expiration).
func signURL(base, path, op, token string) string {
	sum := sha256.Sum256([]byte(path + ":" + op + "::" + token))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return base + "/files?path=" + url.QueryEscape(path) + "&signature=" + url.QueryEscape(sig)
}

// TestE2BCredentials: access tokens and signed URLs are bound to the
// sandbox and the key, need no sandbox to be live to be refused, and stop
// working when the key is revoked; /health of a sandbox needs its token.
func TestE2BCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	k, secret, err := auth.Create(ctx, e.store, auth.CreateOptions{E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	a := e.e2bCreate(secret, nil)
	b := e.e2bCreate(secret, nil)
	want(t, e.do("PUT", "/v1/sandboxes/"+a.ID+"/files?path=a.txt", "", "x", "X-API-Key", secret), http.StatusCreated, "")

	if r := e.envd(a, "GET", "/health", nil); r.status != http.StatusNoContent {
		t.Fatalf("/health with the token: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/health", "", nil, "E2b-Sandbox-Id", a.ID, "E2b-Sandbox-Port", "49983"); r.status != http.StatusUnauthorized {
		t.Fatalf("/health without a token: %d %s", r.status, r.body)
	}
	// A's token does not open B.
	if r := e.envd(e2bSandbox{ID: b.ID, Token: a.Token}, "GET", "/health", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("A's token on B: %d %s", r.status, r.body)
	}
	// Another key of another owner gets nothing of A, even with A's id.
	if r := e.e2bDo("POST", "/sandboxes/"+a.ID+"/connect", e.keyB, map[string]any{}); r.status != http.StatusNotFound {
		t.Fatalf("connect by another owner: %d %s", r.status, r.body)
	}
	signed := signURL(e.url, "/home/user/a.txt", "read", a.Token)
	if res, err := http.Get(signed); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("signed URL: %v %v", res, err)
	}

	// A dead sandbox's token opens nothing: 502, as E2B's proxy answers.
	if r := e.e2bDo("DELETE", "/sandboxes/"+b.ID, secret, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill B: %d %s", r.status, r.body)
	}
	if r := e.envd(b, "GET", "/health", nil); r.status != http.StatusBadGateway {
		t.Fatalf("/health of a killed sandbox: %d %s", r.status, r.body)
	}

	// Revoking the key ends its tokens and its signed URLs (within the
	// cache's 2 s).
	if err := e.store.RevokeKey(ctx, k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.envd(a, "GET", "/health", nil).status != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("the revoked key's token still works")
		}
		time.Sleep(100 * time.Millisecond) // polling the real condition
	}
	if r := e.envd(a, "GET", "/files?path=a.txt", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("/files with a revoked key's token: %d %s", r.status, r.body)
	}
	if res, err := http.Get(signed); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("signed URL of a revoked key: %v %v", res, err)
	}
}
