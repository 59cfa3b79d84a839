package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }

// TestKeysCLI runs the keys commands on SQLite (the default) and on a
// PostgreSQL given as --database.
func TestKeysCLI(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testKeysCLI(t, config.Config{DataDir: t.TempDir() + "/data"}) })
	t.Run("postgres", func(t *testing.T) {
		cfg := config.Config{DataDir: t.TempDir() + "/data", Database: pgtest.New(t)}
		testKeysCLI(t, cfg)
		if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
			t.Fatalf("a PostgreSQL store made the data dir: %v", err)
		}
	})
}

func testKeysCLI(t *testing.T, cfg config.Config) {
	ctx := context.Background()
	st, err := openStore(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	var out bytes.Buffer
	if err := createKey(ctx, st, &out, auth.CreateOptions{Name: "ci"}); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^id:\s+(\S+)$[\s\S]*^key:\s+(sf_[0-9a-f]{40})$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("create printed:\n%s", out.String())
	}
	id, secret := m[1], m[2]
	out.Reset()
	if err := createKey(ctx, st, &out, auth.CreateOptions{E2B: true}); err != nil || !regexp.MustCompile(`key:\s+e2b_[0-9a-f]{40}`).MatchString(out.String()) {
		t.Fatalf("--e2b printed %s (%v)", out.String(), err)
	}

	out.Reset()
	if err := listKeys(ctx, st, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), id) || !strings.Contains(out.String(), "ci") || strings.Contains(out.String(), secret) {
		t.Fatalf("list printed:\n%s", out.String())
	}

	a := &auth.Authenticator{Store: st}
	if _, err := a.Check(ctx, secret); err != nil {
		t.Fatalf("the created key does not authenticate: %v", err)
	}
	out.Reset()
	if err := revokeKey(ctx, st, &out, id); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, secret); apierr.CodeOf(err) != apierr.AuthenticationFailed {
		t.Fatalf("revoked key: %v", err)
	}
	if err := revokeKey(ctx, st, &out, "key_nope"); err == nil {
		t.Fatal("revoking an unknown key succeeded")
	}
	out.Reset()
	listKeys(ctx, st, &out)
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == id && f[len(f)-1] == "-" {
			t.Fatalf("list after revoke shows no revocation:\n%s", out.String())
		}
	}
}
