package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
)

// sqliteDriver is the driver registered as "sqlite" (sql.Open only looks
// it up: it connects to nothing).
func sqliteDriver() driver.Driver {
	db, err := sql.Open("sqlite", "")
	if err != nil {
		panic(err) // the import of modernc.org/sqlite registers it
	}
	defer db.Close()
	return db.Driver()
}

// maxCachedStmts bounds the statements one connection keeps prepared:
// the store's writes are a few dozen fixed texts; a text built with a
// varying number of placeholders past the bound runs unprepared, as
// before.
const maxCachedStmts = 256

// cachingConnector opens connections with cachingConn: SQLite parses
// and plans a statement's text at every prepare, and the driver prepares
// each Exec and Query afresh. On the warm execution path the execution
// record's upsert was re-parsed at every write (about half the CPU of
// AddExecution), the API key's lookup at every request (BENCHMARKS.md).
type cachingConnector struct {
	dsn string
	drv driver.Driver
}

func (c cachingConnector) Connect(context.Context) (driver.Conn, error) {
	cn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	ic, ok := cn.(innerConn)
	if !ok {
		return cn, nil
	}
	return &cachingConn{c: ic, stmts: map[string]*cachedStmt{}}, nil
}

func (c cachingConnector) Driver() driver.Driver { return c.drv }

// innerConn is what the SQLite driver's connections implement and
// database/sql uses.
type innerConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// cachingConn keeps the statements it ran prepared, by text, and runs
// the next Exec or Query of a text with its statement: an Exec's is
// bound, stepped to its end and reset (it holds nothing between uses), a
// Query's is reset when its rows close. A text queried again while its
// rows are still open (a transaction reading two result sets of the same
// query at once) is prepared afresh for that use. database/sql uses a
// connection from one goroutine at a time, so stmts needs no lock.
type cachingConn struct {
	c     innerConn
	stmts map[string]*cachedStmt
}

// A cachedStmt is a statement kept prepared; busy while rows of it are
// open.
type cachedStmt struct {
	st   driver.Stmt
	busy bool
}

var _ innerConn = (*cachingConn)(nil)

// stmt returns query's statement kept prepared, preparing it the first
// time; nil when it cannot be kept (too many kept, or a statement the
// driver cannot run with a context), the caller then runs query itself.
func (c *cachingConn) stmt(ctx context.Context, query string) (*cachedStmt, error) {
	if cs, ok := c.stmts[query]; ok {
		return cs, nil
	}
	if len(c.stmts) >= maxCachedStmts {
		return nil, nil
	}
	st, err := c.c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	_, ok1 := st.(driver.StmtExecContext)
	_, ok2 := st.(driver.StmtQueryContext)
	if !ok1 || !ok2 {
		st.Close()
		return nil, nil
	}
	cs := &cachedStmt{st: st}
	c.stmts[query] = cs
	return cs, nil
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil || cs.busy {
		return c.c.ExecContext(ctx, query, args)
	}
	return cs.st.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil || cs.busy {
		return c.c.QueryContext(ctx, query, args)
	}
	rows, err := cs.st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	cs.busy = true
	return &cachedRows{Rows: rows, cs: cs}, nil
}

// cachedRows frees its statement for the next use when closed.
type cachedRows struct {
	driver.Rows
	cs *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.cs.busy = false
	return err
}

// The column type interfaces the driver's rows implement, passed on.

func (r *cachedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *cachedRows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *cachedRows) ColumnTypeNullable(i int) (bool, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *cachedRows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

func (r *cachedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

// cached is the number of statements kept prepared (tests).
func (c *cachingConn) cached() int { return len(c.stmts) }

func (c *cachingConn) Close() error {
	for q, cs := range c.stmts {
		cs.st.Close()
		delete(c.stmts, q)
	}
	return c.c.Close()
}

func (c *cachingConn) Prepare(query string) (driver.Stmt, error) {
	return c.c.PrepareContext(context.Background(), query)
}

func (c *cachingConn) Begin() (driver.Tx, error) {
	return c.c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.c.BeginTx(ctx, opts)
}

func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.c.PrepareContext(ctx, query)
}

func (c *cachingConn) Ping(ctx context.Context) error { return c.c.Ping(ctx) }

func (c *cachingConn) ResetSession(ctx context.Context) error { return c.c.ResetSession(ctx) }

func (c *cachingConn) IsValid() bool { return c.c.IsValid() }
