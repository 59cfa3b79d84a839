package account

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

func i64(v int64) *int64 { return &v }

func TestOverrides(t *testing.T) {
	t.Parallel()
	def := Limits{MaxSandboxes: 5, RequestsPerMinute: 600, MaxCPUs: 2}
	o := Overrides{MaxSandboxes: i64(1), MonthlyCPUSeconds: i64(100)}
	l := o.Apply(def)
	if l.MaxSandboxes != 1 || l.RequestsPerMinute != 600 || l.MonthlyCPUSeconds != 100 || l.MaxCPUs != 2 {
		t.Fatalf("Apply = %+v", l)
	}
	m := o.Merge(Overrides{MaxSandboxes: i64(3), RequestsPerMinute: i64(60)})
	if *m.MaxSandboxes != 3 || *m.RequestsPerMinute != 60 || *m.MonthlyCPUSeconds != 100 {
		t.Fatalf("Merge = %+v", m)
	}
	m.Clear("monthly_cpu_seconds")
	if m.MonthlyCPUSeconds != nil || !m.Known("max_cpus") || m.Known("bogus") {
		t.Fatalf("Clear/Known: %+v", m)
	}
	for name, bad := range map[string]Overrides{
		"max_sandboxes":      {MaxSandboxes: i64(-1)},
		"monthly_gb_seconds": {MonthlyGBSeconds: i64(-5)},
		"max_timeout":        {MaxTimeout: i64(-1)},
	} {
		err := bad.Validate()
		if apierr.CodeOf(err) != apierr.BadRequest || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	cpus := -0.5
	if err := (Overrides{MaxCPUs: &cpus}).Validate(); err == nil || !strings.Contains(err.Error(), "max_cpus") {
		t.Errorf("max_cpus: %v", err)
	}
}

func TestAmounts(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"25": 25e6, "25.00": 25e6, "0.000001": 1, "-1.5": -1_500_000, "3.14": 3_140_000,
		"1000000000": bound.MaxAmountMicros, "-1000000000.000000": -bound.MaxAmountMicros} {
		if got, err := ParseAmount(in); err != nil || got != want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "abc", "1.0000001", "1.", ".", "1e3", "1,5", "99999999999999",
		// Past the largest amount: 9,999,999,999,999 once wrapped to a negative balance.
		"9999999999999", "-9999999999999", "1000000000.000001", "9223372036854775807", "-", "NaN", "+5",
		strings.Repeat("9", 5000)} {
		if _, err := ParseAmount(in); err == nil {
			t.Errorf("ParseAmount(%q) accepted", in)
		}
	}
	if got := FormatMicros(-1_500_001); got != "-1.500001" {
		t.Errorf("FormatMicros = %s", got)
	}
	if got := FormatMicros(math.MinInt64); got != "-9223372036854.775808" {
		t.Errorf("FormatMicros(MinInt64) = %s", got)
	}
	// A grant may not take a balance past the largest amount.
	if err := CheckGrant("amount", bound.MaxAmountMicros-5, 6); apierr.CodeOf(err) != apierr.BadRequest {
		t.Errorf("a grant past the largest balance: %v", err)
	}
	if err := CheckGrant("amount", -bound.MaxAmountMicros, bound.MaxAmountMicros); err != nil {
		t.Errorf("a grant back to zero: %v", err)
	}
}

