package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestIdentityDocumentsServed: a real server without --public-url serves
// its OIDC discovery document and JWKS without a key, its issuer
// http://LISTEN, and has made its signing keys' file 0600 in the data
// dir.
func TestIdentityDocumentsServed(t *testing.T) {
	s := start(t)
	get := func(path string, v any) {
		t.Helper()
		res, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || res.Header.Get("Cache-Control") == "" {
			t.Fatalf("GET %s: %d %v %s", path, res.StatusCode, res.Header, b)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	var d struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	get("/.well-known/openid-configuration", &d)
	if d.Issuer != s.url || d.JWKSURI != s.url+"/.well-known/jwks.json" {
		t.Fatalf("discovery %+v, want the issuer %s", d, s.url)
	}
	var set struct {
		Keys []struct{ Kty, Crv, Kid, Alg string } `json:"keys"`
	}
	get("/.well-known/jwks.json", &set)
	if len(set.Keys) != 1 || set.Keys[0].Kty != "EC" || set.Keys[0].Crv != "P-256" || set.Keys[0].Alg != "ES256" || set.Keys[0].Kid == "" {
		t.Fatalf("JWKS %+v", set)
	}
	fi, err := os.Stat(filepath.Join(s.dataDir, "identity-keys.pem"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v", fi, err)
	}
}
