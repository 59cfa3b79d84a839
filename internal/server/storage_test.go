package server_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
	// The test's own lock waits for a write the server may be making
	// (startup, the event bus): only then does the server find it locked.
	other, err := sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(30000)")
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

// TestListDirPages: a listing over a page says so and gives a cursor;
// following it lists 25,000 entries once each, in order, by pages of the
// default size and of a given limit; a bad cursor is a 400.
func TestListDirPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	dir := filepath.Join(e.home(id), "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 25000
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := "/v1/sandboxes/" + id + "/files/list?path=many"
	var cursor0 string
	for _, c := range []struct {
		limit string
		pages []int
	}{{"", []int{10000, 10000, 5000}}, {"&limit=9999", []int{9999, 9999, 5002}}} {
		var pages []int
		seen := 0
		for cursor := ""; ; {
			r := e.do("GET", base+c.limit+cursor, e.keyA, nil)
			want(t, r, http.StatusOK, "")
			var page struct {
				Entries    []struct{ Path string }
				Truncated  bool
				NextCursor *string `json:"next_cursor"`
			}
			if err := json.Unmarshal(r.body, &page); err != nil {
				t.Fatal(err)
			}
			pages = append(pages, len(page.Entries))
			for _, en := range page.Entries {
				if want := fmt.Sprintf("/home/user/many/f%05d", seen); en.Path != want {
					t.Fatalf("limit %q: entry %d is %s, want %s", c.limit, seen, en.Path, want)
				}
				seen++
			}
			if page.Truncated != (page.NextCursor != nil) {
				t.Fatalf("truncated %v with next_cursor %v", page.Truncated, page.NextCursor)
			}
			if page.NextCursor == nil || len(pages) > 5 {
				break
			}
			if cursor0 == "" {
				cursor0 = *page.NextCursor
			}
			cursor = "&cursor=" + url.QueryEscape(*page.NextCursor)
		}
		if seen != n || !slices.Equal(pages, c.pages) {
			t.Fatalf("limit %q: pages of %v entries, %d in all; want %v", c.limit, pages, seen, c.pages)
		}
	}
	// A small listing is one page.
	r := e.do("GET", "/v1/sandboxes/"+id+"/files/list?path=.", e.keyA, nil)
	if m := r.json(t); m["truncated"] != false || m["next_cursor"] != nil {
		t.Fatalf("a small listing says truncated: %s", r.body)
	}
	forged := base64.RawURLEncoding.EncodeToString([]byte(`{"p":"many","d":1,"a":"/etc/passwd"}`))
	for _, q := range []string{"&cursor=%25%25", "&cursor=bm90IGpzb24", "&cursor=" + forged, "&depth=2&cursor=" + cursor0,
		"&limit=0", "&limit=10001"} {
		want(t, e.do("GET", base+q, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	want(t, e.do("GET", "/v1/sandboxes/"+id+"/files/list?path=.&cursor="+cursor0, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
}
