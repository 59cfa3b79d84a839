// Package transfer copies a one-host server's records from its SQLite
// database (store/sqlite) into an empty PostgreSQL one (store/postgres):
// `sheepfold database copy`, the move from one machine to replicas.
//
// The copy is generic over the two schemas, which the migrations keep the
// same (postgres' TestMigrationsInLockstep): every table of the target,
// but schema_migrations and stored (each account's stored amounts, which
// the target's triggers count again as the rows arrive), is copied column
// by column, each value converted
// to the target column's type (convert). Both databases must be at this
// binary's schema version and have the same tables and columns, or
// nothing is copied; so a table a new migration adds is copied without
// a change here, and a column type this package cannot convert is refused
// before anything is written.
//
// The source is opened exclusively (sqlite.Options.Exclusive): no other
// sheepfold process may have it open, and none can open it while it is
// copied. It is read in one transaction. The target is migrated first,
// then written in one transaction that locks every table, finds them all
// empty, copies the rows with COPY (ids as they were) and sets each
// identity sequence past both the copied ids and the ids SQLite handed
// out before (sqlite_sequence), so that ids that only grow (events, the
// SSE cursor) keep growing. Any error rolls everything back.
//
// # The copy
//
// A SQLite DB holds a shared flock(2) on its file while open (SQLite's own
// locks are fcntl ones, which flock leaves alone). `sheepfold database copy`
// (internal/store/transfer) moves a one-host server's records to
// PostgreSQL: it opens the SQLite file exclusively (`sqlite.ErrInUse` while
// any other sheepfold process has it open; none can open it meanwhile),
// without migrating it, and refuses unless both databases are at this
// binary's migrations with the same tables and columns. The copy is driven
// by the target's catalog: every table but schema_migrations, parents
// before children (foreign keys), each column converted by its PostgreSQL
// type (RFC 3339 text to timestamptz, 0/1 to boolean, the JSON array of
// webhook types to text[], code text to bytea; text PostgreSQL cannot hold,
// NUL or invalid UTF-8, is refused), rows written with COPY (ids as they
// were), and each identity sequence set past both the copied ids and
// sqlite_sequence (ids retention deleted are not handed out again). All of
// it is one target transaction that first locks every table and finds them
// empty (`transfer.ErrNotEmpty`). A migration's new table is copied with no
// change there; its test fails until its test data fills the table.
//
// Imports: internal/store/sqlite, internal/store/postgres,
// github.com/jackc/pgx/v5 and the standard library.
package transfer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// ErrNotEmpty reports a target database that already holds records.
var ErrNotEmpty = errors.New("the target database is not empty")

// ErrSchema reports a database whose schema version or tables differ
// from this binary's.
var ErrSchema = errors.New("schema differs from this binary's")

// LockTimeout bounds the wait for the target's table locks: a server
// using the target holds them only for its statements.
const LockTimeout = 5 * time.Second

// Table is what was copied of one table.
type Table struct {
	Name string
	Rows int64
}

