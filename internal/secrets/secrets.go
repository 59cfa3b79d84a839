// Package secrets keeps each account's secrets: named values that code in
// a sandbox may use without ever reading (issue 33). A value is written
// once per version (create, or a new version) and never given back by any
// API: it is read back only by the server, for the egress gateway to put
// into a request (Service.Resolve, which records the use).
//
// # Sealed at rest
//
// A value is stored only sealed (store.SecretStore, migration 0016): AES-
// 256-GCM under a server key, a random 96-bit nonce per value, and the
// account id, the secret's name and its version as additional data, so
// that a sealed value copied to another row (another account, another
// name, an older version) does not open. The server's keys (Keyring) are
// read from `serve --secrets-key-file`, else from $SHEEPFOLD_SECRETS_KEYS,
// else from DATA_DIR/secrets.key, made with one new key (0600) at the
// first start; a key file others may read is refused. Each key has an id;
// the last one seals, every one opens. To rotate: add a new line (a new
// id) at the end of the file and restart; at start the server reseals
// every value sealed under an older key (Service.Reseal, logged), after
// which the older lines may go. A value whose key is gone does not open
// and fails closed (ERR_INTERNAL where it is resolved).
//
// # Bounds
//
// Names are 1 to 64 letters, digits, underscores and hyphens, not
// starting with a digit or a hyphen (they are what `${secrets.NAME}`
// names; the hyphen is E2B's, whose SDKs name secrets like
// "openai-api-key": a hyphen cannot end or open a placeholder, a path
// segment or a header value, so it costs nothing to accept); a value is 1 byte to
// MaxValueBytes; metadata is an object of at most MaxMetadataKeys string
// values; an account keeps at most Options.MaxPerAccount secrets
// (ERR_STORAGE_QUOTA_EXCEEDED past it), counted and inserted in one store
// step. Bad input is ERR_BAD_REQUEST naming its field.
//
// Imports: api (a secret and its uses as the API shows them),
// internal/store, internal/apierr, internal/bound and the standard
// library.
package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/store"
)

// The bounds of what one secret holds.
const (
	MaxNameLen          = 64
	MaxValueBytes       = 32 << 10
	MaxMetadataKeys     = 16
	MaxMetadataKeyLen   = 64
	MaxMetadataValueLen = 512
	// DefaultMaxPerAccount is Options.MaxPerAccount's default, and
	// MaxMaxPerAccount its largest.
	DefaultMaxPerAccount = 100
	MaxMaxPerAccount     = 10_000
)

var namePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// Options tunes a Service.
type Options struct {
	// MaxPerAccount bounds the secrets of one account [100].
	MaxPerAccount int
	// Now is the clock [time.Now].
	Now func() time.Time
}

// Service is the secrets of every account.
type Service struct {
	st   store.SecretStore
	keys *Keyring
	max  int
	now  func() time.Time
}

// New returns the service over st, sealing with keys.
func New(st store.SecretStore, keys *Keyring, o Options) (*Service, error) {
	if o.MaxPerAccount == 0 {
		o.MaxPerAccount = DefaultMaxPerAccount
	}
	if err := bound.Int("max secrets per account", int64(o.MaxPerAccount), 1, MaxMaxPerAccount); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{st: st, keys: keys, max: o.MaxPerAccount, now: o.Now}, nil
}

// Info is what the API shows of a secret: never its value.
type Info = api.Secret

func infoOf(s store.Secret) Info {
	m := map[string]string{}
	_ = json.Unmarshal(s.Metadata, &m) // written by Create/Update from a map
	return Info{Name: s.Name, Metadata: m, Version: s.Version, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, LastUsedAt: s.LastUsedAt,
		UseCount: s.UseCount}
}

// Use is what the API shows of one use of a secret.
type Use = api.SecretUse

// MaxUsesPage bounds one page of Uses.
const MaxUsesPage = 1000

