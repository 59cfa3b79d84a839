package postgres_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/storetest"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }

func open(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// connect is a plain connection to the database, beside the store.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestStore runs the conformance suite of store.Store, each test on a
// database of its own.
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, pgtest.New(t)) })
}

// TestAdmission: two servers' stores on one database keep caps together
// (per-account advisory locks).
func TestAdmission(t *testing.T) {
	t.Parallel()
	dsn := pgtest.New(t)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	storetest.Admission(t, a, b)
}

// TestRates: two servers' stores on one database count rate limits
// together.
func TestRates(t *testing.T) {
	t.Parallel()
	dsn := pgtest.New(t)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	storetest.Rates(t, a, b)
}

// TestMigrationsInLockstep: both stores have the same migrations, by
// number and name, so that a schema change is made in both.
func TestMigrationsInLockstep(t *testing.T) {
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	pg, lite := names("migrations"), names("../sqlite/migrations")
	if len(pg) == 0 || !slices.Equal(pg, lite) {
		t.Fatalf("postgres/migrations %v\nsqlite/migrations   %v\nwant the same files: a migration is written for both stores", pg, lite)
	}
}

// migrationFiles counts the package's migrations.
func migrationFiles(t *testing.T) int {
	t.Helper()
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v, %v", files, err)
	}
	return len(files)
}

func TestMigrationsAppliedOnce(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	s := open(t, dsn)
	m, err := s.Migrations(ctx)
	if err != nil || len(m) != migrationFiles(t) || m[0] != "0001_init" || !slices.Equal(m, postgres.Versions()) {
		t.Fatalf("migrations %v, %v", m, err)
	}
	if err := s.CreateKey(ctx, store.Key{ID: "k", Owner: "k", Hash: "h", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// A second open applies nothing again (a re-run of 0001 would fail on
	// CREATE TABLE), and the records are there.
	s = open(t, dsn)
	defer s.Close()
	if m2, err := s.Migrations(ctx); err != nil || !slices.Equal(m2, m) {
		t.Fatalf("after reopen %v, %v", m2, err)
	}
	if _, err := s.KeyByHash(ctx, "h"); err != nil {
		t.Fatalf("a key after reopen: %v", err)
	}
}

// TestConcurrentOpen: servers starting at once on a new database migrate
// it once between them (the migration lock), and all of them start.
func TestConcurrentOpen(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const n = 4
	var wg sync.WaitGroup
	stores := make([]*postgres.Store, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = postgres.Open(ctx, dsn)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("open %d: %v", i, errs[i])
		}
		defer stores[i].Close()
	}
	m, err := stores[0].Migrations(ctx)
	if err != nil || len(m) != migrationFiles(t) {
		t.Fatalf("migrations %v, %v", m, err)
	}
	var held int
	if err := connect(t, dsn).QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d advisory locks still held after Open (%v)", held, err)
	}
}