// TestLimitsBounded: every limit has a largest value (a max_timeout of
// 2^63-1 s once refused every create; a requests_per_minute of 2^63-1
// made the remaining count negative), and limits stored before the bound
// act as it.
func TestLimitsBounded(t *testing.T) {
	t.Parallel()
	var o Overrides
	for i, f := range o.ints() {
		big := int64(math.MaxInt64)
		bad := Overrides{}
		*bad.ints()[i].p = &big
		err := bad.Validate()
		if apierr.CodeOf(err) != apierr.BadRequest || !strings.HasPrefix(apierr.From(err).Message, f.name+" must be at most") {
			t.Errorf("%s = 2^63-1: %v", f.name, err)
		}
	}
	for _, v := range []float64{1e300, math.Inf(1), math.NaN()} {
		if err := (Overrides{MaxCPUs: &v}).Validate(); apierr.CodeOf(err) != apierr.BadRequest {
			t.Errorf("max_cpus = %v: %v", v, err)
		}
	}
	// Stored before the bound: cut to it.
	big, cpus := int64(math.MaxInt64), 1e300
	l := Overrides{MaxTimeout: &big, RequestsPerMinute: &big, MaxMemoryMB: &big, MaxCPUs: &cpus}.Apply(Limits{MaxSandboxes: 3})
	if l.MaxTimeout != int64(bound.MaxDuration/time.Second) || l.RequestsPerMinute != bound.MaxRate || l.MaxMemoryMB != bound.MaxMB ||
		l.MaxCPUs != bound.MaxCPUs || l.MaxSandboxes != 3 {
		t.Fatalf("applied %+v", l)
	}
	if time.Duration(l.MaxTimeout)*time.Second <= 0 || l.MaxMemoryMB<<20 <= 0 {
		t.Fatal("a cut limit still overflows")
	}
}

func newRegistry(t *testing.T, cfg Config) (*Registry, *sqlite.DB, *time.Time) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(cfg, db)
	now := time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	return r, db, &now
}

func TestLimitsEnforced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, db, now := newRegistry(t, Config{Defaults: Limits{MaxSandboxes: 2, MonthlyCPUSeconds: 10, MonthlyExecutions: 3, ExecutionsPerMinute: 100}})
	rec, err := Create(ctx, db, "team", Overrides{MaxCPUs: func() *float64 { v := 1.0; return &v }()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "acct_missing"); err != store.ErrNotFound {
		t.Fatalf("unknown account: %v", err)
	}
	a, err := r.Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CheckResources(2, 0, 0, 0); apierr.CodeOf(err) != apierr.BadRequest || !strings.Contains(err.Error(), "max_cpus of 1") {
		t.Fatalf("cpus above the account's max: %v", err)
	}
	for _, h := range []string{"h1", "h2"} {
		if err := acquire(a, h); err != nil {
			t.Fatal(err)
		}
	}
	err = acquire(a, "h3")
	if e := apierr.From(err); e.Code != apierr.SessionQuotaExceeded || e.Message != "concurrent sandbox limit of 2 reached" {
		t.Fatalf("third sandbox: %v", err)
	}
	release(t, a, db, "h1")
	if err := acquire(a, "h3"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := a.AdmitWork(true); err != nil {
			t.Fatal(err)
		}
		a.Accrue(Usage{Executions: 1}, 0) // not counted twice
	}
	err = a.AdmitWork(true)
	if e := apierr.From(err); e.Code != apierr.SessionQuotaExceeded || !strings.Contains(e.Message, "monthly executions quota of 3 reached; it resets at 2027-01-01T00:00:00Z") {
		t.Fatalf("fourth execution: %v", err)
	}
	if err := a.AdmitWork(false); err != nil {
		t.Fatalf("a command does not count as an execution: %v", err)
	}
	a.Accrue(Usage{CPUSeconds: 10}, 0)
	release(t, a, db, "h2")
	if err := acquire(a, "h4"); apierr.CodeOf(err) != apierr.SessionQuotaExceeded || !strings.Contains(err.Error(), "cpu-seconds") {
		t.Fatalf("cpu quota: %v", err)
	}
	// A new month starts afresh.
	*now = now.Add(2 * time.Hour)
	if err := acquire(a, "h4"); err != nil {
		t.Fatalf("in the new month: %v", err)
	}
}

