package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// openHandles counts this process's descriptors open on path.
func openHandles(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// TestPoolIsBounded: a 200-way burst of reads and writes leaves at most
// one handle on the database for writes, MaxOpenConns for reads, and the
// DB's lock.
func TestPoolIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db := open(t, path)
	defer db.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("s", i)
			errs <- db.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "o", Template: "python", State: store.SandboxRunning,
				CreatedAt: time.Now(), ExpiresAt: time.Now()})
			_, err := db.ListSandboxes(ctx, store.SandboxFilter{Owner: "o"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := openHandles(t, path); n < 2 || n > sqlite.MaxOpenConns+2 {
		t.Fatalf("%d handles open on the database, want 2..%d (the lock's, the writes' and the reads')", n, sqlite.MaxOpenConns+2)
	}
}

// TestReadsBesideWriters: while another process holds the write lock and
// more writers than the pool has handles wait for it (a tenant's flood of
// writes), a read is answered at once: WAL lets it run beside the writer,
// and the waiting writers hold no handle it needs.
func TestReadsBesideWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	const busy = 3 * time.Second
	db, err := sqlite.OpenOptions(ctx, path, sqlite.Options{BusyTimeout: busy})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PutSandbox(ctx, store.Sandbox{ID: "a", Owner: "o", State: store.SandboxRunning, CreatedAt: time.Now(), ExpiresAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 * sqlite.MaxOpenConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db.PutSandbox(ctx, store.Sandbox{ID: fmt.Sprint("w", i), Owner: "o", State: store.SandboxRunning, CreatedAt: time.Now(), ExpiresAt: time.Now()})
		}()
	}
	// While they wait (a busy timeout of 3 s), every read is answered
	// at once.
	var took time.Duration
	for start := time.Now(); time.Since(start) < busy/2 && took < busy/6; {
		t0 := time.Now()
		got, err := db.GetSandbox(ctx, "a")
		took = time.Since(t0)
		if err != nil || got.ID != "a" {
			t.Fatalf("GetSandbox = %+v, %v", got, err)
		}
	}
	conn.ExecContext(ctx, "ROLLBACK")
	wg.Wait()
	if took >= busy/6 {
		t.Fatalf("a read took %v behind writers waiting for the lock", took)
	}
}

// TestLockedIsUnavailable: a write that cannot get the lock within the
// busy timeout fails with store.ErrUnavailable, not an unclassified error.
func TestLockedIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sqlite.OpenOptions(ctx, path, sqlite.Options{BusyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	err = db.PutSandbox(ctx, store.Sandbox{ID: "a", Owner: "o", State: store.SandboxRunning, CreatedAt: time.Now(), ExpiresAt: time.Now()})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write under another's lock: %v", err)
	}
	conn.ExecContext(ctx, "ROLLBACK")
	if err := db.PutSandbox(ctx, store.Sandbox{ID: "a", Owner: "o", State: store.SandboxRunning, CreatedAt: time.Now(), ExpiresAt: time.Now()}); err != nil {
		t.Fatalf("write after the lock went: %v", err)
	}
}
