package server_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestStorageUnavailableIs503: a database another process holds locked
// answers 503 ERR_STORAGE_UNAVAILABLE with Retry-After, not a 500, and no
// sandbox is left running unrecorded.
func TestStorageUnavailableIs503(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	other, err := sql.Open("sqlite", "file:"+e.dbPath)
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
	r := e.do("POST", "/v1/sandboxes", e.keyA, nil) // waits out the 5 s busy timeout
	want(t, r, http.StatusServiceUnavailable, "ERR_STORAGE_UNAVAILABLE")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	conn.ExecContext(ctx, "ROLLBACK")
	if n := len(e.engine.List()); n != 0 {
		t.Fatalf("%d sandboxes running after the failed create", n)
	}
}

// TestRetentionAndPages: records of stopped sandboxes go after the
// retention period; the sandbox list pages with limit and cursor.
func TestRetentionAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Retention: time.Millisecond, PruneInterval: 20 * time.Millisecond})
	ids := []string{e.create(e.keyA, nil), e.create(e.keyA, nil), e.create(e.keyA, nil)}
	r := e.do("GET", "/v1/sandboxes?limit=2", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	page := r.json(t)
	if l := page["sandboxes"].([]any); len(l) != 2 || page["next"] == nil {
		t.Fatalf("first page: %s", r.body)
	}
	r = e.do("GET", "/v1/sandboxes?limit=2&cursor="+page["next"].(string), e.keyA, nil)
	if l := r.json(t)["sandboxes"].([]any); len(l) != 1 || l[0].(map[string]any)["id"] != ids[2] || r.json(t)["next"] != nil {
		t.Fatalf("second page: %s", r.body)
	}
	want(t, e.do("GET", "/v1/sandboxes?limit=0", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")

	want(t, e.do("DELETE", "/v1/sandboxes/"+ids[0], e.keyA, nil), http.StatusNoContent, "")
	deadline := time.Now().Add(10 * time.Second)
	for e.do("GET", "/v1/sandboxes/"+ids[0], e.keyA, nil).status != http.StatusNotFound {
		if time.Now().After(deadline) {
			t.Fatal("the stopped sandbox's record was not pruned")
		}
		time.Sleep(20 * time.Millisecond) // polling the real condition
	}
	// Running sandboxes are never pruned.
	want(t, e.do("GET", "/v1/sandboxes/"+ids[1], e.keyA, nil), http.StatusOK, "")
}

// TestListDirSaysTruncated: a listing the agent cut at its cap says so.
func TestListDirSaysTruncated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	dir := filepath.Join(e.home(id), "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 10050 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := e.do("GET", "/v1/sandboxes/"+id+"/files/list?path=many", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["truncated"] != true || len(m["entries"].([]any)) != 10000 {
		t.Fatalf("a 10,050-entry listing: truncated %v, %d entries", m["truncated"], len(m["entries"].([]any)))
	}
	r = e.do("GET", "/v1/sandboxes/"+id+"/files/list?path=.", e.keyA, nil)
	if m := r.json(t); m["truncated"] != false {
		t.Fatalf("a small listing says truncated: %s", r.body)
	}
}
