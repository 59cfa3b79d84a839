package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now()
	a := store.Secret{Owner: "acct-a", Name: "openai", Metadata: json.RawMessage(`{"team":"x"}`), KeyID: "k1",
		Sealed: []byte{0, 1, 2, 0xff}, CreatedAt: t0}
	if err := s.CreateSecret(ctx, a, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, a, 2); !errors.Is(err, store.ErrExists) {
		t.Fatalf("the same name again: %v, want ErrExists", err)
	}
	// Another owner's name space is its own.
	if err := s.CreateSecret(ctx, store.Secret{Owner: "acct-b", Name: "openai", KeyID: "k1", Sealed: []byte{9}, CreatedAt: t0}, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, store.Secret{Owner: "acct-a", Name: "db", KeyID: "k0", Sealed: []byte{7}, CreatedAt: t0}, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, store.Secret{Owner: "acct-a", Name: "third", KeyID: "k1", Sealed: []byte{7}, CreatedAt: t0}, 2); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a third secret past a bound of 2: %v, want ErrLimit", err)
	}

	got, err := s.GetSecret(ctx, "acct-a", "openai")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 || got.KeyID != "k1" || !bytes.Equal(got.Sealed, a.Sealed) || string(got.Metadata) != `{"team":"x"}` ||
		!got.CreatedAt.Equal(t0) || !got.UpdatedAt.Equal(t0) || got.LastUsedAt != nil || got.CreatedAt.Location().String() != "UTC" {
		t.Fatalf("got %+v", got)
	}
	if _, err := s.GetSecret(ctx, "acct-b", "db"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another owner's secret: %v, want ErrNotFound", err)
	}
	l, err := s.ListSecrets(ctx, "acct-a")
	if err != nil || len(l) != 2 || l[0].Name != "db" || l[1].Name != "openai" || string(l[0].Metadata) != "{}" {
		t.Fatalf("list: %+v, %v", l, err)
	}

	// A new version; metadata nil keeps it.
	t1 := t0.Add(2 * time.Second)
	if err := s.UpdateSecret(ctx, "acct-a", "openai", 2, "k2", []byte{5, 5}, nil, t1); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateSecret(ctx, "acct-a", "openai", 2, "k2", []byte{6}, nil, t1); !errors.Is(err, store.ErrExists) {
		t.Fatalf("version 2 twice: %v, want ErrExists", err)
	}
	if err := s.UpdateSecret(ctx, "acct-a", "nope", 2, "k2", []byte{6}, nil, t1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of none: %v, want ErrNotFound", err)
	}
	if err := s.UpdateSecret(ctx, "acct-a", "openai", 3, "k2", []byte{8}, json.RawMessage(`{"v":"3"}`), t1); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSecret(ctx, "acct-a", "openai")
	if got.Version != 3 || !bytes.Equal(got.Sealed, []byte{8}) || string(got.Metadata) != `{"v":"3"}` || !got.UpdatedAt.Equal(t1) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("after two updates: %+v", got)
	}

	if err := s.TouchSecret(ctx, "acct-a", "openai", t1); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSecret(ctx, "acct-a", "openai")
	if got.LastUsedAt == nil || !got.LastUsedAt.Equal(t1) {
		t.Fatalf("last used %v, want %v", got.LastUsedAt, t1)
	}

	// Resealing: those under other keys, by owner and name; a stale
	// version is left alone.
	old, err := s.SecretsNotSealedWith(ctx, "k2", 10)
	if err != nil || len(old) != 2 || old[0].Owner != "acct-a" || old[0].Name != "db" || old[1].Owner != "acct-b" {
		t.Fatalf("not sealed with k2: %+v, %v", old, err)
	}
	if ok, err := s.ResealSecret(ctx, "acct-a", "db", 2, "k2", []byte{1}); ok || err != nil {
		t.Fatalf("reseal of a stale version: %v, %v", ok, err)
	}
	if ok, err := s.ResealSecret(ctx, "acct-a", "db", 1, "k2", []byte{1}); !ok || err != nil {
		t.Fatalf("reseal: %v, %v", ok, err)
	}
	if old, _ := s.SecretsNotSealedWith(ctx, "k2", 10); len(old) != 1 {
		t.Fatalf("after a reseal, %d left, want 1", len(old))
	}

	// Uses: recorded in order, newest first, paged; an injected one
	// counts and moves last_used_at forward (never back); a use of a
	// secret that does not exist is dropped; another account's secret of
	// the same name is apart.
	uses := []store.SecretUse{
		{Owner: "acct-a", Name: "openai", SandboxID: "sb1", Host: "api.test", Method: "POST", Path: "/v1", Outcome: store.SecretInjected, At: t1.Add(time.Minute)},
		{Owner: "acct-a", Name: "openai", SandboxID: "sb1", Host: "evil.test", Method: "GET", Path: "/", Outcome: "misdirected", At: t1.Add(2 * time.Minute)},
		{Owner: "acct-a", Name: "nope", SandboxID: "sb1", Host: "evil.test", Method: "GET", Path: "/", Outcome: "misdirected", At: t1},
		{Owner: "acct-a", Name: "openai", SandboxID: "sb2", Host: "api.test", Method: "POST", Path: "/v1", Outcome: store.SecretInjected, At: t1},
	}
	if err := s.RecordSecretUses(ctx, uses); err != nil {
		t.Fatal(err)
	}
	if uses[0].ID == 0 || uses[1].ID <= uses[0].ID || uses[2].ID != 0 || uses[3].ID <= uses[1].ID {
		t.Fatalf("use ids %d %d %d %d", uses[0].ID, uses[1].ID, uses[2].ID, uses[3].ID)
	}
	got, _ = s.GetSecret(ctx, "acct-a", "openai")
	if got.UseCount != 2 || got.LastUsedAt == nil || !got.LastUsedAt.Equal(t1.Add(time.Minute)) {
		t.Fatalf("after uses: count %d, last used %v", got.UseCount, got.LastUsedAt)
	}
	if b, _ := s.GetSecret(ctx, "acct-b", "openai"); b.UseCount != 0 {
		t.Fatalf("another account's secret counted %d uses", b.UseCount)
	}
	ul, err := s.ListSecretUses(ctx, "acct-a", "openai", 0, 2)
	if err != nil || len(ul) != 2 || ul[0].ID != uses[3].ID || ul[1].ID != uses[1].ID || ul[1].Host != "evil.test" ||
		ul[1].Outcome != "misdirected" || !ul[1].At.Equal(t1.Add(2*time.Minute)) || ul[0].SandboxID != "sb2" {
		t.Fatalf("uses, first page: %+v, %v", ul, err)
	}
	if ul, err = s.ListSecretUses(ctx, "acct-a", "openai", ul[1].ID, 10); err != nil || len(ul) != 1 || ul[0].ID != uses[0].ID {
		t.Fatalf("uses, second page: %+v, %v", ul, err)
	}
	if ul, _ := s.ListSecretUses(ctx, "acct-b", "openai", 0, 10); len(ul) != 0 {
		t.Fatalf("another account's uses: %+v", ul)
	}
	// Each secret keeps its newest MaxSecretUses.
	many := make([]store.SecretUse, store.MaxSecretUses+5)
	for i := range many {
		many[i] = store.SecretUse{Owner: "acct-b", Name: "openai", SandboxID: "sb3", Host: "h", Method: "GET", Path: "/", Outcome: "misdirected", At: t1}
	}
	if err := s.RecordSecretUses(ctx, many); err != nil {
		t.Fatal(err)
	}
	if ul, _ := s.ListSecretUses(ctx, "acct-b", "openai", 0, 2*store.MaxSecretUses); len(ul) != store.MaxSecretUses || ul[len(ul)-1].ID != many[5].ID {
		t.Fatalf("kept %d uses, want the newest %d", len(ul), store.MaxSecretUses)
	}

	if err := s.DeleteSecret(ctx, "acct-a", "openai"); err != nil {
		t.Fatal(err)
	}
	if ul, _ := s.ListSecretUses(ctx, "acct-a", "openai", 0, 10); len(ul) != 0 {
		t.Fatalf("uses after delete: %+v", ul)
	}
	if err := s.DeleteSecret(ctx, "acct-a", "openai"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := s.GetSecret(ctx, "acct-a", "openai"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	// Concurrent creates of one account (servers sharing the store):
	// the bound holds.
	const tries, bound = 12, 3
	errs := make(chan error, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.CreateSecret(ctx, store.Secret{Owner: "acct-c", Name: fmt.Sprintf("s%d", i), KeyID: "k1", Sealed: []byte{1}, CreatedAt: t0}, bound)
		}()
	}
	wg.Wait()
	close(errs)
	made := 0
	for err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, store.ErrLimit) && !errors.Is(err, store.ErrUnavailable):
			t.Errorf("a concurrent create: %v", err)
		}
	}
	if l, _ := s.ListSecrets(ctx, "acct-c"); len(l) != made || made != bound {
		t.Fatalf("concurrent creates under a bound of %d: %d made, %d kept", bound, made, len(l))
	}

	// Room again under the bound.
	if err := s.CreateSecret(ctx, store.Secret{Owner: "acct-a", Name: "third", KeyID: "k1", Sealed: []byte{7}, CreatedAt: t0}, 2); err != nil {
		t.Fatal(err)
	}
}
