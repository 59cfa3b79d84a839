package secrets_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

func openStore(t *testing.T) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func keyring(t *testing.T, ids ...string) (*secrets.Keyring, string) {
	t.Helper()
	var text string
	for _, id := range ids {
		l, err := secrets.NewKeyLine(id)
		if err != nil {
			t.Fatal(err)
		}
		text += l
	}
	k, err := secrets.ParseKeys(text)
	if err != nil {
		t.Fatal(err)
	}
	return k, text
}

func code(err error) apierr.Code {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestSecretsLifecycle(t *testing.T) {
	ctx := context.Background()
	db := openStore(t)
	k, _ := keyring(t, "k1")
	s, err := secrets.New(db, k, secrets.Options{MaxPerAccount: 2})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Create(ctx, "acct-a", "OPENAI_key", "sk-first", map[string]string{"team": "x"})
	if err != nil || info.Version != 1 || info.Metadata["team"] != "x" || info.LastUsedAt != nil {
		t.Fatalf("create: %+v, %v", info, err)
	}
	if _, err := s.Create(ctx, "acct-a", "OPENAI_key", "sk-other", nil); code(err) != apierr.Conflict {
		t.Fatalf("create twice: %v, want ERR_CONFLICT", err)
	}
	if _, err := s.Create(ctx, "acct-b", "OPENAI_key", "sk-b", nil); err != nil {
		t.Fatalf("another account, the same name: %v", err)
	}
	if v, err := s.Resolve(ctx, "acct-a", "OPENAI_key"); err != nil || string(v) != "sk-first" {
		t.Fatalf("resolve: %q, %v", v, err)
	}
	if info, _ := s.Get(ctx, "acct-a", "OPENAI_key"); info.LastUsedAt == nil {
		t.Fatal("resolve did not record the use")
	}
	info, err = s.Update(ctx, "acct-a", "OPENAI_key", "sk-second", nil)
	if err != nil || info.Version != 2 || info.Metadata["team"] != "x" {
		t.Fatalf("update: %+v, %v", info, err)
	}
	if v, _ := s.Resolve(ctx, "acct-a", "OPENAI_key"); string(v) != "sk-second" {
		t.Fatalf("after a new version, resolve gives %q", v)
	}
	if v, _ := s.Resolve(ctx, "acct-b", "OPENAI_key"); string(v) != "sk-b" {
		t.Fatalf("acct-b resolves %q", v)
	}
	if _, err := s.Update(ctx, "acct-a", "nope", "v", nil); code(err) != apierr.NotFound {
		t.Fatalf("update of none: %v", err)
	}
	if _, err := s.Create(ctx, "acct-a", "two", "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "acct-a", "three", "v", nil); code(err) != apierr.StorageQuotaExceeded {
		t.Fatalf("past the bound of 2: %v, want ERR_STORAGE_QUOTA_EXCEEDED", err)
	}
	l, err := s.List(ctx, "acct-a")
	if err != nil || len(l) != 2 || l[0].Name != "OPENAI_key" || l[1].Name != "two" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if err := s.Delete(ctx, "acct-a", "OPENAI_key"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "acct-a", "OPENAI_key"); code(err) != apierr.NotFound {
		t.Fatalf("a deleted secret resolves: %v", err)
	}
	if err := s.Delete(ctx, "acct-a", "OPENAI_key"); code(err) != apierr.NotFound {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestSecretsBadInput(t *testing.T) {
	ctx := context.Background()
	k, _ := keyring(t, "k1")
	s, err := secrets.New(openStore(t), k, secrets.Options{})
	if err != nil {
		t.Fatal(err)
	}
	big := map[string]string{}
	for i := range secrets.MaxMetadataKeys + 1 {
		big[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name, value string
		meta        map[string]string
		field       string
	}{
		{"", "v", nil, "name"},
		{"9lives", "v", nil, "name"},
		{"-ab", "v", nil, "name"},
		{"a b", "v", nil, "name"},
		{"a/b", "v", nil, "name"},
		{"a.b", "v", nil, "name"},
		{"a}b", "v", nil, "name"},
		{strings.Repeat("a", secrets.MaxNameLen+1), "v", nil, "name"},
		{"ok", "", nil, "value"},
		{"ok", strings.Repeat("v", secrets.MaxValueBytes+1), nil, "value"},
		{"ok", "v", big, "metadata"},
		{"ok", "v", map[string]string{"": "x"}, "metadata"},
		{"ok", "v", map[string]string{"k": strings.Repeat("x", secrets.MaxMetadataValueLen+1)}, "metadata"},
	} {
		_, err := s.Create(ctx, "acct", tc.name, tc.value, tc.meta)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Code != apierr.BadRequest || ae.Details["field"] != tc.field {
			t.Errorf("create %q: %v, want ERR_BAD_REQUEST on %s", tc.name, err, tc.field)
		}
	}
	if _, err := s.Create(ctx, "acct", strings.Repeat("a", secrets.MaxNameLen), strings.Repeat("v", secrets.MaxValueBytes), nil); err != nil {
		t.Errorf("the largest name and value: %v", err)
	}
	// E2B's names hold hyphens (its SDK's own example).
	if _, err := s.Create(ctx, "acct", "openai-api-key", "v", nil); err != nil {
		t.Errorf("a hyphenated name: %v", err)
	}
}

// TestSecretsSealedAtRest: the store holds no value in clear, and a
// sealed value moved to another row (account, name or version) does not
// open there.
func TestSecretsSealedAtRest(t *testing.T) {
	ctx := context.Background()
	db := openStore(t)
	k, _ := keyring(t, "k1")
	s, _ := secrets.New(db, k, secrets.Options{})
	const value = "sk-live-very-secret-value"
	for _, own := range []string{"acct-a", "acct-b"} {
		if _, err := s.Create(ctx, own, "api", value, nil); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := db.GetSecret(ctx, "acct-a", "api")
	b, _ := db.GetSecret(ctx, "acct-b", "api")
	if bytes.Contains(a.Sealed, []byte(value)) || bytes.Equal(a.Sealed, b.Sealed) {
		t.Fatal("the value is stored in clear, or two rows share a nonce")
	}
	// The control: the row's own sealed value opens.
	if v, err := k.Open(a.KeyID, "acct-a", "api", 1, a.Sealed); err != nil || string(v) != value {
		t.Fatalf("control: %q, %v", v, err)
	}
	for _, row := range []struct {
		owner, name string
		version     int64
	}{{"acct-b", "api", 1}, {"acct-a", "other", 1}, {"acct-a", "api", 2}} {
		if _, err := k.Open(a.KeyID, row.owner, row.name, row.version, a.Sealed); !errors.Is(err, secrets.ErrOpen) {
			t.Errorf("acct-a's value opened as %+v: %v", row, err)
		}
	}
	// Copying acct-a's sealed value into acct-b's row: acct-b resolves no
	// value of acct-a's, it fails closed.
	if ok, err := db.ResealSecret(ctx, "acct-b", "api", 1, a.KeyID, a.Sealed); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := s.Resolve(ctx, "acct-b", "api"); code(err) != apierr.Internal {
		t.Fatalf("a moved value resolved: %v", err)
	}
	flipped := bytes.Clone(a.Sealed)
	flipped[len(flipped)-1] ^= 1
	if _, err := k.Open(a.KeyID, "acct-a", "api", 1, flipped); !errors.Is(err, secrets.ErrOpen) {
		t.Errorf("a changed value opened: %v", err)
	}
}

// TestSecretsKeyRotation: a keyring with a new key last seals with it,
// opens what the older key sealed, and Reseal moves every value to it;
// then the older key may go.
func TestSecretsKeyRotation(t *testing.T) {
	ctx := context.Background()
	db := openStore(t)
	_, text1 := keyring(t, "k1")
	k1, _ := secrets.ParseKeys(text1)
	s1, _ := secrets.New(db, k1, secrets.Options{})
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s1.Create(ctx, "acct", n, "value-"+n, nil); err != nil {
			t.Fatal(err)
		}
	}
	line2, _ := secrets.NewKeyLine("k2")
	k12, err := secrets.ParseKeys(text1 + line2)
	if err != nil || k12.Current() != "k2" {
		t.Fatalf("keyring: %v, current %s", err, k12.Current())
	}
	s12, _ := secrets.New(db, k12, secrets.Options{})
	if v, err := s12.Resolve(ctx, "acct", "a"); err != nil || string(v) != "value-a" {
		t.Fatalf("the old key no longer opens: %q, %v", v, err)
	}
	// Without k1 nothing opens yet (the control for after the reseal).
	k2, _ := secrets.ParseKeys(line2)
	s2, _ := secrets.New(db, k2, secrets.Options{})
	if _, err := s2.Resolve(ctx, "acct", "a"); code(err) != apierr.Internal {
		t.Fatalf("k2 alone opened a k1 value: %v", err)
	}
	if n, err := s2.Reseal(ctx); err == nil || n != 0 {
		t.Fatalf("reseal without the old key: %d, %v; want an error", n, err)
	}
	if n, err := s12.Reseal(ctx); err != nil || n != 3 {
		t.Fatalf("reseal: %d, %v", n, err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if v, err := s2.Resolve(ctx, "acct", n); err != nil || string(v) != "value-"+n {
			t.Fatalf("after the reseal, k2 alone: %q, %v", v, err)
		}
	}
	if n, err := s12.Reseal(ctx); err != nil || n != 0 {
		t.Fatalf("a second reseal: %d, %v", n, err)
	}
}

func TestLoadKeys(t *testing.T) {
	t.Setenv(secrets.KeyEnv, "")
	dir := t.TempDir()
	k, err := secrets.LoadKeys("", dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, secrets.KeyFileName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the generated key file: %v, %v", fi, err)
	}
	again, err := secrets.LoadKeys("", dir)
	if err != nil || again.Current() != k.Current() {
		t.Fatalf("a second start made another key: %v", err)
	}
	_, sealed, _ := k.Seal("a", "n", 1, []byte("v"))
	if v, err := again.Open(k.Current(), "a", "n", 1, sealed); err != nil || string(v) != "v" {
		t.Fatalf("the second start's key does not open the first's: %v", err)
	}

	loose := filepath.Join(dir, "loose.key")
	line, _ := secrets.NewKeyLine("k1")
	if err := os.WriteFile(loose, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.LoadKeys(loose, dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file others may read: %v", err)
	}
	os.Chmod(loose, 0o600)
	if k, err := secrets.LoadKeys(loose, dir); err != nil || k.Current() != "k1" {
		t.Fatalf("--secrets-key-file: %v", err)
	}

	t.Setenv(secrets.KeyEnv, line)
	if k, err := secrets.LoadKeys("", t.TempDir()); err != nil || k.Current() != "k1" {
		t.Fatalf("$%s: %v", secrets.KeyEnv, err)
	}

	for _, bad := range []string{"", "# only a comment\n", "k1\n", "k1:c2hvcnQ=\n", "bad id:" + strings.Repeat("A", 44) + "\n", line + line} {
		if _, err := secrets.ParseKeys(bad); err == nil {
			t.Errorf("ParseKeys(%q) accepted", bad)
		}
	}
}

var _ store.SecretStore = (*sqlite.DB)(nil)
