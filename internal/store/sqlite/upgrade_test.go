package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sheepfold/sheepfold/internal/store"
)

// TestUpgradeFromInit builds a database with only 0001_init applied (the
// schema before accounts), fills it, and opens it with every migration:
// each key's owner becomes an account of its own, keys are user keys, and
// nothing that was there is lost.
func TestUpgradeFromInit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	init, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`,
		string(init),
		`INSERT INTO schema_migrations VALUES ('0001_init', '2026-01-01T00:00:00.000000000Z')`,
		`INSERT INTO keys (id, name, owner, hash, created_at) VALUES
			('key_a', 'alpha', 'key_a', 'h1', '2026-01-02T00:00:00.000000000Z'),
			('key_b', 'beta', 'team', 'h2', '2026-01-03T00:00:00.000000000Z'),
			('key_c', '', 'team', 'h3', '2026-01-04T00:00:00.000000000Z')`,
		`INSERT INTO sandboxes (id, owner, template, state, created_at, expires_at) VALUES
			('sb1', 'key_a', 'python', 'stopped', '2026-01-05T00:00:00.000000000Z', '2026-01-05T00:05:00.000000000Z')`,
		`INSERT INTO executions (id, sandbox_id, owner, status, created_at) VALUES
			('ex1', 'sb1', 'key_a', 'success', '2026-01-05T00:01:00.000000000Z')`,
	} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	raw.Close()

	db := open(t, path)
	defer db.Close()
	accts, err := db.ListAccounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 2 || accts[0].ID != "key_a" || accts[0].Name != "key_a" || accts[1].ID != "team" {
		t.Fatalf("accounts after the upgrade: %+v", accts)
	}
	if !accts[1].CreatedAt.Equal(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("an account's creation is its first key's: %v", accts[1].CreatedAt)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		k, err := db.KeyByHash(ctx, h)
		if err != nil || k.Role != store.RoleUser {
			t.Fatalf("key %s after the upgrade: %+v, %v", h, k, err)
		}
		if _, err := db.Account(ctx, k.Owner); err != nil {
			t.Fatalf("key %s has no account: %v", k.ID, err)
		}
	}
	if sb, err := db.GetSandbox(ctx, "sb1"); err != nil || sb.Owner != "key_a" {
		t.Fatalf("sandbox after the upgrade: %+v, %v", sb, err)
	}
	if ex, err := db.ListExecutions(ctx, "sb1"); err != nil || len(ex) != 1 {
		t.Fatalf("executions after the upgrade: %+v, %v", ex, err)
	}
	m, _ := db.Migrations(ctx)
	if !slices.Contains(m, "0003_accounts") {
		t.Fatalf("migrations %v", m)
	}
}
