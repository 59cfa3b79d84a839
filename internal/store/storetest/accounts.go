package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func testAccounts(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	a := store.Account{ID: "acct_1", Name: "team", CreatedAt: now}
	k := store.Key{ID: "key_1", Hash: "h", Role: store.RoleAdmin, CreatedAt: now}
	if err := s.CreateAccountKey(ctx, a, k, 5_000_000); err != nil {
		t.Fatal(err)
	}
	// A second key of the account: no second free credits.
	if err := s.CreateAccountKey(ctx, a, store.Key{ID: "key_2", Hash: "h2", CreatedAt: now}, 5_000_000); err != nil {
		t.Fatal(err)
	}
	if ct, err := s.CreditTotals(ctx, "acct_1"); err != nil || ct.FreeMicros != 5_000_000 {
		t.Fatalf("free credits after two keys: %+v, %v", ct, err)
	}
	if got, err := s.KeyByHash(ctx, "h2"); err != nil || got.Owner != "acct_1" || got.Role != store.RoleUser {
		t.Fatalf("second key %+v, %v", got, err)
	}
	// A key whose hash is taken fails and creates no account.
	err := s.CreateAccountKey(ctx, store.Account{ID: "acct_3", Name: "three", CreatedAt: now}, store.Key{ID: "key_3", Hash: "h", CreatedAt: now}, 1)
	if err == nil {
		t.Fatal("a taken hash was accepted")
	}
	if _, err := s.Account(ctx, "acct_3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed CreateAccountKey left its account: %v", err)
	}
	if err := s.CreateAccount(ctx, store.Account{ID: "acct_2", Name: "team", CreatedAt: now}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if err := s.CreateAccount(ctx, store.Account{ID: "acct_1", Name: "other", CreatedAt: now}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a taken id: %v", err)
	}
	if got, err := s.KeyByHash(ctx, "h"); err != nil || got.Owner != "acct_1" || got.Role != store.RoleAdmin {
		t.Fatalf("key %+v, %v", got, err)
	}
	if got, err := s.AccountByName(ctx, "team"); err != nil || got.ID != "acct_1" || !got.CreatedAt.Equal(now) || string(got.Limits) != `{}` {
		t.Fatalf("by name %+v, %v", got, err)
	}
	if _, err := s.AccountByName(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := s.Account(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if err := s.SetAccountLimits(ctx, "nope", []byte(`{}`)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("limits of an unknown account: %v", err)
	}
	limits := json.RawMessage(`{"max_sandboxes":3}`)
	if err := s.SetAccountLimits(ctx, "acct_1", limits); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Account(ctx, "acct_1"); string(got.Limits) != string(limits) {
		t.Fatalf("limits %s, want %s", got.Limits, limits)
	}
	// The default runtime: none at first, then set and locked, read
	// back by id, by name and in the list; unlocked and cleared again.
	if got, _ := s.Account(ctx, "acct_1"); got.Runtime != "" || got.RuntimeLocked {
		t.Fatalf("a new account's runtime: %q locked %v", got.Runtime, got.RuntimeLocked)
	}
	if err := s.SetAccountRuntime(ctx, "nope", "gvisor", true); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("runtime of an unknown account: %v", err)
	}
	mustNil(t, s.SetAccountRuntime(ctx, "acct_1", "gvisor", true))
	if got, _ := s.Account(ctx, "acct_1"); got.Runtime != "gvisor" || !got.RuntimeLocked || string(got.Limits) != string(limits) {
		t.Fatalf("runtime set: %+v", got)
	}
	if got, _ := s.AccountByName(ctx, "team"); got.Runtime != "gvisor" || !got.RuntimeLocked {
		t.Fatalf("runtime by name: %+v", got)
	}
	if l, _ := s.ListAccounts(ctx); len(l) != 1 || l[0].Runtime != "gvisor" || !l[0].RuntimeLocked {
		t.Fatalf("runtime listed: %+v", l)
	}
	mustNil(t, s.SetAccountRuntime(ctx, "acct_1", "", false))
	if got, _ := s.Account(ctx, "acct_1"); got.Runtime != "" || got.RuntimeLocked {
		t.Fatalf("runtime cleared: %+v", got)
	}
	if err := s.CreateAccount(ctx, store.Account{ID: "acct_0", Name: "zero", CreatedAt: now.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListAccounts(ctx)
	if err != nil || len(l) != 2 || l[0].ID != "acct_0" || l[1].ID != "acct_1" {
		t.Fatalf("ListAccounts (oldest first) = %+v, %v", l, err)
	}
}

func testUsageLedgerAlerts(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	mustNil(t, s.CreateAccount(ctx, store.Account{ID: "acct_1", Name: "team", CreatedAt: now}))
	mustNil(t, s.AddLedger(ctx, store.LedgerEntry{Account: "acct_1", CreatedAt: now, Kind: store.LedgerFree, AmountMicros: 5_000_000}))

	h1 := now.Truncate(time.Hour)
	h2 := h1.Add(time.Hour)
	d := func(sb, tmpl string, h time.Time, cpu int64) store.UsageDelta {
		return store.UsageDelta{SandboxID: sb, Account: "acct_1", Template: tmpl, Hour: h, WallNanos: 1e9, CPUNanos: cpu,
			GBSecondsReserved: 0.5, GBSecondsUsed: 0.25, DiskPeakBytes: cpu, Executions: 1, Commands: 2, EgressRequests: 3,
			EgressBytesIn: 4000, EgressBytesOut: 500, PausedGBSeconds: 0.125, DeviceSeconds: 1.5}
	}
	// The same bucket twice adds up; the disk peak keeps the larger.
	if err := s.AddUsage(ctx, []store.UsageDelta{d("sb1", "python", h1, 100), d("sb2", "node", h2, 50)},
		[]store.LedgerEntry{{Account: "acct_1", CreatedAt: now, Kind: store.LedgerUsage, AmountMicros: -1500}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, []store.UsageDelta{d("sb1", "python", h1, 300)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, nil, nil); err != nil {
		t.Fatalf("nothing to add: %v", err)
	}
	rows, err := s.QueryUsage(ctx, store.UsageFilter{Account: "acct_1", GroupBy: store.GroupSandbox})
	if err != nil || len(rows) != 2 {
		t.Fatalf("by sandbox %+v, %v", rows, err)
	}
	if r := rows[0]; r.Key != "sb1" || r.SandboxID != "sb1" || r.Account != "acct_1" || r.CPUNanos != 400 || r.WallNanos != 2e9 ||
		r.DiskPeakBytes != 300 || r.Executions != 2 || r.Template != "python" || r.Commands != 4 || r.EgressRequests != 6 ||
		r.EgressBytesIn != 8000 || r.EgressBytesOut != 1000 || r.PausedGBSeconds != 0.25 || r.DeviceSeconds != 3 ||
		r.GBSecondsReserved != 1 || r.GBSecondsUsed != 0.5 {
		t.Fatalf("sb1 %+v", r)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{Account: "acct_1", From: h2, GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 50 {
		t.Fatalf("from the second hour %+v, %v", rows, err)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{Account: "other", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 0 {
		t.Fatalf("another account's usage %+v, %v", rows, err)
	}
	if _, err := s.QueryUsage(ctx, store.UsageFilter{GroupBy: "week"}); err == nil {
		t.Fatal("an unknown grouping was accepted")
	}

	if err := s.AddLedger(ctx, store.LedgerEntry{Account: "acct_1", CreatedAt: now, Kind: store.LedgerGrant, AmountMicros: 2_000_000}); err != nil {
		t.Fatal(err)
	}
	ct, err := s.CreditTotals(ctx, "acct_1")
	if err != nil || ct.FreeMicros != 5_000_000 || ct.GrantedMicros != 2_000_000 || ct.SpentMicros != 1500 || ct.Balance() != 6_998_500 {
		t.Fatalf("credits %+v, %v", ct, err)
	}
	if ct, err := s.CreditTotals(ctx, "nobody"); err != nil || ct != (store.CreditTotals{}) {
		t.Fatalf("credits of an account without a ledger: %+v, %v", ct, err)
	}
	mustNil(t, s.AddLedger(ctx, store.LedgerEntry{Account: "acct_2", CreatedAt: now, Kind: store.LedgerGrant, AmountMicros: 7}))
	bal, err := s.Balances(ctx)
	if err != nil || len(bal) != 2 || bal["acct_1"] != ct.Balance() || bal["acct_2"] != 7 {
		t.Fatalf("balances %v, %v", bal, err)
	}

	al := store.Alert{ID: "al1", Account: "acct_1", Severity: "high", Kind: "quota", Message: "m", SandboxID: "sb1",
		DedupeKey: "q", CreatedAt: now}
	if ok, err := s.CreateAlert(ctx, al); !ok || err != nil {
		t.Fatalf("create alert %v %v", ok, err)
	}
	al.ID = "al2"
	if ok, err := s.CreateAlert(ctx, al); ok || err != nil {
		t.Fatalf("a second alert of one dedupe key was stored: %v %v", ok, err)
	}
	// Alerts without a dedupe key are all kept.
	for _, id := range []string{"al3", "al4"} {
		if ok, err := s.CreateAlert(ctx, store.Alert{ID: id, Account: "acct_1", Severity: "low", Kind: "k", Message: id,
			CreatedAt: now.Add(time.Second)}); !ok || err != nil {
			t.Fatalf("create alert %s: %v %v", id, ok, err)
		}
	}
	if _, err := s.AckAlert(ctx, "acct_2", "al1", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another account acknowledged it: %v", err)
	}
	got, err := s.AckAlert(ctx, "acct_1", "al1", now)
	if err != nil || got.AcknowledgedAt == nil || !got.AcknowledgedAt.Equal(now) || got.DedupeKey != "q" || got.SandboxID != "sb1" {
		t.Fatalf("ack %+v %v", got, err)
	}
	if got, _ := s.AckAlert(ctx, "acct_1", "al1", now.Add(time.Hour)); got.AcknowledgedAt == nil || !got.AcknowledgedAt.Equal(now) {
		t.Fatalf("a second ack moved the time: %+v", got)
	}
	l, err := s.ListAlerts(ctx, "acct_1", true)
	if err != nil || len(l) != 2 || l[0].ID != "al4" || l[1].ID != "al3" || l[0].DedupeKey != "" {
		t.Fatalf("unacknowledged (newest first) %+v %v", l, err)
	}
	if l, _ := s.ListAlerts(ctx, "acct_1", false); len(l) != 3 || l[2].ID != "al1" {
		t.Fatalf("every alert %+v", l)
	}
}

// testUsageGroups: hours and days group by UTC and are keyed as RFC 3339
// (hours) and dates (days); a group by template sums its sandboxes.
func testUsageGroups(t *testing.T, s store.Store) {
	ctx := context.Background()
	day := time.Date(2026, 2, 3, 0, 0, 0, 0, time.UTC)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	zone := time.FixedZone("UTC-3", -3*3600)
	deltas := []store.UsageDelta{
		{SandboxID: "a", Account: "x", Template: "python", Hour: h(1), CPUNanos: 1},
		// Not an hour's start, and not in UTC: the bucket is h(1).
		{SandboxID: "a", Account: "x", Template: "python", Hour: h(1).Add(30 * time.Minute).In(zone), CPUNanos: 2},
		{SandboxID: "b", Account: "x", Template: "python", Hour: h(2), CPUNanos: 4},
		{SandboxID: "c", Account: "y", Template: "node", Hour: h(25), CPUNanos: 8},
	}
	mustNil(t, s.AddUsage(ctx, deltas, nil))
	rows, err := s.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupHour})
	if err != nil || len(rows) != 3 {
		t.Fatalf("by hour %+v, %v", rows, err)
	}
	if rows[0].Key != "2026-02-03T01:00:00.000000000Z" || !rows[0].Hour.Equal(h(1)) || rows[0].CPUNanos != 3 ||
		!rows[2].Hour.Equal(h(25)) || rows[2].CPUNanos != 8 {
		t.Fatalf("by hour %+v", rows)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupDay})
	if err != nil || len(rows) != 2 || rows[0].Key != "2026-02-03" || rows[0].CPUNanos != 7 || rows[1].Key != "2026-02-04" {
		t.Fatalf("by day %+v, %v", rows, err)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupTemplate, From: h(0), To: h(24)})
	if err != nil || len(rows) != 1 || rows[0].Key != "python" || rows[0].CPUNanos != 7 {
		t.Fatalf("by template in the first day %+v, %v", rows, err)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupAccount})
	if err != nil || len(rows) != 2 || rows[0].Key != "x" || rows[1].Key != "y" || rows[1].CPUNanos != 8 {
		t.Fatalf("by account %+v, %v", rows, err)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{SandboxID: "b", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 4 {
		t.Fatalf("sandbox b %+v, %v", rows, err)
	}
}

func testTokensAndSessions(t *testing.T, s store.Store) {
	ctx := context.Background()
	hour := time.Date(2026, 2, 3, 4, 0, 0, 0, time.UTC)
	d := func(acct, model string, h time.Time, n int64) store.TokenDelta {
		return store.TokenDelta{Account: acct, Model: model, Hour: h, Requests: 1, PromptTokens: n, CompletionTokens: 2 * n, CostMicros: 0.5}
	}
	mustNil(t, s.AddTokenUsage(ctx, []store.TokenDelta{
		d("a", "gpt", hour, 10),
		d("a", "gpt", hour.Add(20*time.Minute), 5), // the same hour's bucket
		d("a", "claude", hour.Add(time.Hour), 1),
		d("b", "gpt", hour, 100),
	}))
	mustNil(t, s.AddTokenUsage(ctx, nil))
	got, err := s.QueryTokenUsage(ctx, store.TokenFilter{Account: "a"})
	if err != nil || len(got) != 2 || got[0].Model != "claude" || got[1].Model != "gpt" {
		t.Fatalf("tokens of a (by model) %+v, %v", got, err)
	}
	if g := got[1]; g.Account != "a" || g.Requests != 2 || g.PromptTokens != 15 || g.CompletionTokens != 30 || g.CostMicros != 1 || !g.Hour.IsZero() {
		t.Fatalf("gpt of a %+v", g)
	}
	got, err = s.QueryTokenUsage(ctx, store.TokenFilter{Model: "gpt", From: hour, To: hour.Add(time.Hour)})
	if err != nil || len(got) != 2 || got[0].Account != "a" || got[1].Account != "b" || got[1].PromptTokens != 100 {
		t.Fatalf("gpt in the first hour %+v, %v", got, err)
	}
	if got, err := s.QueryTokenUsage(ctx, store.TokenFilter{From: hour.Add(time.Hour)}); err != nil || len(got) != 1 || got[0].Model != "claude" {
		t.Fatalf("from the second hour %+v, %v", got, err)
	}
	if got, err := s.QueryTokenUsage(ctx, store.TokenFilter{Account: "nobody"}); err != nil || len(got) != 0 {
		t.Fatalf("nobody's tokens %+v, %v", got, err)
	}

	now := now()
	sess := store.Session{ID: "sb1", Owner: "a", Model: "gpt", CreatedAt: now}
	mustNil(t, s.PutSession(ctx, sess))
	if got, err := s.GetSession(ctx, "sb1"); err != nil || got != (store.Session{ID: "sb1", Owner: "a", Model: "gpt", CreatedAt: got.CreatedAt}) ||
		!got.CreatedAt.Equal(now) {
		t.Fatalf("session %+v, %v", got, err)
	}
	if _, err := s.GetSession(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
}

// testLedgerSumsSaturate: an account's ledger sums never fail, however
// large its entries: a sum past int64's ends stops at them (a grant of
// 9,999,999,999,999 once wrapped and then broke the SQL sum, which
// stopped the balances of every account). The server bounds each amount
// (internal/bound); the store holds whatever it is given.
func testLedgerSumsSaturate(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	add := func(acct, kind string, micros int64) {
		t.Helper()
		mustNil(t, s.AddLedger(ctx, store.LedgerEntry{Account: acct, CreatedAt: now, Kind: kind, AmountMicros: micros}))
	}
	// acct_max: grants far past int64; acct_min: usage far below it;
	// acct_ok: a fair balance beside them, summed exactly.
	for range 3 {
		add("acct_max", store.LedgerGrant, math.MaxInt64)
		add("acct_max", store.LedgerFree, math.MaxInt64)
		add("acct_min", store.LedgerUsage, math.MinInt64)
	}
	add("acct_min", store.LedgerGrant, 5)
	add("acct_ok", store.LedgerGrant, 1_000_000_000_000_000)
	add("acct_ok", store.LedgerUsage, -999_999)
	add("acct_ok", store.LedgerUsage, -1)

	ct, err := s.CreditTotals(ctx, "acct_max")
	if err != nil || ct.GrantedMicros != math.MaxInt64 || ct.FreeMicros != math.MaxInt64 || ct.Balance() != math.MaxInt64 {
		t.Fatalf("grants past int64: %+v (balance %d), %v", ct, ct.Balance(), err)
	}
	ct, err = s.CreditTotals(ctx, "acct_min")
	if err != nil || ct.SpentMicros != math.MaxInt64 || ct.GrantedMicros != 5 || ct.Balance() != math.MinInt64+6 {
		t.Fatalf("usage past int64: %+v (balance %d), %v", ct, ct.Balance(), err)
	}
	ct, err = s.CreditTotals(ctx, "acct_ok")
	if err != nil || ct.GrantedMicros != 1_000_000_000_000_000 || ct.SpentMicros != 1_000_000 || ct.Balance() != 999_999_999_000_000 {
		t.Fatalf("a fair account beside them: %+v, %v", ct, err)
	}
	bal, err := s.Balances(ctx)
	if err != nil || bal["acct_max"] != math.MaxInt64 || bal["acct_min"] != math.MinInt64 || bal["acct_ok"] != 999_999_999_000_000 {
		t.Fatalf("balances %v, %v", bal, err)
	}

	// Usage sums the same way: an account's seconds over many sandboxes
	// and hours stop at int64's end, and a fair sum stays exact.
	h := now.Truncate(time.Hour)
	var deltas []store.UsageDelta
	for i := range 3 {
		deltas = append(deltas, store.UsageDelta{SandboxID: fmt.Sprint("sb", i), Account: "acct_max", Template: "python", Hour: h,
			WallNanos: math.MaxInt64, CPUNanos: math.MaxInt64 - 1})
	}
	deltas = append(deltas, store.UsageDelta{SandboxID: "sb9", Account: "acct_ok", Template: "python", Hour: h,
		WallNanos: 3_600_000_000_001, CPUNanos: 1_999_999_999})
	mustNil(t, s.AddUsage(ctx, deltas, nil))
	rows, err := s.QueryUsage(ctx, store.UsageFilter{Account: "acct_max", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].WallNanos != math.MaxInt64 || rows[0].CPUNanos != math.MaxInt64 {
		t.Fatalf("usage past int64: %+v, %v", rows, err)
	}
	rows, err = s.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupAccount})
	if err != nil || len(rows) != 2 || rows[1].Key != "acct_ok" || rows[1].WallNanos != 3_600_000_000_001 || rows[1].CPUNanos != 1_999_999_999 {
		t.Fatalf("usage by account: %+v, %v", rows, err)
	}
}
