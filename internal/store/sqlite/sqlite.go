// Package sqlite is the store.Store for one host: a SQLite database
// (modernc.org/sqlite, pure Go) in WAL mode, with a busy timeout and two
// pools: one handle for writes, for which writers queue in this process
// (SQLite runs one writer at a time anyway: none sleeps in SQLite's busy
// handler while another of ours writes), and MaxOpenConns for reads
// alone, which WAL runs beside the writer and which no writer waiting
// for its turn holds up; a busy, locked, full or failing database is
// reported as store.ErrUnavailable. The WAL is cut back to 8 MiB whenever a
// checkpoint empties it (journal_size_limit). Migrations are the embedded
// migrations/NNNN_name.sql files, applied in order, each in its own
// transaction, and recorded in schema_migrations.
//
// Every DB holds a shared flock(2) on its database file while it is open
// (SQLite's own locks are fcntl(2) ones, which flock does not touch), so
// that `sheepfold database copy` (Options.Exclusive) can tell that no
// other process has the database open, and a server does not start on a
// database being copied: either is ErrInUse.
//
// Imports: internal/store, modernc.org/sqlite and the standard library.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sheepfold/sheepfold/internal/store"
)

var _ store.Store = (*DB)(nil)

//go:embed migrations/*.sql
var migrations embed.FS

// MaxOpenConns bounds the database handles a DB reads with (it writes
// with one).
const MaxOpenConns = 8

// storeErr wraps a database error with what failed. A busy or locked
// database, a full disk or failing storage is store.ErrUnavailable: the
// request may succeed later, and the server answers 503.
func storeErr(what string, err error) error {
	if err == nil {
		return nil
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOMEM:
			return fmt.Errorf("%s: %w: %w", what, store.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// timeFormat is fixed width so that stored times sort as text.
const timeFormat = "2006-01-02T15:04:05.000000000Z"

// ErrInUse reports a database file another process holds: one being
// copied (Options.Exclusive), or, for an exclusive open, one that another
// process has open.
var ErrInUse = errors.New("the database is in use by another sheepfold process")

// DB is a SQLite-backed store.Store.
type DB struct {
	db                 *sql.DB  // every write, and what reads inside a write
	rd                 *sql.DB  // reads alone (query_only), so that writers waiting for the lock never hold up a read
	lock               *os.File // the database file, flocked while the DB is open
	turns              *turns   // the busiest writes' turns, round the accounts (turns.go)
	store.BoundsKeeper          // SetBounds: what the writes trim to
}

// Options tune a DB. Zero fields take the defaults in brackets.
type Options struct {
	// BusyTimeout is how long a writer waits for another's lock before
	// store.ErrUnavailable [5s].
	BusyTimeout time.Duration
	// Exclusive opens the database only when no other process has it
	// open (ErrInUse otherwise), and keeps others from opening it until
	// Close [false].
	Exclusive bool
	// Existing opens the database as it is: a missing file is an error
	// rather than a new database, and no migration is applied
	// (Migrations tells its version) [false].
	Existing bool
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

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*DB, error) { return OpenOptions(ctx, path, Options{}) }

// OpenOptions is Open with options.
func OpenOptions(ctx context.Context, path string, opt Options) (*DB, error) {
	if opt.BusyTimeout <= 0 {
		opt.BusyTimeout = 5 * time.Second
	}
	// Only root may read the database (keys, tenants' metadata): the file
	// is made 0600 before SQLite opens it, and SQLite gives its -wal and
	// -shm files the database file's mode.
	flags := os.O_CREATE | os.O_RDWR
	if opt.Existing {
		flags = os.O_RDWR
	}
	lock, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if err := lockFile(lock, opt.Exclusive); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	// From here the lock's file stays open until Close, after SQLite's
	// handles: closing any descriptor of the file would drop the fcntl
	// locks SQLite holds in this process.
	ok := false
	defer func() {
		if !ok {
			lock.Close()
		}
	}()
	if !opt.Existing {
		if err := lock.Chmod(0o600); err != nil {
			return nil, fmt.Errorf("open database %s: %w", path, err)
		}
	}
	dsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_pragma=journal_size_limit(8388608)&_txlock=immediate",
		path, opt.BusyTimeout.Milliseconds())
	// Both handles keep their statements prepared (stmtcache.go).
	db := sql.OpenDB(cachingConnector{dsn: dsn, drv: sqliteDriver()})
	// One handle for writes: SQLite runs one writer at a time, and its
	// busy handler would have the others sleep in growing steps (up to
	// 100 ms) while one writes; queued here they go as soon as it is
	// done. A writer waits for the handle until its context ends, and
	// for another process's lock up to busy_timeout, then gets
	// store.ErrUnavailable. Every write transaction uses only its own
	// tx: one that used the pool as well would wait for itself.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	// Reads have a pool of their own, which WAL runs beside the writer:
	// sharing the writes' pool, a burst of writes (one tenant's flood)
	// waiting for their turn would hold up every tenant's reads.
	rd := sql.OpenDB(cachingConnector{drv: sqliteDriver(), dsn: fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=query_only(1)&_txlock=deferred",
		path, opt.BusyTimeout.Milliseconds())})
	rd.SetMaxOpenConns(MaxOpenConns)
	rd.SetMaxIdleConns(MaxOpenConns)
	rd.SetConnMaxIdleTime(time.Minute)
	d := &DB{db: db, rd: rd, lock: lock, turns: newTurns()}
	if opt.Existing {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&n)
		if err == nil && n == 0 {
			err = errors.New("not a sheepfold database (it has no schema_migrations table)")
		}
		if err != nil {
			d.closeDBs()
			return nil, fmt.Errorf("open database %s: %w", path, err)
		}
	} else if err := d.migrate(ctx); err != nil {
		d.closeDBs()
		return nil, err
	}
	ok = true
	return d, nil
}

