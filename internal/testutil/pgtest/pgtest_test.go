package pgtest

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m, StopShared) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestNewDatabasesAreFreshAndDropped: each New is an empty database of
// its own, and it is gone once its test ends.
func TestNewDatabasesAreFreshAndDropped(t *testing.T) {
	ctx := context.Background()
	var first string
	t.Run("use", func(t *testing.T) {
		a, b := New(t), New(t)
		if a == b {
			t.Fatalf("two New calls gave one database: %s", a)
		}
		ca, cb := connect(t, a), connect(t, b)
		if _, err := ca.Exec(ctx, `CREATE TABLE x (id int)`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := cb.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'x'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("a table of one database is in the other: %d, %v", n, err)
		}
		if err := ca.QueryRow(ctx, `SELECT current_database()`).Scan(&first); err != nil {
			t.Fatal(err)
		}
		// Only the socket: the server has no TCP listener.
		var listen string
		if err := ca.QueryRow(ctx, `SHOW listen_addresses`).Scan(&listen); err != nil || listen != "" {
			t.Fatalf("listen_addresses %q, %v", listen, err)
		}
	})
	srv, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, srv.DSN("postgres"))
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, first).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %s outlived its test: %d, %v", first, n, err)
	}
}

// TestStopEndsServerAndRemovesDir: Stop leaves no process and no files.
func TestStopEndsServerAndRemovesDir(t *testing.T) {
	srv, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dir, pid := srv.Dir(), srv.Pid()
	connect(t, srv.DSN("postgres")) // open while it stops: a fast shutdown ends it
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("postmaster %d still there after Stop: %v", pid, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there after Stop: %v", dir, err)
	}
}

// TestMissingPostgresSaysSetup: without the binaries the error tells what
// to run.
func TestMissingPostgresSaysSetup(t *testing.T) {
	_, err := binDir(t.TempDir() + "/*/bin")
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("error %v, want one telling to run make setup", err)
	}
}
