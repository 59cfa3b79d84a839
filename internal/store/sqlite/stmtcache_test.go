package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// TestWritesKeepStatementsPrepared: the write handle's connection keeps
// each write's statement prepared, and the same write again prepares
// nothing new; the writes still land.
func TestWritesKeepStatementsPrepared(t *testing.T) {
	ctx := context.Background()
	d, err := Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cached := func() int {
		t.Helper()
		c, err := d.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := -1
		if err := c.Raw(func(dc any) error {
			cc, ok := dc.(*cachingConn)
			if !ok {
				return fmt.Errorf("the write handle's connection is a %T, not a *cachingConn", dc)
			}
			n = cc.cached()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	add := func(id string) {
		t.Helper()
		if err := d.AddExecution(ctx, store.Execution{ID: id, SandboxID: "sb", Owner: "o", Language: "python",
			Status: "success", CreatedAt: time.Now(), Code: "1+1", Output: []byte(`{"results":[{"text":"2"}]}`)}); err != nil {
			t.Fatal(err)
		}
	}
	add("exe_1")
	after1 := cached()
	if after1 == 0 {
		t.Fatal("no statement kept prepared after a write")
	}
	for i := 2; i <= 5; i++ {
		add(fmt.Sprintf("exe_%d", i))
	}
	if n := cached(); n != after1 {
		t.Fatalf("%d statements prepared after the same write four more times; %d after the first", n, after1)
	}
	l, err := d.ListExecutions(ctx, "sb")
	if err != nil || len(l) != 5 {
		t.Fatalf("executions: %d, %v", len(l), err)
	}
}

// TestQueriesKeepStatementsPrepared: a read keeps its statement prepared
// and reuses it once its rows are closed; the same query again while its
// rows are open (two result sets at once in a transaction) still reads
// right, with a statement of its own.
func TestQueriesKeepStatementsPrepared(t *testing.T) {
	ctx := context.Background()
	d, err := Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i := range 3 {
		if err := d.AddExecution(ctx, store.Execution{ID: fmt.Sprintf("exe_%d", i), SandboxID: "sb", Owner: "o", Language: "python",
			Status: "success", CreatedAt: time.Now().Add(time.Duration(i) * time.Second), Code: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := d.rd.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cached := func() int {
		t.Helper()
		n := -1
		if err := c.Raw(func(dc any) error {
			cc, ok := dc.(*cachingConn)
			if !ok {
				return fmt.Errorf("the read handle's connection is a %T, not a *cachingConn", dc)
			}
			n = cc.cached()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const q = `SELECT code FROM executions WHERE sandbox_id = ? ORDER BY created_at`
	read := func(rows interface {
		Next() bool
		Scan(...any) error
	}) string {
		var out string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out += s
		}
		return out
	}
	for range 3 {
		rows, err := c.QueryContext(ctx, q, "sb")
		if err != nil {
			t.Fatal(err)
		}
		if got := read(rows); got != "012" {
			t.Fatalf("read %q", got)
		}
		rows.Close()
	}
	if n := cached(); n != 1 {
		t.Fatalf("%d statements kept after the same query three times; want 1", n)
	}
	// Two result sets of the same text at once.
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	outer, err := tx.QueryContext(ctx, q, "sb")
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for outer.Next() {
		var s string
		if err := outer.Scan(&s); err != nil {
			t.Fatal(err)
		}
		inner, err := tx.QueryContext(ctx, q, "sb")
		if err != nil {
			t.Fatal(err)
		}
		got += s + ":" + read(inner) + " "
		inner.Close()
	}
	outer.Close()
	if got != "0:012 1:012 2:012 " {
		t.Fatalf("nested reads: %q", got)
	}
}
