// Package postgres is the store.Store on PostgreSQL, for a server whose
// records live in a database several hosts can reach (sqlite/ is the one
// for a single host). It uses github.com/jackc/pgx/v5 and its pool
// (pgxpool; the DSN's pool_max_conns bounds it).
//
// It keeps SQLite's semantics, which storetest checks for both:
//   - Migrations are the embedded migrations/NNNN_name.sql files, numbered
//     and meaning as sqlite/migrations' (TestMigrationsInLockstep), each
//     applied in its own transaction and recorded in schema_migrations, all
//     under a session advisory lock, so that servers starting together do
//     not race.
//   - Times are timestamptz: written in UTC truncated to the microsecond
//     (what PostgreSQL keeps), read back in UTC.
//   - JSON is kept as text, verbatim (jsonb would reformat it).
//   - Event and webhook delivery ids grow in commit order: their inserts
//     hold a transaction advisory lock while they draw ids and commit
//     (events.go).
//   - A missing row is store.ErrNotFound; a taken unique name
//     store.ErrExists; a database that cannot answer now (connection
//     failures, a lock not granted within the lock timeout, serialisation
//     failures and deadlocks, lack of resources, shutdown, I/O errors, a
//     read-only server) store.ErrUnavailable.
//
// Text orders (ties of equal times, usage grouped by template) follow the
// database's collation; SQLite's are bytewise, as in a database created
// with LOCALE 'C'.
//
// Imports: internal/store, github.com/jackc/pgx/v5 and the standard
// library.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sheepfold/sheepfold/internal/store"
)

var _ store.Store = (*Store)(nil)

//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys, in the database's own key space: "Sheepfol" in
// ASCII, and the next numbers.
const (
	migrationLock  int64 = 0x5368656570666f6c
	eventsLock     int64 = migrationLock + 1
	deliveriesLock int64 = migrationLock + 2
)

// Store is a PostgreSQL-backed store.Store.
type Store struct {
	pool               *pgxpool.Pool
	store.BoundsKeeper // SetBounds: what the writes trim to
}

// Options tune a Store. Zero fields take the defaults in brackets.
type Options struct {
	// LockTimeout is how long a statement waits for another's lock
	// before store.ErrUnavailable [5s], as SQLite's busy timeout. A
	// lock_timeout in the DSN wins.
	LockTimeout time.Duration
}

// IsURL reports whether a --database value names a PostgreSQL database
// (a postgres:// or postgresql:// URL) rather than a SQLite file.
func IsURL(database string) bool {
	return strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://")
}

// Open connects to the database at dsn (a postgres:// URL or key=value
// string, as libpq takes) and migrates it.
func Open(ctx context.Context, dsn string) (*Store, error) { return OpenOptions(ctx, dsn, Options{}) }

// OpenOptions is Open with options.
func OpenOptions(ctx context.Context, dsn string, opt Options) (*Store, error) {
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = 5 * time.Second
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message quotes the DSN, password and all: keep it out.
		return nil, errors.New("open database: the postgres DSN does not parse")
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["lock_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(opt.LockTimeout.Milliseconds(), 10)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, storeErr("open database", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, storeErr("open database", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

var _ store.Pinger = (*Store)(nil)

// Ping checks that a connection of the pool answers (a connection
// acquired, an empty statement sent): any failure is
// store.ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping the database: %w: %w", store.ErrUnavailable, err)
	}
	return nil
}

// Close closes the pool's connections.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// storeErr wraps a database error with what failed, marking those of a
// database that cannot answer now store.ErrUnavailable: the request may
// succeed later, and the server answers 503.
func storeErr(what string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", what, store.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// unavailable reports an error of the database or the way to it, as
// opposed to one of the request (a constraint, a bad value) or of its
// context.
func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"55P03", // lock_not_available: lock_timeout
			"25006": // read_only_sql_transaction: a standby
			return true
		}
		switch pe.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources: disk full, out of memory, too many connections
			"57", // operator intervention: shutdown, starting up, statement_timeout
			"58": // system error: I/O
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// notFound turns a missing row into store.ErrNotFound.
func notFound(what string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return storeErr(what, err)
}

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// args collects a query's arguments; add returns the placeholder of one.
type args []any

func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// Versions returns the migrations this binary has, in order: the schema
// version of a database it has migrated.
func Versions() []string {
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	sort.Strings(names)
	out := make([]string, len(names))
	for i, name := range names {
		out[i] = strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
	}
	return out
}

// Migrations returns the names of the applied migrations, in order.
func (s *Store) Migrations(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, storeErr("list migrations", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, storeErr("list migrations", err)
}

// migrate applies what is missing, on one connection holding the
// migration lock: another server starting meanwhile waits, then finds
// every migration applied.
func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return storeErr("migrate", err)
	}
	defer conn.Release()
	// The wait for another's migrations is not bounded by lock_timeout;
	// RESET puts back the connection's own value.
	if _, err := conn.Exec(ctx, `SET lock_timeout = 0`); err != nil {
		return storeErr("migrate", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
		return storeErr("take the migration lock", err)
	}
	defer func() {
		_, err1 := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, migrationLock)
		_, err2 := conn.Exec(context.Background(), `RESET lock_timeout`)
		if err1 != nil || err2 != nil {
			// A session lock lives as long as its connection: never let
			// the pool keep one that may still hold it.
			conn.Conn().Close(context.Background())
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version text PRIMARY KEY, applied_at timestamptz NOT NULL)`); err != nil {
		return storeErr("create schema_migrations", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		if err := apply(ctx, conn.Conn(), version, name); err != nil {
			return storeErr("migration "+version, err)
		}
	}
	return nil
}

func apply(ctx context.Context, conn *pgx.Conn, version, name string) error {
	body, err := migrations.ReadFile(name)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var done bool
	if err := tx.QueryRow(ctx, `SELECT exists (SELECT 1 FROM schema_migrations WHERE version = $1)`, version).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil
	}
	// Without arguments Exec uses the simple protocol, which runs a file
	// of several statements.
	if _, err := tx.Exec(ctx, string(body)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, version, dbTime(time.Now())); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// dbTime is a time as stored: UTC, to the microsecond.
func dbTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func dbTimePtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := dbTime(*t)
	return &u
}

// utcPtr is a nullable time as read: UTC.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