// CheckName refuses a name that is not 1 to 64 letters, digits,
// underscores and hyphens starting with a letter or an underscore.
func CheckName(name string) error {
	if len(name) == 0 || len(name) > MaxNameLen || !namePattern.MatchString(name) {
		return bound.Error("name", "must be 1 to %d letters, digits, underscores and hyphens, starting with a letter or an underscore", MaxNameLen)
	}
	return nil
}

func checkValue(v string) error {
	if len(v) == 0 || len(v) > MaxValueBytes {
		return bound.Error("value", "must be 1 to %d bytes", MaxValueBytes)
	}
	return nil
}

func metadataJSON(m map[string]string) (json.RawMessage, error) {
	if len(m) > MaxMetadataKeys {
		return nil, bound.Error("metadata", "may hold at most %d keys", MaxMetadataKeys)
	}
	for k, v := range m {
		if k == "" || len(k) > MaxMetadataKeyLen || !utf8.ValidString(k) {
			return nil, bound.Error("metadata", "keys must be 1 to %d bytes of UTF-8", MaxMetadataKeyLen)
		}
		if len(v) > MaxMetadataValueLen || !utf8.ValidString(v) {
			return nil, bound.Error("metadata", "values must be at most %d bytes of UTF-8", MaxMetadataValueLen)
		}
	}
	if m == nil {
		m = map[string]string{}
	}
	return json.Marshal(m)
}

func notFound(name string) error {
	return apierr.New(apierr.NotFound, "secret %q not found", name)
}

// Create stores a new secret at version 1.
func (s *Service) Create(ctx context.Context, owner, name, value string, metadata map[string]string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	if err := checkValue(value); err != nil {
		return Info{}, err
	}
	meta, err := metadataJSON(metadata)
	if err != nil {
		return Info{}, err
	}
	keyID, sealed, err := s.keys.Seal(owner, name, 1, []byte(value))
	if err != nil {
		return Info{}, err
	}
	sec := store.Secret{Owner: owner, Name: name, Metadata: meta, Version: 1, KeyID: keyID, Sealed: sealed,
		CreatedAt: s.now().UTC().Truncate(time.Microsecond)}
	sec.UpdatedAt = sec.CreatedAt
	switch err := s.st.CreateSecret(ctx, sec, s.max); {
	case errors.Is(err, store.ErrExists):
		return Info{}, apierr.New(apierr.Conflict, "secret %q exists: store a new version with PUT /v1/secrets/%s", name, name)
	case errors.Is(err, store.ErrLimit):
		return Info{}, apierr.New(apierr.StorageQuotaExceeded, "this account keeps as many secrets as it may (%d): delete some to make room", s.max)
	case err != nil:
		return Info{}, err
	}
	return infoOf(sec), nil
}

// Get returns a secret's information.
func (s *Service) Get(ctx context.Context, owner, name string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	sec, err := s.st.GetSecret(ctx, owner, name)
	if errors.Is(err, store.ErrNotFound) {
		return Info{}, notFound(name)
	}
	if err != nil {
		return Info{}, err
	}
	return infoOf(sec), nil
}

// List returns an account's secrets by name.
func (s *Service) List(ctx context.Context, owner string) ([]Info, error) {
	l, err := s.st.ListSecrets(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(l))
	for i, sec := range l {
		out[i] = infoOf(sec)
	}
	return out, nil
}

// Update stores a new version of a secret's value (a rotation); metadata,
// when not nil, replaces its metadata. The older value is gone.
func (s *Service) Update(ctx context.Context, owner, name, value string, metadata map[string]string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	if err := checkValue(value); err != nil {
		return Info{}, err
	}
	var meta json.RawMessage
	if metadata != nil {
		var err error
		if meta, err = metadataJSON(metadata); err != nil {
			return Info{}, err
		}
	}
	cur, err := s.st.GetSecret(ctx, owner, name)
	if errors.Is(err, store.ErrNotFound) {
		return Info{}, notFound(name)
	}
	if err != nil {
		return Info{}, err
	}
	version := cur.Version + 1
	keyID, sealed, err := s.keys.Seal(owner, name, version, []byte(value))
	if err != nil {
		return Info{}, err
	}
	at := s.now().UTC().Truncate(time.Microsecond)
	switch err := s.st.UpdateSecret(ctx, owner, name, version, keyID, sealed, meta, at); {
	case errors.Is(err, store.ErrNotFound):
		return Info{}, notFound(name)
	case errors.Is(err, store.ErrExists):
		return Info{}, apierr.New(apierr.Conflict, "secret %q changed while this version was stored: try again", name)
	case err != nil:
		return Info{}, err
	}
	cur.Version, cur.UpdatedAt = version, at
	if meta != nil {
		cur.Metadata = meta
	}
	return infoOf(cur), nil
}