// lockFile takes a shared or exclusive flock on f without waiting;
// ErrInUse when another process's lock is in the way.
func lockFile(f *os.File, exclusive bool) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return ErrInUse
		default:
			return fmt.Errorf("lock: %w", err)
		}
	}
}

var _ store.Pinger = (*DB)(nil)

// Ping reads the database file's schema (a page read through the pool,
// as every request's first read is): any failure is
// store.ErrUnavailable.
func (d *DB) Ping(ctx context.Context) error {
	var n int
	if err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n); err != nil {
		return fmt.Errorf("ping the database: %w: %w", store.ErrUnavailable, err)
	}
	return nil
}

// Close closes the database, then releases its lock.
func (d *DB) Close() error {
	err := d.closeDBs()
	return errors.Join(err, d.lock.Close())
}

// closeDBs closes both pools.
func (d *DB) closeDBs() error { return errors.Join(d.rd.Close(), d.db.Close()) }

// ReadTx runs fn in one transaction of the database, for a consistent
// view of every table (`sheepfold database copy` reads them raw), and
// rolls it back: fn is not meant to write.
func (d *DB) ReadTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("begin", err)
	}
	defer tx.Rollback()
	return fn(tx)
}

// Migrations returns the names of the applied migrations, in order.
func (d *DB) Migrations(ctx context.Context) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (d *DB) migrate(ctx context.Context) error {
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		if err := d.apply(ctx, version, name); err != nil {
			return fmt.Errorf("migration %s: %w", version, err)
		}
	}
	return nil
}

func (d *DB) apply(ctx context.Context, version, name string) error {
	body, err := migrations.ReadFile(name)
	if err != nil {
		return err
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, string(body)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
		version, fmtTime(time.Now())); err != nil {
		return err
	}
	return tx.Commit()
}

func fmtTime(t time.Time) string { return t.UTC().Format(timeFormat) }

func fmtTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return fmtTime(*t)
}

func parseTime(s string) (time.Time, error) { return time.Parse(time.RFC3339Nano, s) }

func parseTimePtr(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := parseTime(s.String)
	return &t, err
}

func jsonText(m json.RawMessage) string {
	if len(m) == 0 {
		return "{}"
	}
	return string(m)
}

// CreateKey implements store.Store.
func (d *DB) CreateKey(ctx context.Context, k store.Key) error {
	return createKey(ctx, d.db, k)
}

func createKey(ctx context.Context, db execer, k store.Key) error {
	if k.Role == "" {
		k.Role = store.RoleUser
	}
	_, err := db.ExecContext(ctx, `INSERT INTO keys (id, name, owner, role, hash, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, k.Owner, k.Role, k.Hash, fmtTime(k.CreatedAt), fmtTimePtr(k.RevokedAt))
	if err != nil {
		return storeErr("create key", err)
	}
	return nil
}

const keyCols = `id, name, owner, role, hash, created_at, revoked_at`

func scanKey(sc interface{ Scan(...any) error }) (store.Key, error) {
	var k store.Key
	var created string
	var revoked sql.NullString
	if err := sc.Scan(&k.ID, &k.Name, &k.Owner, &k.Role, &k.Hash, &created, &revoked); err != nil {
		return k, err
	}
	var err error
	if k.CreatedAt, err = parseTime(created); err != nil {
		return k, err
	}
	k.RevokedAt, err = parseTimePtr(revoked)
	return k, err
}

// KeyByHash implements store.Store.
func (d *DB) KeyByHash(ctx context.Context, hash string) (store.Key, error) {
	k, err := scanKey(d.rd.QueryRowContext(ctx, `SELECT `+keyCols+` FROM keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return k, store.ErrNotFound
	}
	return k, storeErr("look up key", err)
}

