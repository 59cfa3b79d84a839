package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// TestExclusive: an exclusive open fails while another DB has the file
// open, and keeps others out until it closes.
func TestExclusive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	a := open(t, path)
	b := open(t, path) // shared opens do not exclude each other
	if _, err := sqlite.OpenOptions(ctx, path, sqlite.Options{Exclusive: true}); !errors.Is(err, sqlite.ErrInUse) {
		t.Fatalf("exclusive open of a database open elsewhere: %v, want ErrInUse", err)
	}
	a.Close()
	b.Close()
	x, err := sqlite.OpenOptions(ctx, path, sqlite.Options{Exclusive: true})
	if err != nil {
		t.Fatalf("exclusive open of a closed database: %v", err)
	}
	if _, err := sqlite.Open(ctx, path); !errors.Is(err, sqlite.ErrInUse) {
		t.Fatalf("open of a database held exclusively: %v, want ErrInUse", err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, path).Close()
}

// TestExisting: Existing neither creates a file nor migrates one, and
// refuses a file that is not a sheepfold database.
func TestExisting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	if _, err := sqlite.OpenOptions(ctx, missing, sqlite.Options{Existing: true}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an Existing open made the file: %v", err)
	}

	other := filepath.Join(dir, "other.db")
	raw, err := sql.Open("sqlite", "file:"+other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	if _, err := sqlite.OpenOptions(ctx, other, sqlite.Options{Existing: true}); err == nil {
		t.Fatal("a file without schema_migrations opened")
	}

	old := filepath.Join(dir, "old.db")
	raw, err = sql.Open("sqlite", "file:"+old)
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
	} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	raw.Close()
	db, err := sqlite.OpenOptions(ctx, old, sqlite.Options{Existing: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if m, err := db.Migrations(ctx); err != nil || !slices.Equal(m, []string{"0001_init"}) {
		t.Fatalf("an Existing open migrated: %v, %v", m, err)
	}
}

// TestVersions: a new database is at Versions.
func TestVersions(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	m, err := db.Migrations(context.Background())
	if err != nil || len(m) == 0 || !slices.Equal(m, sqlite.Versions()) {
		t.Fatalf("migrations %v (%v), Versions %v", m, err, sqlite.Versions())
	}
}