// acquire is AcquireSandbox with holder; an account with a cap reserves
// in the store.
func acquire(a *Account, holder string) error {
	reserved, err := a.AcquireSandbox(context.Background(), holder)
	if want := a.limits.MaxSandboxes > 0 && a.r.cfg.SharedStore; err == nil && reserved != want {
		return fmt.Errorf("reserved %v with max_sandboxes %d, shared store %v", reserved, a.limits.MaxSandboxes, a.r.cfg.SharedStore)
	}
	return err
}

// release gives back what acquire(a, holder) took.
func release(t *testing.T, a *Account, st store.AdmissionStore, holder string) {
	t.Helper()
	a.ReleaseSandbox()
	if err := st.DropReservation(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
}

// TestLimitsAcrossServers: two registries over one database (two servers
// sharing a store) together keep an account's concurrent cap and its
// monthly executions quota, though neither sees the other's counts.
func TestLimitsAcrossServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := Config{Defaults: Limits{MaxSandboxes: 2, MonthlyExecutions: 3}, SharedStore: true}
	r1, db, now := newRegistry(t, cfg)
	r2 := NewRegistry(cfg, db)
	r2.now = r1.now
	rec, err := Create(ctx, db, "team", Overrides{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := r1.Get(ctx, rec.ID)
	a2, _ := r2.Get(ctx, rec.ID)
	if err := acquire(a1, "h1"); err != nil {
		t.Fatal(err)
	}
	if err := acquire(a2, "h2"); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]*Account{"the first server": a1, "the second server": a2} {
		if err := acquire(a, "h3"); apierr.CodeOf(err) != apierr.SessionQuotaExceeded {
			t.Fatalf("a third sandbox through %s: %v", name, err)
		}
	}
	if a1.Running() != 1 || a2.Running() != 1 {
		t.Fatalf("a refused create kept its local slot: %d, %d", a1.Running(), a2.Running())
	}
	release(t, a1, db, "h1")
	if err := acquire(a2, "h3"); err != nil {
		t.Fatalf("after the first server's sandbox ended: %v", err)
	}

	for i, a := range []*Account{a1, a2, a1} {
		if err := a.AdmitWork(true); err != nil {
			t.Fatalf("execution %d: %v", i+1, err)
		}
	}
	if err := a2.AdmitWork(true); apierr.CodeOf(err) != apierr.SessionQuotaExceeded {
		t.Fatalf("a fourth execution on the server that ran one: %v", err)
	}
	if u, _ := a2.Month(); u.Executions != 1 {
		t.Fatalf("the refused execution stayed counted: %d", u.Executions)
	}
	*now = now.Add(2 * time.Hour) // January
	if err := a2.AdmitWork(true); err != nil {
		t.Fatalf("in the new month: %v", err)
	}
}

func TestCredits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, db, now := newRegistry(t, Config{EnforceCredits: true, CreditsGrace: time.Minute})
	rec, err := Create(ctx, db, "team", Overrides{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := r.Get(ctx, rec.ID)
	if a.Balance() != 1000 {
		t.Fatalf("free credits: %d", a.Balance())
	}
	a.Accrue(Usage{}, 999.5)
	if err := acquire(a, "h1"); err == nil || !strings.Contains(err.Error(), "credits exhausted") {
		t.Fatalf("a balance under one micro-unit is exhausted: %v", err)
	}
	if a.Exhausted() {
		t.Fatal("exhausted before the grace period")
	}
	*now = now.Add(time.Minute)
	if !a.Exhausted() {
		t.Fatal("not exhausted after the grace period")
	}
	// Settling moves whole micro-units to the ledger; the balance holds.
	owed := a.TakeOwed()
	if owed != 999 {
		t.Fatalf("owed %d", owed)
	}
	a.Settled(owed)
	if a.Balance() != 0 {
		t.Fatalf("balance after settling %d", a.Balance())
	}
	a.Granted(5000)
	if err := a.AdmitWork(true); err != nil || a.Exhausted() {
		t.Fatalf("after a grant: %v", err)
	}
	// Amounts past int64 stop at its ends: a balance never wraps to the
	// other sign, and a cost that is not a number or negative is no
	// credit.
	a.Granted(math.MaxInt64)
	a.Granted(math.MaxInt64)
	const top = math.MaxInt64 - 1 // half a micro-unit is still owed
	if a.Balance() != top {
		t.Fatalf("grants past int64: balance %d", a.Balance())
	}
	a.Accrue(Usage{}, math.NaN())
	a.Accrue(Usage{}, -1e30)
	if a.Balance() != top {
		t.Fatalf("a NaN or negative cost moved the balance to %d", a.Balance())
	}
	a.Accrue(Usage{}, 1e300)
	if owed := a.TakeOwed(); owed != bound.MaxAmountMicros {
		t.Fatalf("a cost of 1e300 is owed as %d", owed)
	}
}

// TestConcurrentCap: many goroutines never hold more than the cap.
func TestConcurrentCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, db, _ := newRegistry(t, Config{Defaults: Limits{MaxSandboxes: 3}})
	rec, _ := Create(ctx, db, "team", Overrides{}, 0)
	a, _ := r.Get(ctx, rec.ID)
	var mu sync.Mutex
	held, most := 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				h := fmt.Sprintf("g%d-%d", g, i)
				if acquire(a, h) != nil {
					continue
				}
				mu.Lock()
				held++
				most = max(most, held)
				mu.Unlock()
				mu.Lock()
				held--
				mu.Unlock()
				a.ReleaseSandbox()
				if err := db.DropReservation(ctx, h); err != nil {
					panic(err)
				}
			}
		}()
	}
	wg.Wait()
	if most > 3 || most == 0 || a.Running() != 0 {
		t.Fatalf("most held %d, running %d", most, a.Running())
	}
}

