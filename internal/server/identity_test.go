package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestIdentityDocuments: the OIDC discovery document and the JWKS are
// served without a key, cacheable, naming the configured issuer; a token
// the gateways' minter makes for a sandbox verifies against the served
// JWKS (go-jose, as a relying party) with the sandbox's account and id
// as its subject. A server without an issuer answers 404.
func TestIdentityDocuments(t *testing.T) {
	t.Parallel()
	is, err := identity.Load("https://sheepfold.example/", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, server.Config{Identity: is})
	r := e.do("GET", "/.well-known/openid-configuration", "", nil)
	want(t, r, http.StatusOK, "")
	var d struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Issuer != "https://sheepfold.example" || d.JWKSURI != "https://sheepfold.example/.well-known/jwks.json" ||
		!strings.HasPrefix(r.header.Get("Cache-Control"), "public") || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("discovery %s, headers %v", r.body, r.header)
	}
	r = e.do("GET", strings.TrimPrefix(d.JWKSURI, d.Issuer), "", nil)
	want(t, r, http.StatusOK, "")
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(r.body, &set); err != nil || len(set.Keys) != 1 || !set.Keys[0].Valid() || !set.Keys[0].IsPublic() {
		t.Fatalf("JWKS %s: %v", r.body, err)
	}

	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	rec, err := e.store.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	es := server.NewEgressSecrets(e.store, e.srv.Secrets(), nil)
	defer es.Close()
	tok, err := server.NewEgressIdentity(es, is).Token(context.Background(), id, "sts.amazonaws.com")
	if err != nil {
		t.Fatal(err)
	}
	p, err := jwt.ParseSigned(tok.JWT, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var std jwt.Claims
	if err := p.Claims(set.Keys[0].Key, &std); err != nil {
		t.Fatalf("the token does not verify against the served JWKS: %v", err)
	}
	sub := "account:" + rec.Owner + ":sandbox:" + id
	if err := std.Validate(jwt.Expected{Issuer: d.Issuer, Subject: sub, AnyAudience: jwt.Audience{"sts.amazonaws.com"}}); err != nil || tok.Subject != sub {
		t.Fatalf("claims %+v (subject %s): %v", std, tok.Subject, err)
	}
	if _, err := server.NewEgressIdentity(es, is).Token(context.Background(), "no-such-sandbox", "a"); err == nil {
		t.Fatal("a token for a sandbox that does not exist")
	}

	none := newEnv(t, server.Config{})
	want(t, none.do("GET", "/.well-known/jwks.json", "", nil), http.StatusNotFound, "ERR_NOT_FOUND")
}
