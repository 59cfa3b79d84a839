package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

func open(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestMigrationsAppliedOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	db := open(t, path)
	m, err := db.Migrations(context.Background())
	if err != nil || len(m) == 0 || m[0] != "0001_init" {
		t.Fatalf("migrations %v, %v", m, err)
	}
	db.Close()
	// A second open applies nothing again (a re-run of 0001 would fail on
	// CREATE TABLE).
	db = open(t, path)
	defer db.Close()
	m2, err := db.Migrations(context.Background())
	if err != nil || len(m2) != len(m) {
		t.Fatalf("after reopen %v, %v", m2, err)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	now := time.Now().Truncate(time.Microsecond)
	k := store.Key{ID: "k1", Name: "ci", Owner: "k1", Hash: "abc", CreatedAt: now}
	if err := db.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateKey(ctx, store.Key{ID: "k2", Owner: "k2", Hash: "abc", CreatedAt: now}); err == nil {
		t.Fatal("duplicate hash accepted")
	}
	got, err := db.KeyByHash(ctx, "abc")
	if err != nil || got.ID != "k1" || got.Name != "ci" || !got.CreatedAt.Equal(now) || got.RevokedAt != nil {
		t.Fatalf("KeyByHash = %+v, %v", got, err)
	}
	if _, err := db.KeyByHash(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	if n, _ := db.CountActiveKeys(ctx); n != 1 {
		t.Fatalf("active keys %d", n)
	}
	if err := db.RevokeKey(ctx, "k1", now); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeKey(ctx, "k1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, _ = db.KeyByHash(ctx, "abc")
	if got.RevokedAt == nil || !got.RevokedAt.Equal(now) {
		t.Fatalf("revoked_at %v, want the first revocation %v", got.RevokedAt, now)
	}
	if n, _ := db.CountActiveKeys(ctx); n != 0 {
		t.Fatalf("active keys %d after revoke", n)
	}
	if err := db.RevokeKey(ctx, "zz", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if l, _ := db.ListKeys(ctx); len(l) != 1 {
		t.Fatalf("ListKeys = %+v", l)
	}
}

func TestSandboxesAndRestartMarking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db := open(t, path)
	now := time.Now()
	for i, id := range []string{"a", "b", "c"} {
		s := store.Sandbox{ID: id, Owner: "o1", Template: "python", State: store.SandboxRunning,
			CreatedAt: now.Add(time.Duration(i) * time.Second), ExpiresAt: now.Add(time.Hour),
			Metadata: json.RawMessage(`{"k":"v"}`)}
		if id == "c" {
			s.Owner = "o2"
		}
		if err := db.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.StopSandbox(ctx, "a", "killed", now); err != nil {
		t.Fatal(err)
	}
	if err := db.StopSandbox(ctx, "a", "later", now); err != nil {
		t.Fatal(err)
	}
	a, err := db.GetSandbox(ctx, "a")
	if err != nil || a.State != store.SandboxStopped || a.StopReason != "killed" || a.StoppedAt == nil || string(a.Metadata) != `{"k":"v"}` {
		t.Fatalf("a = %+v, %v", a, err)
	}
	run, _ := db.ListSandboxes(ctx, store.SandboxFilter{Owner: "o1", State: store.SandboxRunning})
	if len(run) != 1 || run[0].ID != "b" {
		t.Fatalf("running of o1 = %+v", run)
	}
	all, _ := db.ListSandboxes(ctx, store.SandboxFilter{Owner: "o1"})
	if len(all) != 2 || all[0].ID != "a" {
		t.Fatalf("all of o1 = %+v", all)
	}
	exp := now.Add(2 * time.Hour)
	if err := db.UpdateSandboxExpiry(ctx, "b", exp); err != nil {
		t.Fatal(err)
	}
	if b, _ := db.GetSandbox(ctx, "b"); !b.ExpiresAt.Equal(exp.Truncate(time.Nanosecond)) {
		t.Fatalf("expires %v want %v", b.ExpiresAt, exp)
	}
	db.Close()

	// A restart marks what was running as stopped; what had passed its
	// deadline meanwhile timed out then.
	db = open(t, path)
	defer db.Close()
	expired := now.Add(-time.Minute)
	if err := db.PutSandbox(ctx, store.Sandbox{ID: "d", Owner: "o3", Template: "python", State: store.SandboxRunning,
		CreatedAt: now.Add(-time.Hour), ExpiresAt: expired}); err != nil {
		t.Fatal(err)
	}
	n, err := db.StopAllRunning(ctx, "server restarted", time.Now())
	if err != nil || n != 3 {
		t.Fatalf("StopAllRunning = %d, %v", n, err)
	}
	if d, _ := db.GetSandbox(ctx, "d"); d.State != store.SandboxStopped || d.StopReason != "timed out" ||
		d.StoppedAt == nil || !d.StoppedAt.Equal(expired.Truncate(time.Nanosecond)) {
		t.Fatalf("expired while down: %+v", d)
	}
	for _, id := range []string{"b", "c"} {
		s, _ := db.GetSandbox(ctx, id)
		if s.State != store.SandboxStopped || s.StopReason != "server restarted" {
			t.Fatalf("%s = %+v", id, s)
		}
	}
	if _, err := db.GetSandbox(ctx, "zz"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
}

func TestExecutions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	e := store.Execution{ID: "e1", SandboxID: "s", Owner: "o", Language: "python", Status: "success",
		ExecutionTimeMS: 1.5, CPUTimeMS: 1, PeakMemoryBytes: 42, CreatedAt: time.Now()}
	if err := db.AddExecution(ctx, e); err != nil {
		t.Fatal(err)
	}
	l, err := db.ListExecutions(ctx, "s")
	if err != nil || len(l) != 1 || l[0].PeakMemoryBytes != 42 || l[0].ExecutionTimeMS != 1.5 || l[0].Language != "python" {
		t.Fatalf("ListExecutions = %+v, %v", l, err)
	}
}

// TestExecutionsCutByRestart: an execution is recorded as it starts and
// replaced when it ends; one still running when the server died is ended
// at the next start with the reason, and only those.
func TestExecutionsCutByRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	at := time.Now()
	for _, e := range []store.Execution{
		{ID: "done", SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: at},
		{ID: "done", SandboxID: "s", Owner: "o", Status: "success", ExecutionTimeMS: 3, CreatedAt: at},
		{ID: "cut", SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: at.Add(time.Millisecond)},
	} {
		if err := db.AddExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	n, err := db.EndRunningExecutions(ctx, "ERR_INTERNAL", "server restarted")
	if err != nil || n != 1 {
		t.Fatalf("EndRunningExecutions = %d, %v; want 1", n, err)
	}
	l, err := db.ListExecutions(ctx, "s")
	if err != nil || len(l) != 2 {
		t.Fatalf("ListExecutions = %+v, %v; want two records", l, err)
	}
	if l[0].ID != "done" || l[0].Status != "success" || l[0].ExecutionTimeMS != 3 || l[0].Error != "" {
		t.Errorf("finished execution: %+v", l[0])
	}
	if l[1].ID != "cut" || l[1].Status != store.ExecutionError || l[1].ErrorCode != "ERR_INTERNAL" || l[1].Error != "server restarted" {
		t.Errorf("cut execution: %+v", l[1])
	}
}

func BenchmarkAddExecution(b *testing.B) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for i := range b.N {
		e := store.Execution{ID: fmt.Sprint("e", i), SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: time.Now()}
		if err := db.AddExecution(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDatabasePrivate: the database and its WAL files are the owner's
// alone, also when the file existed with a wider mode.
func TestDatabasePrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	db := open(t, path)
	defer db.Close()
	if err := db.CreateKey(context.Background(), store.Key{ID: "k", Name: "n", Hash: "h", Owner: "o", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}

// TestPageExecutions: pages newest first before a cursor, with code and
// output; only a sandbox's newest store.KeptOutputs keep their output.
func TestPageExecutions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	at := time.Now()
	n := store.KeptOutputs + 2
	for i := range n {
		e := store.Execution{ID: fmt.Sprintf("e%03d", i), SandboxID: "s", Owner: "o", Status: "success",
			CreatedAt: at.Add(time.Duration(i) * time.Millisecond), Code: fmt.Sprint("print(", i, ")"),
			Output: json.RawMessage(fmt.Sprintf(`{"stdout":"%d\n"}`, i))}
		if err := db.AddExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// Another sandbox's executions keep theirs.
	db.AddExecution(ctx, store.Execution{ID: "other", SandboxID: "t", Owner: "o", Status: "success", CreatedAt: at, Output: json.RawMessage(`{}`)})
	page, err := db.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "s", Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != fmt.Sprintf("e%03d", n-1) || page[0].Code != fmt.Sprint("print(", n-1, ")") ||
		string(page[0].Output) != fmt.Sprintf(`{"stdout":"%d\n"}`, n-1) {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	page, err = db.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "s", Before: page[1].ID})
	if err != nil || len(page) != n-2 || page[0].ID != fmt.Sprintf("e%03d", n-3) {
		t.Fatalf("after the cursor: %d, %v", len(page), err)
	}
	for _, e := range page {
		if kept := e.ID >= fmt.Sprintf("e%03d", n-store.KeptOutputs); kept != (e.Output != nil) {
			t.Fatalf("%s: output %q (kept %v)", e.ID, e.Output, kept)
		}
	}
	if l, _ := db.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "t"}); len(l) != 1 || l[0].Output == nil {
		t.Fatalf("sandbox t: %+v", l)
	}
}
