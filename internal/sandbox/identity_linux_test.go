package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// testIdentity mints with the server's issuer, for one account.
type testIdentity struct{ is *identity.Issuer }

func (ti testIdentity) Token(_ context.Context, sandboxID, audience string) (egress.IdentityToken, error) {
	t, err := ti.is.Mint("acct", sandboxID, audience)
	return egress.IdentityToken{JWT: t.JWT, ID: t.Claims.ID, Subject: t.Claims.Subject, Expires: time.Unix(t.Claims.Expires, 0)}, err
}

// TestIdentityThroughSandbox: a real sandbox whose policy's rule for
// api.test sets Authorization: Bearer ${identity.token}. Its code's two
// requests reach the server each with a new token that verifies against
// the issuer's JWKS (subject its account and id, audience the rule's); the
// placeholder sent to other.test is refused; no token is anywhere in the
// sandbox (the control: the placeholder it holds is found).
func TestIdentityThroughSandbox(t *testing.T) {
	is, err := identity.Load("https://sheepfold.test", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := loopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	api, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	evs := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = evs
		c.Egress.Identity = testIdentity{is}
		c.Egress.Test = &egress.TestNet{
			Hosts:  map[string][]netip.Addr{"api.test": {api}, "other.test": {other}},
			Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 80): srv, netip.AddrPortFrom(other, 80): srv},
		}
	})
	pol := allowlist("api.test", "other.test")
	pol.Network.Rules = []policy.NetworkRule{{Host: "api.test", Audience: "sts.example", Transform: &policy.Transform{
		Headers: map[string]string{"Authorization": "Bearer ${identity.token}"}}}}
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol, Env: map[string]string{"ID_TOKEN": "${identity.token}"}})

	got := py(t, s, `
import os, urllib.request, urllib.error
def send(host):
    req = urllib.request.Request("http://%s/token" % host, headers={"Authorization": "Bearer " + os.environ["ID_TOKEN"]})
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip())
out = " | ".join([send("api.test"), send("api.test"), send("other.test")])
open("/tmp/answers", "w").write(out)
print(out)
`)
	if !strings.HasPrefix(got, "ok | ok | 403 ERR_SECRET_MISDIRECTED") {
		t.Fatalf("the sandbox saw %q", got)
	}
	mu.Lock()
	tokens := append([]string(nil), seen...)
	mu.Unlock()
	if len(tokens) != 2 || tokens[0] == tokens[1] {
		t.Fatalf("the server got %q", tokens)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(is.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	for _, a := range tokens {
		p, err := jwt.ParseSigned(strings.TrimPrefix(a, "Bearer "), []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			t.Fatalf("%q: %v", a, err)
		}
		var c jwt.Claims
		if err := p.Claims(set.Key(p.Headers[0].KeyID)[0].Key, &c); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(jwt.Expected{Issuer: "https://sheepfold.test", Subject: "account:acct:sandbox:" + s.ID, AnyAudience: jwt.Audience{"sts.example"}}); err != nil {
			t.Fatalf("claims %+v: %v", c, err)
		}
	}
	if n := len(evs.find(s.ID, events.SecretUsed, "outcome", egress.OutcomeMinted)); n != 2 {
		t.Fatalf("%d minted events, want 2", n)
	}
	if len(evs.find(s.ID, events.SecurityViolation, "kind", events.KindSecretMisdirected)) == 0 {
		t.Fatal("no secret_misdirected event")
	}
	// No token in the sandbox, not even in what its code kept of the
	// answers (/tmp/answers): every token's first 40 characters are its
	// header's (the same kid), so that is what is searched for.
	if ex := run(t, s, "python", searchSandbox("${identity.token}")); !strings.Contains(ex.Stdout, "'environ'") || !strings.Contains(ex.Stdout, "mappings: True") {
		t.Fatalf("the control search: %q %+v", ex.Stdout, ex.Error)
	}
	head := strings.TrimPrefix(tokens[0], "Bearer ")[:40]
	if ex := run(t, s, "python", searchSandbox(head)); strings.TrimSpace(ex.Stdout) != "found: [] mappings: True" {
		t.Fatalf("a token is in the sandbox: %q %+v", ex.Stdout, ex.Error)
	}
}
