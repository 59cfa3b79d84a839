package server_test

import (
	"context"
	"database/sql"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestReplicasShareRateLimit: two replicas counting in the store they
// share (account.Config.SharedStore) hold an account's requests per
// minute together, with the headers and errors of one server alone, on
// /v1 and the E2B surface alike.
func TestReplicasShareRateLimit(t *testing.T) {
	t.Parallel()
	accts := account.Config{Defaults: account.Limits{RequestsPerMinute: 4}, SharedStore: true}
	a := newEnv(t, server.Config{PreviewKey: replicaKey, Accounts: accts}, shared)
	b := newReplica(t, a, func(c *server.Config) { c.Accounts = accts })
	for i, rp := range []*env{a, b.env, a, b.env} {
		r := rp.do("GET", "/v1/sandboxes", rp.keyA, nil)
		want(t, r, http.StatusOK, "")
		if l, rem := r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"); l != "4" || rem != strconv.Itoa(3-i) {
			t.Fatalf("request %d: X-RateLimit-Limit %q, X-RateLimit-Remaining %q", i+1, l, rem)
		}
	}
	for _, rp := range []*env{a, b.env} {
		r := rp.do("GET", "/v1/sandboxes", rp.keyA, nil)
		want(t, r, http.StatusTooManyRequests, "ERR_RATE_LIMITED")
		// 15 s until a token is back, a minute until all are.
		if ra, rem, reset := r.header.Get("Retry-After"), r.header.Get("X-RateLimit-Remaining"), r.header.Get("X-RateLimit-Reset"); ra != "15" || rem != "0" || reset != "60" {
			t.Fatalf("refused: Retry-After %q, X-RateLimit-Remaining %q, X-RateLimit-Reset %q", ra, rem, reset)
		}
	}
	r := b.do("GET", "/sandboxes", "", nil, "X-API-Key", b.keyA)
	if m := r.json(t); r.status != http.StatusTooManyRequests || m["code"] != 429.0 || r.header.Get("Retry-After") == "" {
		t.Fatalf("E2B on the other replica: %d %s %v", r.status, r.body, r.header)
	}
	// Another account has its own budget.
	want(t, b.do("GET", "/v1/sandboxes", b.keyB, nil), http.StatusOK, "")
}

// TestRateStoreUnavailableIs503: with the rate counted in the store, a
// database another process holds locked refuses the request with 503
// ERR_STORAGE_UNAVAILABLE and Retry-After (fails closed); a server
// counting alone does not need the store for it.
func TestRateStoreUnavailableIs503(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, sharedStore := range []bool{true, false} {
		e := newEnv(t, server.Config{Accounts: account.Config{Defaults: account.Limits{RequestsPerMinute: 100}, SharedStore: sharedStore}})
		want(t, e.do("GET", "/v1/sandboxes", e.keyA, nil), http.StatusOK, "") // loads the account
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
		r := e.do("GET", "/v1/sandboxes", e.keyA, nil) // a shared count waits out the 5 s busy timeout
		if sharedStore {
			want(t, r, http.StatusServiceUnavailable, "ERR_STORAGE_UNAVAILABLE")
			if r.header.Get("Retry-After") != "1" {
				t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
			}
		} else {
			want(t, r, http.StatusOK, "")
		}
		conn.ExecContext(ctx, "ROLLBACK")
	}
}

// TestPruneRateBuckets: the prune deletes rate buckets full again (a
// grace minute ago), not those still counting.
func TestPruneRateBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, server.Config{PruneInterval: 20 * time.Millisecond})
	now := time.Now()
	for key, at := range map[string]time.Time{"old": now.Add(-time.Hour), "new": now.Add(time.Hour)} {
		if _, err := e.store.TakeRate(ctx, key, 1, 60, time.Second, at); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitFor(t, "the full bucket deleted", func() bool {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM rate_buckets WHERE key = 'old'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM rate_buckets WHERE key = 'new'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the counting bucket: %d rows, %v", n, err)
	}
}
