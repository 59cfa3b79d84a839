package egress

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// The workload identity tests: the secret tests' world, the server's
// issuer (internal/identity) standing behind a fake Identity, and every
// token checked as a relying party would, against the served JWKS with
// go-jose.

type fakeIdentity struct{ is *identity.Issuer }

func (f fakeIdentity) Token(_ context.Context, sandboxID, audience string) (IdentityToken, error) {
	t, err := f.is.Mint("acc1", sandboxID, audience)
	if err != nil {
		return IdentityToken{}, err
	}
	return IdentityToken{JWT: t.JWT, ID: t.Claims.ID, Subject: t.Claims.Subject, Expires: time.Unix(t.Claims.Expires, 0)}, nil
}

// minting is the policy of the tests: api.test's POSTs under /v1 get a
// token of the default audience (the host); other.test's requests get a
// secret and no token.
func minting() *policy.Network {
	return &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "other.test"}, Rules: []policy.NetworkRule{
		{Host: "api.test", Methods: []string{"POST"}, PathPrefix: "/v1",
			Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${identity.token}"}}},
		{Host: "other.test", Transform: &policy.Transform{Headers: map[string]string{"X-Key": "${secrets.openai}"}}},
	}}
}

func identityGateway(t *testing.T, w *flowWorld, n *policy.Network) (*Gateway, *sink, *identity.Issuer) {
	t.Helper()
	is, err := identity.Load("https://sheepfold.test", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeSecrets{values: map[string]string{"openai": realValue}}
	g, ev := w.gateway(t, n, 0, func(o *Options) { o.Secrets, o.Identity = fs, fakeIdentity{is} })
	return g, ev, is
}

// verifyToken checks tok against the issuer's JWKS and its standard
// claims now, and returns its claims.
func verifyToken(t *testing.T, is *identity.Issuer, tok, aud string) identity.Claims {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(is.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	p, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatalf("token %q: %v", tok, err)
	}
	keys := set.Key(p.Headers[0].KeyID)
	if len(keys) != 1 {
		t.Fatalf("kid %q not in the JWKS", p.Headers[0].KeyID)
	}
	var c identity.Claims
	var std jwt.Claims
	if err := p.Claims(keys[0].Key, &c, &std); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if err := std.Validate(jwt.Expected{Issuer: "https://sheepfold.test", AnyAudience: jwt.Audience{aud}, Subject: "account:acc1:sandbox:sb1"}); err != nil {
		t.Fatalf("claims %+v: %v", c, err)
	}
	if c.Expires-c.IssuedAt > int64(15*time.Minute/time.Second) || c.SandboxID != "sb1" || c.AccountID != "acc1" || c.ID == "" {
		t.Fatalf("claims %+v", c)
	}
	return c
}

// TestIdentityToken: a request a minting rule covers carries a fresh
// token in the rule's header (and in the sandbox's own header holding
// the placeholder), verifiable against the JWKS, audience the rule's or
// the host; the next request on the connection gets another token; a
// request the rule does not cover gets none; each mint is an event
// naming its jti, never the token.
func TestIdentityToken(t *testing.T) {
	w, rec := newSecretWorld(t)
	n := minting()
	n.Rules = append(n.Rules, policy.NetworkRule{Host: "api.test", Methods: []string{"PUT"}, Audience: "https://aud.example/x",
		Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${identity.token}"}}})
	g, ev, is := identityGateway(t, w, n)
	c := dialFlow(t, g, "203.0.113.10:80")
	got := exchangeOn(c,
		post("api.test", "/v1/chat", "X-Key: ${identity.token}\r\n", "{}"),
		post("api.test", "/v1/chat", "", ""),
		"PUT /x HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n",
		"GET /v1 HTTP/1.1\r\nHost: api.test\r\n\r\n",
	)
	if len(got) != 4 {
		t.Fatalf("answers %q", got)
	}
	var jtis []string
	for i, aud := range []string{"api.test", "api.test", "https://aud.example/x"} {
		tok, ok := strings.CutPrefix(got[i], "200 auth=Bearer ")
		if !ok {
			t.Fatalf("answer %d %q: no token", i, got[i])
		}
		tok, key, _ := strings.Cut(tok, " key=")
		if i == 0 && key != tok {
			t.Fatalf("the sandbox's own header got %q, the rule's %q", key, tok)
		}
		jtis = append(jtis, verifyToken(t, is, tok, aud).ID)
	}
	if jtis[0] == jtis[1] || jtis[1] == jtis[2] {
		t.Fatalf("a token was used twice: %v", jtis)
	}
	if got[3] != "200 auth= key=" {
		t.Fatalf("a request no rule covers got %q", got[3])
	}
	if strings.Contains(rec.all(), "identity.") {
		t.Fatalf("a placeholder reached the server: %q", rec.all())
	}
	var minted []string
	ev.mu.Lock()
	for _, e := range ev.evs {
		if e.Type == events.SecretUsed && e.Details["secret"] == IdentitySecret && e.Details["outcome"] == OutcomeMinted {
			minted = append(minted, e.Details["jti"].(string))
		}
		if strings.Contains(fmt.Sprint(e.Details), "eyJ") {
			t.Errorf("an event holds a token: %+v", e)
		}
	}
	ev.mu.Unlock()
	if strings.Join(minted, ",") != strings.Join(jtis, ",") {
		t.Fatalf("minted events %v, tokens %v", minted, jtis)
	}
}

// TestIdentityMisdirected: the identity placeholder where no minting
// rule covers the request is refused as a misdirected secret, before any
// byte of it goes on. The control: through a gateway whose policy has no
// rules the server receives the placeholder.
func TestIdentityMisdirected(t *testing.T) {
	api, other := "203.0.113.10:80", "203.0.113.11:80"
	chunked := "POST /x HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\nkey=$\r\n4\r\n{ide\r\n9\r\nntity.tok\r\n4\r\nen}&\r\n0\r\n\r\n"
	cases := []struct {
		name, dst, req, where string
		injected              bool // the rule's header went on before the body was refused
	}{
		{"header, method not covered", api, "GET /v1/chat HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer ${identity.token}\r\n\r\n", "a header", false},
		{"header to a rule that mints none", other, post("other.test", "/x", "Authorization: Bearer ${identity.token}\r\n", ""), "mints no identity token", false},
		{"header percent-encoded", api, post("api.test", "/v1/chat", "X-Id: %24%7Bidentity.token%7D\r\n", ""), "are substituted", false},
		{"URL of the rule's host", api, post("api.test", "/v1/chat?t=${identity.token}", "", ""), "the request line", false},
		{"body of the rule's host", api, post("api.test", "/v1/chat", "", `{"t":"${identity.token}"}`), "the body", true},
		{"body to another host", other, post("other.test", "/x", "", `t=%24%7bidentity.token%7d`), "the body", false},
		{"body chunked, split", other, chunked, "the body", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, rec := newSecretWorld(t)
			plain := minting()
			plain.Rules = nil
			g0, _, _ := identityGateway(t, w, plain)
			if got := exchangeOn(dialFlow(t, g0, c.dst), c.req); !strings.HasPrefix(got[0], "200 ") ||
				!strings.Contains(rec.all(), "identity.") {
				t.Fatalf("the control: %q; the server saw %q", got, rec.all())
			}
			w, rec = newSecretWorld(t)
			g, ev, _ := identityGateway(t, w, minting())
			got := exchangeOn(dialFlow(t, g, c.dst), c.req)
			if len(got) != 1 || !strings.HasPrefix(got[0], "403 "+codeMisdirected) || !strings.Contains(got[0], c.where) ||
				!strings.Contains(got[0], IdentitySecret) {
				t.Fatalf("through the gateway %q, want 403 %s naming %q", got, codeMisdirected, c.where)
			}
			g.Close()
			rec.waitClosed(t)
			if s := rec.all(); strings.Contains(s, "identity.") || strings.Contains(s, "%7B") || strings.Contains(s, "%7b") || strings.Contains(s, "Bearer eyJ") != c.injected {
				t.Fatalf("the server saw %q", s)
			}
			if !ev.has(events.SecurityViolation, "placeholder of secret \""+IdentitySecret) {
				t.Fatalf("no secret_misdirected event: %+v", ev.evs)
			}
		})
	}
}

// TestIdentityUnavailable: a gateway that cannot mint (no identity
// configured) fails the request closed: 502, nothing sent.
func TestIdentityUnavailable(t *testing.T) {
	w, rec := newSecretWorld(t)
	g, _, fs := secretGateway(t, w, minting())
	got := exchangeOn(dialFlow(t, g, "203.0.113.10:80"), post("api.test", "/v1/chat", "", ""))
	if !strings.HasPrefix(got[0], "502 "+codeUnavailable) {
		t.Fatalf("got %q", got)
	}
	if s := rec.all(); s != "" {
		t.Fatalf("the server saw %q", s)
	}
	if o := fs.outcomes(); len(o) != 1 || o[0] != IdentitySecret+" "+OutcomeUnavailable+" POST api.test/v1/chat" {
		t.Fatalf("uses %q", o)
	}
}

// TestIdentityOverTLS: over TLS the gateway terminates for the rule's
// host, the decrypted request gets a token that verifies, and the
// placeholder in its body is refused.
func TestIdentityOverTLS(t *testing.T) {
	w, rec, roots := tlsWorld(t)
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	is, err := identity.Load("https://sheepfold.test", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g, _ := w.gateway(t, minting(), 0, func(o *Options) { o.Identity, o.Intercept = fakeIdentity{is}, &Intercept{CA: ca, Roots: roots} })
	c, err := tlsDial(t, g, "203.0.113.10:443", "api.test", caPool(t, ca))
	if err != nil {
		t.Fatalf("the handshake with the gateway's certificate: %v", err)
	}
	got := exchangeOn(c, post("api.test", "/v1/chat", "", "{}"), post("api.test", "/v1/chat", "", `{"t":"${identity.token}"}`))
	if len(got) != 2 || !strings.HasPrefix(got[1], "403 "+codeMisdirected) {
		t.Fatalf("over terminated TLS: %q\n%s", got, rec.all())
	}
	tok, ok := strings.CutPrefix(got[0], "200 auth=Bearer ")
	if !ok {
		t.Fatalf("no token: %q", got[0])
	}
	tok, _, _ = strings.Cut(tok, " proto=")
	verifyToken(t, is, tok, "api.test")
	if strings.Contains(rec.all(), "identity.") {
		t.Fatalf("the server saw a placeholder: %q", rec.all())
	}
}