// KeyByID implements store.Store.
func (d *DB) KeyByID(ctx context.Context, id string) (store.Key, error) {
	k, err := scanKey(d.rd.QueryRowContext(ctx, `SELECT `+keyCols+` FROM keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return k, store.ErrNotFound
	}
	return k, storeErr("look up key", err)
}

// ListKeys implements store.Store.
func (d *DB) ListKeys(ctx context.Context) ([]store.Key, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT `+keyCols+` FROM keys ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey implements store.Store.
func (d *DB) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := d.db.ExecContext(ctx, `UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, fmtTime(at), id)
	if err != nil {
		return storeErr("revoke key", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// CountActiveKeys implements store.Store.
func (d *DB) CountActiveKeys(ctx context.Context) (int, error) {
	var n int
	err := d.rd.QueryRowContext(ctx, `SELECT count(*) FROM keys WHERE revoked_at IS NULL`).Scan(&n)
	return n, storeErr("count keys", err)
}

// PutSandbox implements store.Store: it inserts or replaces the record,
// and deletes the owner's stopped sandboxes past its bound.
func (d *DB) PutSandbox(ctx context.Context, s store.Sandbox) error {
	give, err := d.turns.take(ctx, s.Owner)
	if err != nil {
		return storeErr("put sandbox", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("put sandbox", err)
	}
	defer tx.Rollback()
	if err := d.putSandbox(ctx, tx, s); err != nil {
		return err
	}
	return storeErr("put sandbox", tx.Commit())
}

// putSandbox writes a sandbox's record, in place when it exists (an
// upsert, so that the counting triggers see an update rather than a
// delete they would miss), and trims the owner's sandboxes.
func (d *DB) putSandbox(ctx context.Context, tx *sql.Tx, s store.Sandbox) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO sandboxes
		(id, owner, template, state, created_at, expires_at, stopped_at, stop_reason, metadata, resources, policy)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, template = excluded.template, state = excluded.state,
			created_at = excluded.created_at, expires_at = excluded.expires_at, stopped_at = excluded.stopped_at,
			stop_reason = excluded.stop_reason, metadata = excluded.metadata, resources = excluded.resources,
			policy = excluded.policy`,
		s.ID, s.Owner, s.Template, s.State, fmtTime(s.CreatedAt), fmtTime(s.ExpiresAt), fmtTimePtr(s.StoppedAt),
		s.StopReason, jsonText(s.Metadata), jsonText(s.Resources), policyText(s.Policy))
	if err != nil {
		return storeErr("put sandbox", err)
	}
	_, err = d.trim(ctx, tx, s.Owner, store.KindSandboxes)
	return trimErr(store.KindSandboxes, s.Owner, err)
}

const sandboxCols = `id, owner, template, state, created_at, expires_at, stopped_at, stop_reason, metadata, resources, policy`

func policyText(p json.RawMessage) string {
	if len(p) == 0 {
		return "null"
	}
	return string(p)
}

func scanSandbox(sc interface{ Scan(...any) error }) (store.Sandbox, error) {
	var s store.Sandbox
	var created, expires, meta, res, pol string
	var stopped sql.NullString
	if err := sc.Scan(&s.ID, &s.Owner, &s.Template, &s.State, &created, &expires, &stopped, &s.StopReason, &meta, &res, &pol); err != nil {
		return s, err
	}
	var err error
	if s.CreatedAt, err = parseTime(created); err != nil {
		return s, err
	}
	if s.ExpiresAt, err = parseTime(expires); err != nil {
		return s, err
	}
	if s.StoppedAt, err = parseTimePtr(stopped); err != nil {
		return s, err
	}
	s.Metadata, s.Resources = json.RawMessage(meta), json.RawMessage(res)
	if pol != "null" {
		s.Policy = json.RawMessage(pol)
	}
	return s, nil
}

// GetSandbox implements store.Store.
func (d *DB) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	s, err := scanSandbox(d.rd.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return s, store.ErrNotFound
	}
	return s, storeErr("get sandbox", err)
}

// ListSandboxes implements store.Store, oldest first.
func (d *DB) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE owner = ?`
	args := []any{f.Owner}
	if f.AnyOwner {
		q, args = `SELECT `+sandboxCols+` FROM sandboxes WHERE true`, nil
	}
	switch {
	case f.Live:
		q += ` AND state IN (?, ?)`
		args = append(args, store.SandboxRunning, store.SandboxPaused)
	case f.State != "":
		q += ` AND state = ?`
		args = append(args, f.State)
	}
	if f.After != "" {
		// A cursor of a deleted record (pruned meanwhile) starts over at
		// nothing rather than at the beginning: the row value compares
		// with NULL and selects no row.
		q += ` AND (created_at, id) > (SELECT created_at, id FROM sandboxes WHERE id = ?)`
		args = append(args, f.After)
	}
	q += ` ORDER BY created_at, id`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list sandboxes", err)
	}
	defer rows.Close()
	out := []store.Sandbox{}
	for rows.Next() {
		s, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// UpdateSandboxExpiry implements store.Store.
func (d *DB) UpdateSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error {
	res, err := d.db.ExecContext(ctx, `UPDATE sandboxes SET expires_at = ? WHERE id = ?`, fmtTime(expiresAt), id)
	if err != nil {
		return storeErr("update sandbox", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// UpdateSandboxPolicy implements store.Store.
func (d *DB) UpdateSandboxPolicy(ctx context.Context, id string, policy json.RawMessage) error {
	res, err := d.db.ExecContext(ctx, `UPDATE sandboxes SET policy = ? WHERE id = ?`, policyText(policy), id)
	if err != nil {
		return fmt.Errorf("update sandbox policy: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// SetSandboxPaused implements store.Store.
func (d *DB) SetSandboxPaused(ctx context.Context, id string, paused bool, expiresAt time.Time) error {
	state := store.SandboxRunning
	if paused {
		state = store.SandboxPaused
	}
	res, err := d.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?, expires_at = ? WHERE id = ? AND state != ?`,
		state, fmtTime(expiresAt), id, store.SandboxStopped)
	if err != nil {
		return storeErr("update sandbox", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := d.GetSandbox(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// StopSandbox implements store.Store.
func (d *DB) StopSandbox(ctx context.Context, id, reason string, at time.Time) error {
	_, err := d.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?, stopped_at = ?, stop_reason = ?
		WHERE id = ? AND state != ?`, store.SandboxStopped, fmtTime(at), reason, id, store.SandboxStopped)
	if err != nil {
		return storeErr("stop sandbox", err)
	}
	return nil
}

// StopAllRunning implements store.Store.
func (d *DB) StopAllRunning(ctx context.Context, reason string, at time.Time) (int, error) {
	// The fixed-width time format compares as text.
	res, err := d.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?1,
		stopped_at = CASE WHEN expires_at <= ?2 THEN expires_at ELSE ?2 END,
		stop_reason = CASE WHEN expires_at <= ?2 THEN ?3 ELSE ?4 END
		WHERE state = ?5`,
		store.SandboxStopped, fmtTime(at), store.ReasonTimedOut, reason, store.SandboxRunning)
	if err != nil {
		return 0, storeErr("stop sandboxes", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// DeleteStoppedBefore implements store.Store, in one transaction.
func (d *DB) DeleteStoppedBefore(ctx context.Context, t time.Time) (sandboxes, executions int, err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, storeErr("prune records", err)
	}
	defer tx.Rollback()
	at := fmtTime(t)
	res, err := tx.ExecContext(ctx, `DELETE FROM executions WHERE created_at < ?
		OR sandbox_id IN (SELECT id FROM sandboxes WHERE state = ? AND stopped_at < ?)`, at, store.SandboxStopped, at)
	if err != nil {
		return 0, 0, storeErr("prune executions", err)
	}
	ne, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `DELETE FROM sessions
		WHERE id IN (SELECT id FROM sandboxes WHERE state = ? AND stopped_at < ?)`, store.SandboxStopped, at); err != nil {
		return 0, 0, storeErr("prune sessions", err)
	}
	res, err = tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE state = ? AND stopped_at < ?`, store.SandboxStopped, at)
	if err != nil {
		return 0, 0, storeErr("prune sandboxes", err)
	}
	ns, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `DELETE FROM meter_leases WHERE lease_until < ?`, at); err != nil {
		return 0, 0, storeErr("prune meter leases", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, storeErr("prune records", err)
	}
	return int(ns), int(ne), nil
}

// AddExecution implements store.Store, in one transaction. An execution
// recorded with its output clears the output of the sandbox's executions
// past the newest store.KeptOutputs, so that a sandbox's history stays
// bounded; the owner's oldest executions past its bound go.
func (d *DB) AddExecution(ctx context.Context, e store.Execution) error {
	give, err := d.turns.take(ctx, e.Owner)
	if err != nil {
		return storeErr("add execution", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("add execution", err)
	}
	defer tx.Rollback()
	// An upsert, not INSERT OR REPLACE: the counting triggers see the
	// update (a replace's delete fires no trigger).
	_, err = tx.ExecContext(ctx, `INSERT INTO executions
		(id, sandbox_id, owner, language, status, error_code, error, execution_time_ms, cpu_time_ms, peak_memory_bytes,
		created_at, code, output, replica)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET sandbox_id = excluded.sandbox_id, owner = excluded.owner, language = excluded.language,
			status = excluded.status, error_code = excluded.error_code, error = excluded.error,
			execution_time_ms = excluded.execution_time_ms, cpu_time_ms = excluded.cpu_time_ms,
			peak_memory_bytes = excluded.peak_memory_bytes, created_at = excluded.created_at, code = excluded.code,
			output = excluded.output, replica = excluded.replica`,
		e.ID, e.SandboxID, e.Owner, e.Language, e.Status, e.ErrorCode, e.Error, e.ExecutionTimeMS, e.CPUTimeMS,
		e.PeakMemoryBytes, fmtTime(e.CreatedAt), e.Code, string(e.Output), e.Replica)
	if err != nil {
		return storeErr("add execution", err)
	}
	if len(e.Output) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE executions SET output = '' WHERE sandbox_id = ? AND output != ''
			AND id NOT IN (SELECT id FROM executions WHERE sandbox_id = ? ORDER BY created_at DESC, id DESC LIMIT ?)`,
			e.SandboxID, e.SandboxID, store.KeptOutputs); err != nil {
			return storeErr("trim execution outputs", err)
		}
	}
	if _, err := d.trim(ctx, tx, e.Owner, store.KindExecutions); err != nil {
		return trimErr(store.KindExecutions, e.Owner, err)
	}
	return storeErr("add execution", tx.Commit())
}

// EndRunningExecutions implements store.Store.
func (d *DB) EndRunningExecutions(ctx context.Context, code, message string) (int, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE executions SET status = ?, error_code = ?, error = ? WHERE status = ?`,
		store.ExecutionError, code, message, store.ExecutionRunning)
	if err != nil {
		return 0, storeErr("end running executions", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// ListExecutions implements store.Store, oldest first.
func (d *DB) ListExecutions(ctx context.Context, sandboxID string) ([]store.Execution, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT `+executionColumns+` FROM executions
		WHERE sandbox_id = ? ORDER BY created_at, id`, sandboxID)
	if err != nil {
		return nil, storeErr("list executions", err)
	}
	return scanExecutions(rows)
}

// PageExecutions implements store.Store: newest first, before the
// cursor's (created_at, id).
func (d *DB) PageExecutions(ctx context.Context, f store.ExecutionFilter) ([]store.Execution, error) {
	q := `SELECT ` + executionColumns + ` FROM executions WHERE sandbox_id = ?`
	args := []any{f.SandboxID}
	if f.Before != "" {
		q += ` AND (created_at, id) < (SELECT created_at, id FROM executions WHERE id = ? AND sandbox_id = ?)`
		args = append(args, f.Before, f.SandboxID)
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr("page executions", err)
	}
	return scanExecutions(rows)
}

const executionColumns = `id, sandbox_id, owner, language, status, error_code, error,
		execution_time_ms, cpu_time_ms, peak_memory_bytes, created_at, code, output`

func scanExecutions(rows *sql.Rows) ([]store.Execution, error) {
	defer rows.Close()
	out := []store.Execution{}
	for rows.Next() {
		var e store.Execution
		var created, output string
		if err := rows.Scan(&e.ID, &e.SandboxID, &e.Owner, &e.Language, &e.Status, &e.ErrorCode, &e.Error,
			&e.ExecutionTimeMS, &e.CPUTimeMS, &e.PeakMemoryBytes, &created, &e.Code, &output); err != nil {
			return nil, err
		}
		var err error
		if e.CreatedAt, err = parseTime(created); err != nil {
			return nil, err
		}
		if output != "" {
			e.Output = json.RawMessage(output)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