// Copy copies every record of the SQLite database at srcPath into the
// PostgreSQL database at dstDSN (a postgres:// URL), migrating it first,
// and returns the tables copied in the order copied. Nothing is written
// unless everything is.
func Copy(ctx context.Context, srcPath, dstDSN string) ([]Table, error) {
	src, err := sqlite.OpenOptions(ctx, srcPath, sqlite.Options{Exclusive: true, Existing: true})
	if errors.Is(err, sqlite.ErrInUse) {
		return nil, fmt.Errorf("source %s: %w: stop the server (and every sheepfold command using it) first", srcPath, sqlite.ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	defer src.Close()
	applied, err := src.Migrations(ctx)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", srcPath, err)
	}
	if err := sameVersion("source "+srcPath, applied, sqlite.Versions()); err != nil {
		return nil, err
	}
	if err := migrateTarget(ctx, dstDSN); err != nil {
		return nil, err
	}

	conn, err := pgx.Connect(ctx, dstDSN)
	if err != nil {
		return nil, fmt.Errorf("target: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var copied []Table
	err = src.ReadTx(ctx, func(stx *sql.Tx) error {
		dtx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("target: begin: %w", err)
		}
		defer dtx.Rollback(context.Background())
		if copied, err = copyAll(ctx, stx, dtx); err != nil {
			return err
		}
		if err := dtx.Commit(ctx); err != nil {
			return fmt.Errorf("target: commit: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return copied, nil
}

// sameVersion checks a database's applied migrations against this
// binary's, saying what to do when they differ.
func sameVersion(which string, applied, known []string) error {
	if slices.Equal(applied, known) {
		return nil
	}
	last := func(v []string) string {
		if len(v) == 0 {
			return "none"
		}
		return v[len(v)-1]
	}
	hint := "copy with the sheepfold version that made it"
	if len(applied) < len(known) && slices.Equal(applied, known[:len(applied)]) {
		hint = "open it once with this version to migrate it (e.g. `sheepfold keys list --database PATH`)"
	}
	return fmt.Errorf("%s: %w: its last migration is %s, this binary's %s: %s", which, ErrSchema, last(applied), last(known), hint)
}

// migrateTarget brings the target to this binary's schema (postgres.Open
// migrates) and checks that it is there.
func migrateTarget(ctx context.Context, dsn string) error {
	dst, err := postgres.Open(ctx, dsn)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer dst.Close()
	applied, err := dst.Migrations(ctx)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if !slices.Equal(postgres.Versions(), sqlite.Versions()) {
		return fmt.Errorf("%w: this binary's SQLite and PostgreSQL migrations differ", ErrSchema)
	}
	return sameVersion("target", applied, postgres.Versions())
}

// column is one column of a target table.
type column struct {
	name     string
	typ      string // format_type: "text", "timestamp with time zone"...
	sequence string // its sequence (identity or serial), "" for none
	convert  converter
}

// table is a target table, its columns in order.
type table struct {
	name    string
	columns []column
	refs    []string // the tables its foreign keys reference
}

// copyAll copies every table, in the target transaction dtx.
func copyAll(ctx context.Context, stx *sql.Tx, dtx pgx.Tx) ([]Table, error) {
	tables, err := targetTables(ctx, dtx)
	if err != nil {
		return nil, err
	}
	if err := sameTables(ctx, stx, tables); err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(tables))
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = pgx.Identifier{n}.Sanitize()
	}
	if _, err := dtx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, LockTimeout.Milliseconds())); err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	if _, err := dtx.Exec(ctx, `LOCK TABLE `+strings.Join(quoted, ", ")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return nil, fmt.Errorf("target: lock its tables (is a server using it?): %w", err)
	}
	for i, n := range names {
		var has bool
		if err := dtx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+quoted[i]+`)`).Scan(&has); err != nil {
			return nil, fmt.Errorf("target: %w", err)
		}
		if has {
			return nil, fmt.Errorf("%w (table %s has rows): copy into a new, empty database", ErrNotEmpty, n)
		}
	}
	seqs, err := sqliteSequences(ctx, stx)
	if err != nil {
		return nil, err
	}
	var out []Table
	for _, t := range copyOrder(tables) {
		n, err := copyTable(ctx, stx, dtx, t)
		if err != nil {
			return nil, err
		}
		if err := advanceSequences(ctx, dtx, t, seqs[t.name]); err != nil {
			return nil, err
		}
		out = append(out, Table{Name: t.name, Rows: n})
	}
	return out, nil
}

// targetTables reads the target's tables (but schema_migrations), their
// columns with a converter each, and their foreign keys.
func targetTables(ctx context.Context, dtx pgx.Tx) (map[string]*table, error) {
	rows, err := dtx.Query(ctx, `SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
			coalesce(pg_get_serial_sequence(quote_ident(c.relname), a.attname), '')
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
		WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND c.relkind IN ('r', 'p')
			AND c.relname <> 'schema_migrations' AND c.relname <> 'stored' AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY c.relname, a.attnum`)
	if err != nil {
		return nil, fmt.Errorf("target: read its schema: %w", err)
	}
	tables := map[string]*table{}
	var tname string
	var col column
	_, err = pgx.ForEachRow(rows, []any{&tname, &col.name, &col.typ, &col.sequence}, func() error {
		conv, ok := converters[col.typ]
		if !ok {
			return fmt.Errorf("target: column %s.%s is %s, which this binary cannot copy", tname, col.name, col.typ)
		}
		col.convert = conv
		t := tables[tname]
		if t == nil {
			t = &table{name: tname}
			tables[tname] = t
		}
		t.columns = append(t.columns, col)
		return nil
	})
	if err != nil {
		return nil, err
	}
	rows, err = dtx.Query(ctx, `SELECT c.relname, r.relname FROM pg_constraint k
		JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class r ON r.oid = k.confrelid
		WHERE k.contype = 'f' AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`)
	if err != nil {
		return nil, fmt.Errorf("target: read its foreign keys: %w", err)
	}
	var from, to string
	_, err = pgx.ForEachRow(rows, []any{&from, &to}, func() error {
		if t := tables[from]; t != nil && from != to {
			t.refs = append(t.refs, to)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("target: read its foreign keys: %w", err)
	}
	return tables, nil
}

// sameTables checks that the source has the target's tables and columns,
// no more and no fewer.
func sameTables(ctx context.Context, stx *sql.Tx, tables map[string]*table) error {
	names, err := queryStrings(ctx, stx, `SELECT name FROM sqlite_master
		WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' AND name <> 'schema_migrations' AND name <> 'stored'
		ORDER BY name`)
	if err != nil {
		return fmt.Errorf("source: read its schema: %w", err)
	}
	if want := slices.Sorted(maps.Keys(tables)); !slices.Equal(names, want) {
		return fmt.Errorf("%w: the source's tables %v, the target's %v", ErrSchema, names, want)
	}
	for _, name := range names {
		cols, err := queryStrings(ctx, stx, `SELECT name FROM pragma_table_info(?) ORDER BY name`, name)
		if err != nil {
			return fmt.Errorf("source: read its schema: %w", err)
		}
		var want []string
		for _, c := range tables[name].columns {
			want = append(want, c.name)
		}
		slices.Sort(want)
		if !slices.Equal(cols, want) {
			return fmt.Errorf("%w: the source's table %s has columns %v, the target's %v", ErrSchema, name, cols, want)
		}
	}
	return nil
}

func queryStrings(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// copyOrder orders tables so that each comes after those its foreign
// keys reference (by name among equals).
func copyOrder(tables map[string]*table) []*table {
	var out []*table
	done := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		t := tables[name]
		if t == nil || done[name] {
			return
		}
		done[name] = true // a cycle (none in the schema) is cut here
		for _, r := range slices.Sorted(slices.Values(t.refs)) {
			visit(r)
		}
		out = append(out, t)
	}
	for _, name := range slices.Sorted(maps.Keys(tables)) {
		visit(name)
	}
	return out
}

// sqliteSequences reads the highest id SQLite handed out per
// AUTOINCREMENT table: rows deleted since (event retention) took theirs
// with them, but those ids must not come again.
func sqliteSequences(ctx context.Context, stx *sql.Tx) (map[string]int64, error) {
	out := map[string]int64{}
	var n int
	if err := stx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'`).Scan(&n); err != nil || n == 0 {
		return out, err
	}
	rows, err := stx.QueryContext(ctx, `SELECT name, seq FROM sqlite_sequence`)
	if err != nil {
		return nil, fmt.Errorf("source: read sqlite_sequence: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var seq int64
		if err := rows.Scan(&name, &seq); err != nil {
			return nil, fmt.Errorf("source: read sqlite_sequence: %w", err)
		}
		out[name] = seq
	}
	return out, rows.Err()
}

// copyTable copies one table's rows with COPY, which writes identity
// columns as given (as OVERRIDING SYSTEM VALUE would).
func copyTable(ctx context.Context, stx *sql.Tx, dtx pgx.Tx, t *table) (int64, error) {
	names := make([]string, len(t.columns))
	quoted := make([]string, len(t.columns))
	for i, c := range t.columns {
		names[i] = c.name
		quoted[i] = `"` + strings.ReplaceAll(c.name, `"`, `""`) + `"`
	}
	rows, err := stx.QueryContext(ctx, `SELECT `+strings.Join(quoted, ", ")+` FROM "`+strings.ReplaceAll(t.name, `"`, `""`)+`" ORDER BY rowid`)
	if err != nil {
		return 0, fmt.Errorf("source: read %s: %w", t.name, err)
	}
	defer rows.Close()
	rs := &rowSource{t: t, rows: rows, raw: make([]any, len(t.columns)), vals: make([]any, len(t.columns))}
	n, err := dtx.CopyFrom(ctx, pgx.Identifier{t.name}, names, rs)
	if rs.err != nil {
		return 0, rs.err
	}
	if err != nil {
		return 0, fmt.Errorf("target: copy %s: %w", t.name, err)
	}
	if n != rs.n {
		return 0, fmt.Errorf("target: copy %s: %d rows written of %d read", t.name, n, rs.n)
	}
	return n, nil
}

// rowSource feeds COPY from the source's rows, converted.
type rowSource struct {
	t    *table
	rows *sql.Rows
	raw  []any
	vals []any
	n    int64 // rows read
	err  error // the source's or a conversion's
}

func (r *rowSource) Next() bool {
	if r.err != nil || !r.rows.Next() {
		if r.err == nil && r.rows.Err() != nil {
			r.err = fmt.Errorf("source: read %s: %w", r.t.name, r.rows.Err())
		}
		return false
	}
	r.n++
	ptrs := make([]any, len(r.raw))
	for i := range r.raw {
		ptrs[i] = &r.raw[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		r.err = fmt.Errorf("source: read %s: %w", r.t.name, err)
		return false
	}
	for i, c := range r.t.columns {
		v, err := c.convert(r.raw[i])
		if err != nil {
			r.err = fmt.Errorf("source: %s row %d, column %s (%s): %w", r.t.name, r.n, c.name, c.typ, err)
			return false
		}
		r.vals[i] = v
	}
	return true
}

func (r *rowSource) Values() ([]any, error) { return r.vals, r.err }

func (r *rowSource) Err() error { return r.err }

// advanceSequences sets each sequence of t past the ids copied and those
// SQLite handed out (handed).
func advanceSequences(ctx context.Context, dtx pgx.Tx, t *table, handed int64) error {
	for _, c := range t.columns {
		if c.sequence == "" {
			continue
		}
		var top int64
		col := pgx.Identifier{c.name}.Sanitize()
		if err := dtx.QueryRow(ctx, `SELECT coalesce(max(`+col+`), 0)::bigint FROM `+pgx.Identifier{t.name}.Sanitize()).Scan(&top); err != nil {
			return fmt.Errorf("target: %s.%s: %w", t.name, c.name, err)
		}
		top = max(top, handed)
		if top < 1 {
			continue // a new sequence starts at 1
		}
		if _, err := dtx.Exec(ctx, `SELECT setval($1::text::regclass, $2)`, c.sequence, top); err != nil {
			return fmt.Errorf("target: advance %s: %w", c.sequence, err)
		}
	}
	return nil
}

// converter turns a value read from SQLite into one for a target column
// of its type. NULL stays NULL (a NOT NULL column refuses it).
type converter func(v any) (any, error)

// converters by PostgreSQL type (format_type), for the types the schema
// uses. The SQLite store keeps times as RFC 3339 text in UTC
// (sqlite.fmtTime, to the nanosecond), booleans as 0 and 1, webhook types
// as a JSON array of strings, code as text.
var converters = map[string]converter{
	"text":                     nullable(toText),
	"bigint":                   nullable(toInt),
	"integer":                  nullable(toInt),
	"double precision":         nullable(toFloat),
	"boolean":                  nullable(toBool),
	"timestamp with time zone": nullable(toTime),
	"bytea":                    nullable(toBytes),
	"text[]":                   nullable(toTextArray),
}

func nullable(f converter) converter {
	return func(v any) (any, error) {
		if v == nil {
			return nil, nil
		}
		return f(v)
	}
}

// pgText checks that PostgreSQL's text can hold s: UTF-8 without NUL.
func pgText(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", errors.New("text that is not UTF-8, which PostgreSQL's text cannot hold")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "", errors.New("text with a NUL byte, which PostgreSQL's text cannot hold")
	}
	return s, nil
}

func toText(v any) (any, error) {
	switch v := v.(type) {
	case string:
		return pgText(v)
	case []byte:
		return pgText(string(v))
	}
	return nil, fmt.Errorf("%T %v where text was expected", v, v)
}

func toInt(v any) (any, error) {
	if n, ok := v.(int64); ok {
		return n, nil
	}
	return nil, fmt.Errorf("%T %v where an integer was expected", v, v)
}

func toFloat(v any) (any, error) {
	switch v := v.(type) {
	case float64:
		return v, nil
	case int64:
		return float64(v), nil
	}
	return nil, fmt.Errorf("%T %v where a number was expected", v, v)
}

func toBool(v any) (any, error) {
	switch v {
	case int64(0):
		return false, nil
	case int64(1):
		return true, nil
	}
	return nil, fmt.Errorf("%T %v where 0 or 1 was expected", v, v)
}

func toTime(v any) (any, error) {
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%T %v where an RFC 3339 time was expected", v, v)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, fmt.Errorf("%q is not an RFC 3339 time", s)
	}
	// PostgreSQL keeps microseconds, as the postgres store writes them.
	return t.UTC().Truncate(time.Microsecond), nil
}

func toBytes(v any) (any, error) {
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case []byte:
		return v, nil
	}
	return nil, fmt.Errorf("%T %v where text or a blob was expected", v, v)
}

func toTextArray(v any) (any, error) {
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%T %v where a JSON array was expected", v, v)
	}
	out := []string{}
	if err := json.Unmarshal([]byte(s), &out); err != nil || out == nil {
		return nil, fmt.Errorf("%q is not a JSON array of strings", s)
	}
	for _, e := range out {
		if _, err := pgText(e); err != nil {
			return nil, err
		}
	}
	return out, nil
}
