package store

import (
	"context"
	"encoding/json"
	"time"
)

// Secret is an account's stored secret (internal/secrets). Its value is
// kept only sealed: Sealed is the nonce and the AEAD ciphertext, under the
// server key KeyID; the store never sees the value.
type Secret struct {
	Owner      string
	Name       string
	Metadata   json.RawMessage // a JSON object; nil is {}
	Version    int64           // 1 when created, one more at each new value
	KeyID      string
	Sealed     []byte
	CreatedAt  time.Time
	UpdatedAt  time.Time // when its current version was stored
	LastUsedAt *time.Time
	UseCount   int64 // its uses recorded with outcome SecretInjected
}

// SecretUse is one use of a secret by a sandbox's request at the egress
// gateway, or one the gateway refused (internal/egress, inject.go).
type SecretUse struct {
	ID        int64 // set by the store; only grows
	Owner     string
	Name      string
	SandboxID string
	Host      string
	Method    string
	Path      string
	Outcome   string // SecretInjected, or why not ("misdirected", "unavailable")
	At        time.Time
}

// SecretInjected is the outcome of a use that put the value into a
// request: the one that counts in UseCount and LastUsedAt.
const SecretInjected = "injected"

// MaxSecretUses is how many uses the store keeps of one secret: the
// newest.
const MaxSecretUses = 1000

// SecretStore persists secrets. Owner and name identify a secret.
type SecretStore interface {
	// CreateSecret stores s (its Version is 1) when its owner has fewer
	// than max secrets: ErrLimit otherwise, ErrExists when the name is
	// taken. The count and the insert are one step for every server
	// sharing the store.
	CreateSecret(ctx context.Context, s Secret, max int) error
	// GetSecret returns ErrNotFound for an unknown owner and name.
	GetSecret(ctx context.Context, owner, name string) (Secret, error)
	// ListSecrets lists an owner's secrets by name.
	ListSecrets(ctx context.Context, owner string) ([]Secret, error)
	// UpdateSecret stores version of a secret, its value sealed with
	// keyID, and its metadata unless metadata is nil; UpdatedAt becomes
	// at. version must be the stored version plus one (the value was
	// sealed for it): ErrExists when another write took that version
	// first, ErrNotFound for an unknown secret.
	UpdateSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte, metadata json.RawMessage, at time.Time) error
	// ResealSecret replaces the sealed value of the given version with
	// the same value under another key; false (and no error) when the
	// secret is gone or at another version now.
	ResealSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte) (bool, error)
	// SecretsNotSealedWith lists up to limit secrets of every owner
	// whose key is not keyID, by owner and name.
	SecretsNotSealedWith(ctx context.Context, keyID string, limit int) ([]Secret, error)
	// TouchSecret records a use of a secret at at.
	TouchSecret(ctx context.Context, owner, name string, at time.Time) error
	// DeleteSecret deletes a secret and its uses; ErrNotFound when
	// there is none.
	DeleteSecret(ctx context.Context, owner, name string) error
	// RecordSecretUses appends uses (their IDs are set in order). A use
	// of a secret that does not exist is dropped; each injected one
	// counts in its secret's UseCount and moves its LastUsedAt forward.
	// Each secret keeps its newest MaxSecretUses.
	RecordSecretUses(ctx context.Context, uses []SecretUse) error
	// ListSecretUses lists a secret's uses newest first: at most limit,
	// with IDs below before (0: from the newest).
	ListSecretUses(ctx context.Context, owner, name string, before int64, limit int) ([]SecretUse, error)
}
