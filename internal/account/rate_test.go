package account

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }

var teams atomic.Int64 // names the accounts of servers

// servers returns two registries over st1 and st2 (handles on one
// database: two servers sharing it) with cfg, on one fake clock, and an
// account in them.
func servers(t *testing.T, cfg Config, st1, st2 Store, create store.Store) (a1, a2 *Account, now *time.Time) {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	r1, r2 := NewRegistry(cfg, st1), NewRegistry(cfg, st2)
	r1.now = func() time.Time { return clock }
	r2.now = r1.now
	rec, err := Create(ctx, create, fmt.Sprintf("team-%d", teams.Add(1)), Overrides{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a1, err = r1.Get(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if a2, err = r2.Get(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	return a1, a2, &clock
}

func openSQLite(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func openPostgres(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRateLimitsAcrossServers: two servers sharing a store keep an
// account's requests and executions per minute together, with the
// results one server alone gives; servers that do not share (SQLite's
// default) each count their own.
func TestRateLimitsAcrossServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	st1, st2 := openSQLite(t, path), openSQLite(t, path)
	cfg := Config{Defaults: Limits{RequestsPerMinute: 3, ExecutionsPerMinute: 2}, SharedStore: true}
	a1, a2, now := servers(t, cfg, st1, st2, st1)

	for i, a := range []*Account{a1, a2, a1} {
		res, err := a.AllowRequest(ctx)
		if err != nil || res != (RateResult{Allowed: true, Limit: 3, Remaining: int64(2 - i), Reset: time.Duration(i+1) * 20 * time.Second}) {
			t.Fatalf("request %d: %+v, %v", i+1, res, err)
		}
	}
	for name, a := range map[string]*Account{"the first server": a1, "the second server": a2} {
		res, err := a.AllowRequest(ctx)
		if err != nil || res != (RateResult{Limit: 3, Reset: time.Minute, RetryAfter: 20 * time.Second}) {
			t.Fatalf("a fourth request through %s: %+v, %v", name, res, err)
		}
	}
	*now = now.Add(20 * time.Second) // one back
	if res, err := a2.AllowRequest(ctx); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("a request a token later: %+v, %v", res, err)
	}
	if res, _ := a1.AllowRequest(ctx); res.Allowed {
		t.Fatalf("a second request a token later: %+v", res)
	}

	if err := a1.AdmitWork(true); err != nil {
		t.Fatal(err)
	}
	if err := a2.AdmitWork(false); err != nil {
		t.Fatal(err)
	}
	err := a1.AdmitWork(false)
	if e := apierr.From(err); e.Code != apierr.RateLimited || e.RetryAfter != 30*time.Second ||
		e.Message != "rate limit of 2 executions per minute reached; retry in 30.0 s" {
		t.Fatalf("a third execution: %v (retry after %v)", err, e.RetryAfter)
	}
	if u, _ := a1.Month(); u.Executions != 1 {
		t.Fatalf("the refused execution was counted: %d", u.Executions)
	}

	// Without a shared store each server has its own bucket: together
	// they let twice the limit through.
	cfg.SharedStore = false
	b1, b2, _ := servers(t, cfg, st1, st2, st1)
	allowed := 0
	for range 4 {
		for _, a := range []*Account{b1, b2} {
			if res, err := a.AllowRequest(ctx); err != nil {
				t.Fatal(err)
			} else if res.Allowed {
				allowed++
			}
		}
	}
	if allowed != 6 {
		t.Fatalf("two servers counting alone allowed %d requests, want 2 × 3", allowed)
	}
}

// TestSharedRatesMatchLocal: an account's requests counted in the store
// give the results the in-memory bucket gives, request for request
// (quarter-second steps at 60 a minute: exact in both).
func TestSharedRatesMatchLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openSQLite(t, filepath.Join(t.TempDir(), "s.db"))
	cfg := Config{Defaults: Limits{RequestsPerMinute: 60}}
	local, _, lnow := servers(t, cfg, db, db, db)
	cfg.SharedStore = true
	shared, _, snow := servers(t, cfg, db, db, db)
	seed, refused := uint64(1), 0
	for i := range 2000 {
		seed = seed*6364136223846793005 + 1442695040888963407
		if seed>>60 < 2 {
			d := time.Duration(seed>>40%40) * 250 * time.Millisecond
			*lnow, *snow = lnow.Add(d), snow.Add(d)
		}
		want, err1 := local.AllowRequest(ctx)
		got, err2 := shared.AllowRequest(ctx)
		if err1 != nil || err2 != nil || got != want {
			t.Fatalf("request %d: shared %+v, %v; local %+v, %v", i, got, err2, want, err1)
		}
		if !got.Allowed {
			refused++
		}
	}
	if refused == 0 || refused == 2000 {
		t.Fatalf("%d of 2000 refused: the sequence does not test both", refused)
	}
}

// TestRateLimitsAcrossServersPostgres: two servers over one PostgreSQL
// database, four goroutines each, hammering one account at one instant,
// let exactly the account's requests and executions per minute through.
func TestRateLimitsAcrossServersPostgres(t *testing.T) {
	t.Parallel()
	dsn := pgtest.New(t)
	st1, st2 := openPostgres(t, dsn), openPostgres(t, dsn)
	const rpm, epm = 10, 5
	a1, a2, _ := servers(t, Config{Defaults: Limits{RequestsPerMinute: rpm, ExecutionsPerMinute: epm}, SharedStore: true}, st1, st2, st1)
	var requests, executions atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		a := a1
		if g%2 == 1 {
			a = a2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				res, err := a.AllowRequest(context.Background())
				if err != nil {
					errs <- err
					return
				}
				if res.Allowed {
					requests.Add(1)
				}
				switch err := a.AdmitWork(false); apierr.CodeOf(err) {
				case "":
					executions.Add(1)
				case apierr.RateLimited:
				default:
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if requests.Load() != rpm || executions.Load() != epm {
		t.Fatalf("%d requests and %d executions allowed across two servers, want %d and %d", requests.Load(), executions.Load(), rpm, epm)
	}
}

// failingRates is a store whose rate counts fail.
type failingRates struct {
	Store
	err error
}

func (f failingRates) TakeRate(context.Context, string, int64, int64, time.Duration, time.Time) (store.RateTake, error) {
	return store.RateTake{}, f.err
}

// TestRateStoreFailsClosed: a per-minute budget the shared store cannot
// count refuses the request, with ERR_STORAGE_UNAVAILABLE when the
// database is busy or out of reach, and the cause otherwise.
func TestRateStoreFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openSQLite(t, filepath.Join(t.TempDir(), "s.db"))
	cfg := Config{Defaults: Limits{RequestsPerMinute: 3, ExecutionsPerMinute: 3}, SharedStore: true}
	busy := failingRates{Store: db, err: store.ErrUnavailable}
	a, _, _ := servers(t, cfg, busy, busy, db)
	_, err := a.AllowRequest(ctx)
	if e := apierr.From(err); e.Code != apierr.StorageUnavailable || e.RetryAfter != time.Second ||
		e.Message != "the requests per minute could not be counted: the server's database is busy or unavailable; retry later" {
		t.Fatalf("request with the store busy: %v", err)
	}
	if err := a.AdmitWork(true); apierr.CodeOf(err) != apierr.StorageUnavailable {
		t.Fatalf("execution with the store busy: %v", err)
	}
	if u, _ := a.Month(); u.Executions != 0 {
		t.Fatalf("an execution refused for the store was counted: %d", u.Executions)
	}
	broken := failingRates{Store: db, err: store.ErrBadRate}
	b, _, _ := servers(t, cfg, broken, broken, db)
	if _, err := b.AllowRequest(ctx); apierr.CodeOf(err) != apierr.Internal {
		t.Fatalf("request with the store failing: %v", err)
	}
	// Without limits the store is not asked.
	cfg.Defaults = Limits{}
	c, _, _ := servers(t, cfg, busy, busy, db)
	if res, err := c.AllowRequest(ctx); err != nil || !res.Allowed || c.AdmitWork(true) != nil {
		t.Fatalf("no limit: %+v, %v", res, err)
	}
}
