package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sheepfold/sheepfold/internal/store"
)

// TestUpgradeFromInit builds a database with only 0001_init applied (the
// schema before accounts), fills it, and opens it with every migration:
// each key's owner becomes an account of its own, keys are user keys, and
// nothing that was there is lost.
func TestUpgradeFromInit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	init, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`,
		string(init),
		`INSERT INTO schema_migrations VALUES ('0001_init', '2026-01-01T00:00:00.000000000Z')`,
		`INSERT INTO keys (id, name, owner, hash, created_at) VALUES
			('key_a', 'alpha', 'key_a', 'h1', '2026-01-02T00:00:00.000000000Z'),
			('key_b', 'beta', 'team', 'h2', '2026-01-03T00:00:00.000000000Z'),
			('key_c', '', 'team', 'h3', '2026-01-04T00:00:00.000000000Z')`,
		`INSERT INTO sandboxes (id, owner, template, state, created_at, expires_at) VALUES
			('sb1', 'key_a', 'python', 'stopped', '2026-01-05T00:00:00.000000000Z', '2026-01-05T00:05:00.000000000Z')`,
		`INSERT INTO executions (id, sandbox_id, owner, status, created_at) VALUES
			('ex1', 'sb1', 'key_a', 'success', '2026-01-05T00:01:00.000000000Z')`,
	} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	raw.Close()

	db := open(t, path)
	defer db.Close()
	accts, err := db.ListAccounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 2 || accts[0].ID != "key_a" || accts[0].Name != "key_a" || accts[1].ID != "team" {
		t.Fatalf("accounts after the upgrade: %+v", accts)
	}
	if !accts[1].CreatedAt.Equal(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("an account's creation is its first key's: %v", accts[1].CreatedAt)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		k, err := db.KeyByHash(ctx, h)
		if err != nil || k.Role != store.RoleUser {
			t.Fatalf("key %s after the upgrade: %+v, %v", h, k, err)
		}
		if _, err := db.Account(ctx, k.Owner); err != nil {
			t.Fatalf("key %s has no account: %v", k.ID, err)
		}
	}
	if sb, err := db.GetSandbox(ctx, "sb1"); err != nil || sb.Owner != "key_a" {
		t.Fatalf("sandbox after the upgrade: %+v, %v", sb, err)
	}
	if ex, err := db.ListExecutions(ctx, "sb1"); err != nil || len(ex) != 1 {
		t.Fatalf("executions after the upgrade: %+v, %v", ex, err)
	}
	m, _ := db.Migrations(ctx)
	if !slices.Contains(m, "0003_accounts") {
		t.Fatalf("migrations %v", m)
	}
}

func TestAccountsUsageLedgerAlerts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	now := time.Now().UTC().Truncate(time.Microsecond)
	a := store.Account{ID: "acct_1", Name: "team", CreatedAt: now}
	k := store.Key{ID: "key_1", Hash: "h", Role: store.RoleAdmin, CreatedAt: now}
	if err := db.CreateAccountKey(ctx, a, k, 5_000_000); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateAccount(ctx, store.Account{ID: "acct_2", Name: "team", CreatedAt: now}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if got, err := db.KeyByHash(ctx, "h"); err != nil || got.Owner != "acct_1" || got.Role != store.RoleAdmin {
		t.Fatalf("key %+v, %v", got, err)
	}
	if got, err := db.AccountByName(ctx, "team"); err != nil || got.ID != "acct_1" {
		t.Fatalf("by name %+v, %v", got, err)
	}
	if err := db.SetAccountLimits(ctx, "nope", []byte(`{}`)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("limits of an unknown account: %v", err)
	}

	h1 := now.Truncate(time.Hour)
	h2 := h1.Add(time.Hour)
	d := func(sb, tmpl string, h time.Time, cpu int64) store.UsageDelta {
		return store.UsageDelta{SandboxID: sb, Account: "acct_1", Template: tmpl, Hour: h, WallNanos: 1e9, CPUNanos: cpu,
			GBSecondsReserved: 0.5, GBSecondsUsed: 0.25, DiskPeakBytes: cpu, Executions: 1, Commands: 2, EgressRequests: 3}
	}
	// The same bucket twice adds up; the disk peak keeps the larger.
	if err := db.AddUsage(ctx, []store.UsageDelta{d("sb1", "python", h1, 100), d("sb2", "node", h2, 50)},
		[]store.LedgerEntry{{Account: "acct_1", CreatedAt: now, Kind: store.LedgerUsage, AmountMicros: -1500}}); err != nil {
		t.Fatal(err)
	}
	if err := db.AddUsage(ctx, []store.UsageDelta{d("sb1", "python", h1, 300)}, nil); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryUsage(ctx, store.UsageFilter{Account: "acct_1", GroupBy: store.GroupSandbox})
	if err != nil || len(rows) != 2 {
		t.Fatalf("by sandbox %+v, %v", rows, err)
	}
	if r := rows[0]; r.Key != "sb1" || r.CPUNanos != 400 || r.WallNanos != 2e9 || r.DiskPeakBytes != 300 || r.Executions != 2 || r.Template != "python" ||
		r.Commands != 4 || r.EgressRequests != 6 {
		t.Fatalf("sb1 %+v", r)
	}
	rows, err = db.QueryUsage(ctx, store.UsageFilter{Account: "acct_1", From: h2, GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 50 {
		t.Fatalf("from the second hour %+v, %v", rows, err)
	}
	rows, err = db.QueryUsage(ctx, store.UsageFilter{Account: "other", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 0 {
		t.Fatalf("another account's usage %+v, %v", rows, err)
	}

	if err := db.AddLedger(ctx, store.LedgerEntry{Account: "acct_1", CreatedAt: now, Kind: store.LedgerGrant, AmountMicros: 2_000_000}); err != nil {
		t.Fatal(err)
	}
	ct, err := db.CreditTotals(ctx, "acct_1")
	if err != nil || ct.FreeMicros != 5_000_000 || ct.GrantedMicros != 2_000_000 || ct.SpentMicros != 1500 || ct.Balance() != 6_998_500 {
		t.Fatalf("credits %+v, %v", ct, err)
	}
	bal, err := db.Balances(ctx)
	if err != nil || bal["acct_1"] != ct.Balance() {
		t.Fatalf("balances %v, %v", bal, err)
	}

	al := store.Alert{ID: "al1", Account: "acct_1", Severity: "high", Kind: "quota", Message: "m", DedupeKey: "q", CreatedAt: now}
	if ok, err := db.CreateAlert(ctx, al); !ok || err != nil {
		t.Fatalf("create alert %v %v", ok, err)
	}
	al.ID = "al2"
	if ok, err := db.CreateAlert(ctx, al); ok || err != nil {
		t.Fatalf("a second alert of one dedupe key was stored: %v %v", ok, err)
	}
	if _, err := db.AckAlert(ctx, "acct_2", "al1", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another account acknowledged it: %v", err)
	}
	got, err := db.AckAlert(ctx, "acct_1", "al1", now)
	if err != nil || got.AcknowledgedAt == nil {
		t.Fatalf("ack %+v %v", got, err)
	}
	if l, err := db.ListAlerts(ctx, "acct_1", true); err != nil || len(l) != 0 {
		t.Fatalf("unacknowledged %+v %v", l, err)
	}
}
