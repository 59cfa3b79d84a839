package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
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

// cachingConnector opens the write handle's connections with
// cachingConn: SQLite parses and plans a statement's text at every
// prepare, and the driver prepares each Exec afresh. On the warm
// execution path the execution record's upsert was re-parsed at every
// write: about half the CPU of AddExecution (BENCHMARKS.md).
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
	return &cachingConn{c: ic, stmts: map[string]driver.Stmt{}}, nil
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

// cachingConn keeps the statements its Execs ran prepared, by text, and
// runs the next Exec of a text with its statement (bound, stepped to its
// end and reset: it holds nothing between uses). database/sql uses a
// connection from one goroutine at a time, so stmts needs no lock.
// Queries are not cached: their rows may still be open when the same
// text runs again.
type cachingConn struct {
	c     innerConn
	stmts map[string]driver.Stmt
}

var _ innerConn = (*cachingConn)(nil)

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	st, ok := c.stmts[query]
	if !ok {
		if len(c.stmts) >= maxCachedStmts {
			return c.c.ExecContext(ctx, query, args)
		}
		var err error
		if st, err = c.c.PrepareContext(ctx, query); err != nil {
			return nil, err
		}
		if _, ok := st.(driver.StmtExecContext); !ok {
			st.Close()
			return c.c.ExecContext(ctx, query, args)
		}
		c.stmts[query] = st
	}
	return st.(driver.StmtExecContext).ExecContext(ctx, args)
}

// cached is the number of statements kept prepared (tests).
func (c *cachingConn) cached() int { return len(c.stmts) }

func (c *cachingConn) Close() error {
	for q, st := range c.stmts {
		st.Close()
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

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.c.QueryContext(ctx, query, args)
}

func (c *cachingConn) Ping(ctx context.Context) error { return c.c.Ping(ctx) }

func (c *cachingConn) ResetSession(ctx context.Context) error { return c.c.ResetSession(ctx) }

func (c *cachingConn) IsValid() bool { return c.c.IsValid() }
