// Package auth issues and checks API keys. A key is "sf_" (or "e2b_",
// E2B's shape) followed by 40 lowercase hex characters from crypto/rand;
// only its SHA-256 is stored. Keys carry 160 random bits, so a fast hash is
// right (no password stretching is needed), and lookups by hash do not leak
// the secret through timing; the final comparison is constant time anyway.
//
// Imports: internal/store, internal/apierr and the standard library.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Key prefixes.
const (
	PrefixSheepfold = "sf_"
	PrefixE2B       = "e2b_"
)

// Hash returns the lowercase hex SHA-256 of a secret.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// NewSecret returns a new key secret with the given prefix.
func NewSecret(prefix string) string { return prefix + randomHex(20) }

// CreateOptions describe a new key.
type CreateOptions struct {
	Name string
	// Owner is the id of the account the key acts for; an account of that
	// id (and name) is made when there is none. Default: a new account
	// named after the key's own id, as every key was its own owner before
	// accounts existed.
	Owner string
	Admin bool // the admin role: may manage accounts
	E2B   bool // E2B-shaped secret ("e2b_...")
	// FreeMicros are the free credits of an account this call creates.
	FreeMicros int64
}

// Create makes a key, stores its hash and returns the record and the
// secret, which is never stored and cannot be shown again.
func Create(ctx context.Context, st store.Store, opt CreateOptions) (store.Key, string, error) {
	prefix := PrefixSheepfold
	if opt.E2B {
		prefix = PrefixE2B
	}
	secret := NewSecret(prefix)
	k := store.Key{ID: "key_" + randomHex(8), Name: opt.Name, Owner: opt.Owner, Role: store.RoleUser,
		Hash: Hash(secret), CreatedAt: time.Now().UTC()}
	if opt.Admin {
		k.Role = store.RoleAdmin
	}
	if k.Owner == "" {
		k.Owner = k.ID
	}
	acct := store.Account{ID: k.Owner, Name: k.Owner, CreatedAt: k.CreatedAt}
	if err := st.CreateAccountKey(ctx, acct, k, opt.FreeMicros); err != nil {
		return store.Key{}, "", err
	}
	return k, secret, nil
}

// wellFormed reports whether s looks like a key, so that garbage never
// reaches the database.
func wellFormed(s string) bool {
	var hexPart string
	switch {
	case strings.HasPrefix(s, PrefixSheepfold):
		hexPart = s[len(PrefixSheepfold):]
	case strings.HasPrefix(s, PrefixE2B):
		hexPart = s[len(PrefixE2B):]
	default:
		return false
	}
	if len(hexPart) != 40 {
		return false
	}
	for _, c := range hexPart {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Principal is who a request acts for.
type Principal struct {
	KeyID string
	Owner string // the account's id
	Role  string // store.RoleUser or store.RoleAdmin
}

// Admin reports whether the principal may manage accounts.
func (p Principal) Admin() bool { return p.Role == store.RoleAdmin }

// Authenticator checks the keys of requests against a store.
type Authenticator struct {
	Store store.Store
}

// errAuth is the one answer to every authentication failure, so that a
// caller learns nothing about which keys exist.
func errAuth(cause error) error {
	// The seeds' message, word for word (the key goes in Authorization:
	// Bearer <key> or X-API-Key: <key>; the cause stays in the log).
	return apierr.Wrap(cause, apierr.AuthenticationFailed, "Authentication failed. Invalid API key")
}

// FromRequest reads the key from Authorization: Bearer or X-API-Key.
func FromRequest(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return strings.TrimSpace(k)
	}
	h := r.Header.Get("Authorization")
	if scheme, rest, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(rest)
	}
	return ""
}

// Check authenticates a secret.
func (a *Authenticator) Check(ctx context.Context, secret string) (Principal, error) {
	if secret == "" {
		return Principal{}, errAuth(errors.New("no key"))
	}
	if !wellFormed(secret) {
		return Principal{}, errAuth(errors.New("malformed key"))
	}
	h := Hash(secret)
	k, err := a.Store.KeyByHash(ctx, h)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, errAuth(errors.New("unknown key"))
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up key: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(k.Hash), []byte(h)) != 1 {
		return Principal{}, errAuth(errors.New("hash mismatch"))
	}
	if k.RevokedAt != nil {
		return Principal{}, errAuth(fmt.Errorf("key %s revoked", k.ID))
	}
	return Principal{KeyID: k.ID, Owner: k.Owner, Role: k.Role}, nil
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal of an authenticated request.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