// TestUpgradeFromInit: a database with only 0001_init applied, filled,
// is migrated without losing anything: each key's owner becomes an
// account of its own, keys are user keys.
func TestUpgradeFromInit(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	raw := connect(t, dsn)
	init, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL)`,
		string(init),
		`INSERT INTO schema_migrations VALUES ('0001_init', '2026-01-01T00:00:00Z')`,
		`INSERT INTO keys (id, name, owner, hash, created_at) VALUES
			('key_a', 'alpha', 'key_a', 'h1', '2026-01-02T00:00:00Z'),
			('key_b', 'beta', 'team', 'h2', '2026-01-03T00:00:00Z'),
			('key_c', '', 'team', 'h3', '2026-01-04T00:00:00Z')`,
		`INSERT INTO sandboxes (id, owner, template, state, created_at, expires_at) VALUES
			('sb1', 'key_a', 'python', 'stopped', '2026-01-05T00:00:00Z', '2026-01-05T00:05:00Z'),
			('sb2', 'solo', 'python', 'stopped', '2026-01-06T00:00:00Z', '2026-01-06T00:05:00Z')`,
		`INSERT INTO executions (id, sandbox_id, owner, status, created_at) VALUES
			('ex1', 'sb1', 'key_a', 'success', '2026-01-05T00:01:00Z')`,
	} {
		if _, err := raw.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s := open(t, dsn)
	defer s.Close()
	accts, err := s.ListAccounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 3 || accts[0].ID != "key_a" || accts[0].Name != "key_a" || accts[1].ID != "team" || accts[2].ID != "solo" {
		t.Fatalf("accounts after the upgrade: %+v", accts)
	}
	if !accts[1].CreatedAt.Equal(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("an account's creation is its first key's: %v", accts[1].CreatedAt)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		k, err := s.KeyByHash(ctx, h)
		if err != nil || k.Role != store.RoleUser {
			t.Fatalf("key %s after the upgrade: %+v, %v", h, k, err)
		}
	}
	if ex, err := s.ListExecutions(ctx, "sb1"); err != nil || len(ex) != 1 {
		t.Fatalf("executions after the upgrade: %+v, %v", ex, err)
	}
	if sb, err := s.GetSandbox(ctx, "sb1"); err != nil || sb.Policy != nil {
		t.Fatalf("sandbox after the upgrade: %+v, %v", sb, err)
	}
}

// TestLockedIsUnavailable: a write that cannot get its lock within the
// lock timeout fails with store.ErrUnavailable, and succeeds once the
// lock is gone.
func TestLockedIsUnavailable(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	s, err := postgres.OpenOptions(ctx, dsn, postgres.Options{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other := connect(t, dsn)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE sandboxes IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: "a", Owner: "o", State: store.SandboxRunning, CreatedAt: time.Now(), ExpiresAt: time.Now()}
	start := time.Now()
	if err := s.PutSandbox(ctx, sb); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write under another's lock: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the write waited %v, past its 100ms lock timeout", d)
	}
	tx.Rollback(ctx)
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatalf("write after the lock went: %v", err)
	}
}

// TestServerGoneIsUnavailable: with the server down, pings, reads and
// writes fail with store.ErrUnavailable (the server answers 503), not an
// unclassified error.
func TestServerGoneIsUnavailable(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			srv.Stop()
		}
	}()
	s := open(t, srv.DSN("postgres"))
	defer s.Close()
	if _, err := s.ListKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a ping with the server gone: %v", err)
	}
	if _, err := s.ListKeys(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a read with the server gone: %v", err)
	}
	if err := s.CreateKey(ctx, store.Key{ID: "k", Owner: "k", Hash: "h", CreatedAt: time.Now()}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a write with the server gone: %v", err)
	}
	if _, err := postgres.Open(ctx, srv.DSN("postgres")); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("open with the server gone: %v", err)
	}
}

func TestIsURL(t *testing.T) {
	for db, want := range map[string]bool{
		"postgres://u@db.internal/sheepfold":    true,
		"postgresql:///sheepfold?host=/run/pg":  true,
		"/var/lib/sheepfold/sheepfold.db":       false,
		"sheepfold.db":                          false,
		"host=/run/pg dbname=sheepfold":         false, // key=value strings need --database postgres://
		"file:postgres://looks-like-it-but-not": false,
	} {
		if got := postgres.IsURL(db); got != want {
			t.Errorf("IsURL(%q) = %v, want %v", db, got, want)
		}
	}
}

// TestBadDSN: a DSN that does not parse is an error that does not repeat
// it (it may hold a password).
func TestBadDSN(t *testing.T) {
	_, err := postgres.Open(context.Background(), "postgres://u:s3cret@[::1/db")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("bad DSN: %v", err)
	}
}

func BenchmarkAddEvents(b *testing.B) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		evs := []store.Event{{Time: time.Now(), Type: "t", Owner: "o"}, {Time: time.Now(), Type: "t", Owner: "o"}}
		if err := s.AddEvents(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
}
