package auth_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

func TestCreateAndCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k, secret, err := auth.Create(ctx, st, auth.CreateOptions{Name: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sf_[0-9a-f]{40}$`).MatchString(secret) || k.Owner != k.ID || k.Hash != auth.Hash(secret) {
		t.Fatalf("key %+v secret %q", k, secret)
	}
	_, e2b, _ := auth.Create(ctx, st, auth.CreateOptions{E2B: true, Owner: "team"})
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(e2b) {
		t.Fatalf("e2b secret %q", e2b)
	}
	a := &auth.Authenticator{Store: st}
	p, err := a.Check(ctx, secret)
	if err != nil || p.Owner != k.ID {
		t.Fatalf("Check = %+v, %v", p, err)
	}
	if p, err := a.Check(ctx, e2b); err != nil || p.Owner != "team" {
		t.Fatalf("Check e2b = %+v, %v", p, err)
	}
	for _, bad := range []string{"", "sf_", secret[:len(secret)-1] + "x", "sf_" + string(make([]byte, 40)), auth.NewSecret("sf_")} {
		if _, err := a.Check(ctx, bad); apierr.CodeOf(err) != apierr.AuthenticationFailed {
			t.Errorf("Check(%q) = %v", bad, err)
		}
	}
	if err := st.RevokeKey(ctx, k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, secret); apierr.CodeOf(err) != apierr.AuthenticationFailed {
		t.Fatalf("revoked key: %v", err)
	}
}

func TestFromRequest(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer  sf_x ")
	if got := auth.FromRequest(r); got != "sf_x" {
		t.Fatalf("bearer: %q", got)
	}
	r.Header.Set("X-API-Key", "sf_y")
	if got := auth.FromRequest(r); got != "sf_y" {
		t.Fatalf("x-api-key: %q", got)
	}
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Basic abc")
	if got := auth.FromRequest(r); got != "" {
		t.Fatalf("basic: %q", got)
	}
}
