// Package identity owns the server's workload identity (issue 33, item
// 4): the keys that sign the short-lived tokens the egress gateway puts
// into a sandbox's requests (${identity.token} in a rule's header), the
// tokens themselves (ES256 JWTs), and the OIDC discovery document and
// JWKS through which a relying party (a cloud's federation, a service of
// the operator's) verifies them. No key ever enters a sandbox.
//
// Keys: DATA_DIR/identity-keys.pem (KeyFileName), PEM blocks of P-256
// private keys ("EC PRIVATE KEY" or PKCS#8 "PRIVATE KEY"), mode 0600,
// made with one new key at the first start, refused when others may read
// it. The last key signs; every key is published in the JWKS, so a key
// appended for a rotation leaves the tokens of the older ones verifiable
// until the older block is removed.
//
// It imports the standard library only.
package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// KeyFileName is the signing keys' file under the data dir.
const KeyFileName = "identity-keys.pem"

// TokenLife is how long a token is valid after it is minted.
const TokenLife = 5 * time.Minute

// Paths of the documents a relying party fetches, under the issuer.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/.well-known/jwks.json"
)

// Issuer signs the tokens of one server.
type Issuer struct {
	url  string
	keys []key // the last signs
	now  func() time.Time
}

type key struct {
	id   string
	priv *ecdsa.PrivateKey
	jwk  JWK // its public half, with kid, use and alg
}

// Claims are a token's claims.
type Claims struct {
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Audience  string `json:"aud"`
	IssuedAt  int64  `json:"iat"`
	NotBefore int64  `json:"nbf"`
	Expires   int64  `json:"exp"`
	ID        string `json:"jti"`
	AccountID string `json:"account_id"`
	SandboxID string `json:"sandbox_id"`
}

// Token is a minted token and what the audit keeps of it.
type Token struct {
	JWT    string
	Claims Claims
}

// Subject is the sub claim of a sandbox's tokens.
func Subject(accountID, sandboxID string) string {
	return "account:" + accountID + ":sandbox:" + sandboxID
}

// CheckIssuer returns the issuer URL u in its canonical form (no trailing
// slash), or an error: an absolute http or https URL with a host, no
// query, fragment or user.
func CheckIssuer(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" || p.User != nil ||
		p.RawQuery != "" || p.Fragment != "" || strings.HasSuffix(u, "?") || strings.HasSuffix(u, "#") {
		return "", fmt.Errorf("issuer %q: want an absolute http(s) URL without query, fragment or user", u)
	}
	return strings.TrimRight(u, "/"), nil
}

// New returns the issuer of URL issuer signing with the keys of the PEM
// b (the last signs).
func New(issuer string, b []byte) (*Issuer, error) {
	u, err := CheckIssuer(issuer)
	if err != nil {
		return nil, err
	}
	keys, err := parseKeys(b)
	if err != nil {
		return nil, err
	}
	return &Issuer{url: u, keys: keys, now: time.Now}, nil
}

// Load returns the issuer of URL issuer with the keys of
// dir/KeyFileName, making the file (0600, one new key) at the first
// start. A file others may read is refused.
func Load(issuer, dir string) (*Issuer, error) {
	path := filepath.Join(dir, KeyFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if b, err = NewKeyPEM(); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("identity keys: %w", err)
		}
		_, werr := f.Write(b)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, fmt.Errorf("identity keys: %w", werr)
		}
		return New(issuer, b)
	}
	if err != nil {
		return nil, fmt.Errorf("identity keys: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("identity keys: %s may be read by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	is, err := New(issuer, b)
	if err != nil {
		return nil, fmt.Errorf("identity keys %s: %w", path, err)
	}
	return is, nil
}

// NewKeyPEM makes a new P-256 key, PEM ("EC PRIVATE KEY"): what a
// rotation appends to the key file.
func NewKeyPEM() ([]byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseKeys(b []byte) ([]key, error) {
	var keys []key
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		var priv *ecdsa.PrivateKey
		switch blk.Type {
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			priv = k
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("a %T key: want P-256 (ES256)", k)
			}
			priv = ek
		case "EC PARAMETERS":
			continue // openssl ecparam -genkey writes them first
		default:
			return nil, fmt.Errorf("a PEM block of type %q: want EC PRIVATE KEY or PRIVATE KEY", blk.Type)
		}
		if priv.Curve != elliptic.P256() {
			return nil, fmt.Errorf("a key on %s: want P-256 (ES256)", priv.Curve.Params().Name)
		}
		j, err := publicKey(&priv.PublicKey)
		if err != nil {
			return nil, err
		}
		j.Kid, j.Use, j.Alg = thumbprint(j), "sig", "ES256"
		keys = append(keys, key{id: j.Kid, priv: priv, jwk: j})
	}
	if len(keys) == 0 {
		return nil, errors.New("no key: want PEM blocks of P-256 private keys")
	}
	return keys, nil
}

