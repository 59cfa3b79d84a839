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
