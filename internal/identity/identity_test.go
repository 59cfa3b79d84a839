package identity_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/sheepfold/sheepfold/internal/identity"
)

// verify checks tok against the JWKS jwks with go-jose, as a relying
// party does, and returns its claims.
func verify(t *testing.T, jwks []byte, tok string) identity.Claims {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err != nil {
		t.Fatalf("JWKS: %v", err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatalf("parse %q: %v", tok, err)
	}
	if len(parsed.Headers) != 1 || parsed.Headers[0].KeyID == "" {
		t.Fatalf("headers %+v: want one with a kid", parsed.Headers)
	}
	keys := set.Key(parsed.Headers[0].KeyID)
	if len(keys) != 1 {
		t.Fatalf("kid %s: %d keys in the JWKS", parsed.Headers[0].KeyID, len(keys))
	}
	var c identity.Claims
	var std jwt.Claims
	if err := parsed.Claims(keys[0].Key, &c, &std); err != nil {
		t.Fatalf("signature: %v", err)
	}
	return c
}

func TestMintVerifies(t *testing.T) {
	t.Parallel()
	is, err := identity.Load("https://sheepfold.example/", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Unix()
	tok, err := is.Mint("acc1", "sbx1", "sts.amazonaws.com")
	if err != nil {
		t.Fatal(err)
	}
	c := verify(t, is.JWKS(), tok.JWT)
	if c != tok.Claims {
		t.Fatalf("verified claims %+v, minted %+v", c, tok.Claims)
	}
	if c.Issuer != "https://sheepfold.example" || c.Subject != "account:acc1:sandbox:sbx1" || c.Audience != "sts.amazonaws.com" ||
		c.AccountID != "acc1" || c.SandboxID != "sbx1" || c.ID == "" {
		t.Fatalf("claims %+v", c)
	}
	if c.IssuedAt < before || c.Expires-c.IssuedAt != int64(identity.TokenLife/time.Second) || identity.TokenLife > 15*time.Minute {
		t.Fatalf("iat %d exp %d: want a life of %v (at most 15 min)", c.IssuedAt, c.Expires, identity.TokenLife)
	}
	// go-jose's own validation of the standard claims.
	parsed, _ := jwt.ParseSigned(tok.JWT, []jose.SignatureAlgorithm{jose.ES256})
	var std jwt.Claims
	var set jose.JSONWebKeySet
	_ = json.Unmarshal(is.JWKS(), &set)
	if err := parsed.Claims(set.Keys[0].Key, &std); err != nil {
		t.Fatal(err)
	}
	if err := std.Validate(jwt.Expected{Issuer: is.URL(), AnyAudience: jwt.Audience{"sts.amazonaws.com"}}); err != nil {
		t.Fatalf("fresh token: %v", err)
	}
	if err := std.Validate(jwt.Expected{Issuer: is.URL(), Time: time.Now().Add(identity.TokenLife + 2*time.Minute)}); err == nil {
		t.Fatal("the token is still valid past its life")
	}
	if err := std.Validate(jwt.Expected{Issuer: is.URL(), AnyAudience: jwt.Audience{"other"}}); err == nil {
		t.Fatal("the token is valid for another audience")
	}
	// A second mint is another token.
	tok2, err := is.Mint("acc1", "sbx1", "sts.amazonaws.com")
	if err != nil {
		t.Fatal(err)
	}
	if tok2.JWT == tok.JWT || tok2.Claims.ID == tok.Claims.ID {
		t.Fatal("two mints gave the same token")
	}
	// A token signed by another server's key does not verify here.
	other, err := identity.Load("https://sheepfold.example", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := other.Mint("acc1", "sbx1", "sts.amazonaws.com")
	p, _ := jwt.ParseSigned(forged.JWT, []jose.SignatureAlgorithm{jose.ES256})
	if err := p.Claims(set.Keys[0].Key, &std); err == nil {
		t.Fatal("another server's token verified against this JWKS")
	}
	// Control: the other server's JWKS verifies it.
	verify(t, other.JWKS(), forged.JWT)
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	is, err := identity.New("https://sheepfold.example/base", mustKey(t))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Issuer  string   `json:"issuer"`
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := json.Unmarshal(is.Discovery(), &d); err != nil {
		t.Fatal(err)
	}
	if d.Issuer != "https://sheepfold.example/base" || d.JWKSURI != "https://sheepfold.example/base/.well-known/jwks.json" || len(d.Algs) != 1 || d.Algs[0] != "ES256" {
		t.Fatalf("discovery %+v", d)
	}
	for _, bad := range []string{"", "sheepfold.example", "ftp://x", "https://", "https://x/?a=b", "https://x/#f", "https://u@x"} {
		if _, err := identity.New(bad, mustKey(t)); err == nil {
			t.Errorf("issuer %q accepted", bad)
		}
	}
}

func mustKey(t *testing.T) []byte {
	t.Helper()
	b, err := identity.NewKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKeyFile: made 0600 at the first start, kept across starts,
// refused when others may read it, rotated by appending a key.
func TestKeyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, identity.KeyFileName)
	is, err := identity.Load("https://s.example", dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	again, err := identity.Load("https://s.example", dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(again.KeyIDs(), ",") != strings.Join(is.KeyIDs(), ",") {
		t.Fatal("a restart changed the key")
	}
	old, _ := is.Mint("a", "s", "aud")

	// Others may read it: refused.
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.Load("https://s.example", dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file of mode 0640 loaded: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}

	// Rotation: a key appended signs; the old one stays published.
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, append(b, mustKey(t)...), 0o600); err != nil {
		t.Fatal(err)
	}
	rot, err := identity.Load("https://s.example", dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := rot.KeyIDs()
	if len(ids) != 2 || ids[0] != is.KeyIDs()[0] {
		t.Fatalf("after rotation kids %v", ids)
	}
	tok, _ := rot.Mint("a", "s", "aud")
	parsed, _ := jwt.ParseSigned(tok.JWT, []jose.SignatureAlgorithm{jose.ES256})
	if parsed.Headers[0].KeyID != ids[1] {
		t.Fatalf("signed by %s, want the new key %s", parsed.Headers[0].KeyID, ids[1])
	}
	verify(t, rot.JWKS(), tok.JWT)
	verify(t, rot.JWKS(), old.JWT) // the older key's tokens still verify

	// Not keys: refused.
	for name, content := range map[string]string{
		"empty": "", "a certificate": "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
	} {
		if _, err := identity.New("https://s.example", []byte(content)); err == nil {
			t.Errorf("%s accepted as keys", name)
		}
	}
}