// JWK is a public key of the JWKS (RFC 7517, 7518).
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	Kid string `json:"kid,omitempty"`
	Use string `json:"use,omitempty"`
	Alg string `json:"alg,omitempty"`
}

var b64 = base64.RawURLEncoding

// publicKey returns the JWK of k (a P-256 key) without kid, use, alg:
// its coordinates from the point's uncompressed encoding (0x04, X, Y,
// 32 bytes each).
func publicKey(k *ecdsa.PublicKey) (JWK, error) {
	b, err := k.Bytes()
	if err != nil {
		return JWK{}, err
	}
	if len(b) != 65 {
		return JWK{}, fmt.Errorf("a public key of %d bytes: want P-256's 65", len(b))
	}
	return JWK{Kty: "EC", Crv: "P-256", X: b64.EncodeToString(b[1:33]), Y: b64.EncodeToString(b[33:])}, nil
}

// thumbprint is the RFC 7638 thumbprint of the key j: its kid.
func thumbprint(j JWK) string {
	sum := sha256.Sum256([]byte(`{"crv":"P-256","kty":"EC","x":"` + j.X + `","y":"` + j.Y + `"}`))
	return b64.EncodeToString(sum[:])
}

// URL is the issuer's URL (the iss claim).
func (is *Issuer) URL() string { return is.url }

// KeyIDs returns the kids of the keys, the signing one last.
func (is *Issuer) KeyIDs() []string {
	out := make([]string, len(is.keys))
	for i, k := range is.keys {
		out[i] = k.id
	}
	return out
}

// JWKS returns the JSON Web Key Set of every key.
func (is *Issuer) JWKS() []byte {
	set := struct {
		Keys []JWK `json:"keys"`
	}{}
	for _, k := range is.keys {
		set.Keys = append(set.Keys, k.jwk)
	}
	b, _ := json.Marshal(set)
	return b
}

// Discovery returns the OIDC discovery document.
func (is *Issuer) Discovery() []byte {
	b, _ := json.Marshal(map[string]any{
		"issuer":                                is.url,
		"jwks_uri":                              is.url + JWKSPath,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{"ES256"},
		"claims_supported":                      []string{"iss", "sub", "aud", "iat", "nbf", "exp", "jti", "account_id", "sandbox_id"},
	})
	return b
}

// Mint returns a new token for the sandbox of the account, for audience.
func (is *Issuer) Mint(accountID, sandboxID, audience string) (Token, error) {
	if accountID == "" || sandboxID == "" || audience == "" {
		return Token{}, errors.New("a token needs an account, a sandbox and an audience")
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Token{}, err
	}
	now := is.now().Unix()
	c := Claims{
		Issuer: is.url, Subject: Subject(accountID, sandboxID), Audience: audience,
		IssuedAt: now, NotBefore: now, Expires: now + int64(TokenLife/time.Second),
		ID: b64.EncodeToString(id[:]), AccountID: accountID, SandboxID: sandboxID,
	}
	k := is.keys[len(is.keys)-1]
	head, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": k.id})
	body, err := json.Marshal(c)
	if err != nil {
		return Token{}, err
	}
	signing := b64.EncodeToString(head) + "." + b64.EncodeToString(body)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, k.priv, sum[:])
	if err != nil {
		return Token{}, err
	}
	var sig [64]byte
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return Token{JWT: signing + "." + b64.EncodeToString(sig[:]), Claims: c}, nil
}