// Delete deletes a secret.
func (s *Service) Delete(ctx context.Context, owner, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	err := s.st.DeleteSecret(ctx, owner, name)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(name)
	}
	return err
}

// Resolve returns a secret's current value, for the server alone, and
// touches its last use (Value, then TouchSecret). A value that does not
// open fails closed.
func (s *Service) Resolve(ctx context.Context, owner, name string) ([]byte, error) {
	v, err := s.Value(ctx, owner, name)
	if err != nil {
		return nil, err
	}
	if err := s.st.TouchSecret(ctx, owner, name, s.now()); err != nil {
		return nil, err
	}
	return v, nil
}

// Value returns a secret's current value, for the server alone (the
// egress gateway puts it into a request); the use is recorded apart
// (RecordUses). A value that does not open fails closed.
func (s *Service) Value(ctx context.Context, owner, name string) ([]byte, error) {
	sec, err := s.st.GetSecret(ctx, owner, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound(name)
	}
	if err != nil {
		return nil, err
	}
	v, err := s.keys.Open(sec.KeyID, owner, name, sec.Version, sec.Sealed)
	if err != nil {
		return nil, apierr.Wrap(err, apierr.Internal, "secret %q cannot be read with the server's keys", name)
	}
	return v, nil
}

// RecordUses records uses of secrets (store.SecretStore.RecordSecretUses).
func (s *Service) RecordUses(ctx context.Context, uses []store.SecretUse) error {
	return s.st.RecordSecretUses(ctx, uses)
}

// Uses lists a secret's recorded uses, newest first: at most limit (1 to
// MaxUsesPage), with ids below before (0: from the newest).
func (s *Service) Uses(ctx context.Context, owner, name string, before int64, limit int) ([]Use, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := bound.Int("limit", int64(limit), 1, MaxUsesPage); err != nil {
		return nil, err
	}
	if _, err := s.Get(ctx, owner, name); err != nil {
		return nil, err
	}
	l, err := s.st.ListSecretUses(ctx, owner, name, before, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Use, len(l))
	for i, u := range l {
		out[i] = Use{ID: u.ID, SandboxID: u.SandboxID, Host: u.Host, Method: u.Method, Path: u.Path, Outcome: u.Outcome, At: u.At}
	}
	return out, nil
}

// Reseal seals again, under the current key, every value sealed under
// another, and says how many it resealed. It stops at the first value no
// key opens (a key missing from the keyring).
func (s *Service) Reseal(ctx context.Context) (int, error) {
	n := 0
	for {
		l, err := s.st.SecretsNotSealedWith(ctx, s.keys.Current(), 100)
		if err != nil || len(l) == 0 {
			return n, err
		}
		for _, sec := range l {
			v, err := s.keys.Open(sec.KeyID, sec.Owner, sec.Name, sec.Version, sec.Sealed)
			if err != nil {
				return n, fmt.Errorf("reseal secret %q of account %s: %w", sec.Name, sec.Owner, err)
			}
			keyID, sealed, err := s.keys.Seal(sec.Owner, sec.Name, sec.Version, v)
			if err != nil {
				return n, err
			}
			ok, err := s.st.ResealSecret(ctx, sec.Owner, sec.Name, sec.Version, keyID, sealed)
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
	}
}
