package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/store/storetest"
)

func open(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestStore runs the conformance suite of store.Store, each test on a
// database file of its own.
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, filepath.Join(t.TempDir(), "s.db"))
	})
}

func TestMigrationsAppliedOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	db := open(t, path)
	m, err := db.Migrations(context.Background())
	if err != nil || len(m) == 0 || m[0] != "0001_init" {
		t.Fatalf("migrations %v, %v", m, err)
	}
	if err := db.CreateKey(context.Background(), store.Key{ID: "k", Owner: "k", Hash: "h", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A second open applies nothing again (a re-run of 0001 would fail on
	// CREATE TABLE), and the records are there.
	db = open(t, path)
	defer db.Close()
	m2, err := db.Migrations(context.Background())
	if err != nil || len(m2) != len(m) {
		t.Fatalf("after reopen %v, %v", m2, err)
	}
	if _, err := db.KeyByHash(context.Background(), "h"); err != nil {
		t.Fatalf("a key after reopen: %v", err)
	}
}

func BenchmarkAddExecution(b *testing.B) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for i := range b.N {
		e := store.Execution{ID: fmt.Sprint("e", i), SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: time.Now()}
		if err := db.AddExecution(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDatabasePrivate: the database and its WAL files are the owner's
// alone, also when the file existed with a wider mode.
func TestDatabasePrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	db := open(t, path)
	defer db.Close()
	if err := db.CreateKey(context.Background(), store.Key{ID: "k", Name: "n", Hash: "h", Owner: "o", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}

// TestPing: a database that answers pings well; a closed one fails with
// store.ErrUnavailable (the server's /readyz then says not ready).
func TestPing(t *testing.T) {
	t.Parallel()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	if err := db.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := db.Ping(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a closed database's ping: %v", err)
	}
}