// pausingStore lets a test change an account while Refresh is between
// its reads of the store and its updates.
type pausingStore struct {
	Store
	listed chan struct{} // closed once ListAccounts has read
	resume chan struct{}
}

func (p *pausingStore) ListAccounts(ctx context.Context) ([]store.Account, error) {
	l, err := p.Store.ListAccounts(ctx)
	close(p.listed)
	<-p.resume
	return l, err
}

// TestRefreshKeepsNewerChanges: limits and grants made through the
// registry while a Refresh reads the store are not undone by it (the
// meter refreshes after every flush; the admin API's change was lost).
func TestRefreshKeepsNewerChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, db, _ := newRegistry(t, Config{Defaults: Limits{RequestsPerMinute: 600}})
	rec, err := Create(ctx, db, "team", Overrides{RequestsPerMinute: i64(3)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ps := &pausingStore{Store: db, listed: make(chan struct{}), resume: make(chan struct{})}
	r := NewRegistry(Config{Defaults: Limits{RequestsPerMinute: 600}}, ps)
	a, err := r.Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- r.Refresh(ctx) }()
	<-ps.listed
	// The admin API: the store first, then the live account.
	if err := db.SetAccountLimits(ctx, rec.ID, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	a.SetOverrides(Overrides{})
	a.Granted(5_000_000)
	close(ps.resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if l, _ := a.Limits(); l.RequestsPerMinute != 600 {
		t.Fatalf("requests_per_minute after Refresh: %d, want the new 600", l.RequestsPerMinute)
	}
	if b := a.Balance(); b != 5_000_000 {
		t.Fatalf("balance after Refresh: %d, want the grant's 5000000", b)
	}
	// The next Refresh reads the store, which has the limits now.
	ps.listed, ps.resume = make(chan struct{}), make(chan struct{})
	close(ps.resume)
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _ := a.Limits(); l.RequestsPerMinute != 600 {
		t.Fatalf("requests_per_minute after a second Refresh: %d", l.RequestsPerMinute)
	}
}
