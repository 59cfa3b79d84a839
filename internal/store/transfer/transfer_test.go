package transfer_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/store/transfer"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }

// now is the present to the microsecond (what PostgreSQL keeps), UTC.
var now = time.Now().UTC().Truncate(time.Microsecond)

// code is an execution's code with what text columns cannot all hold: a
// NUL (JSON's \u0000) and non-ASCII.
const code = "print('a\x00b')  # é ✓"

// populate fills every table of a SQLite store through its API. Each
// table must get rows here (TestCopy checks), so that its copy is
// checked.
func populate(t *testing.T, ctx context.Context, st store.Store) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	hour := now.Truncate(time.Hour)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)

	// accounts, keys, the free credits in credit_ledger.
	must(st.CreateAccountKey(ctx, store.Account{ID: "acct-a", Name: "alpha", CreatedAt: now.Add(-48 * time.Hour)},
		store.Key{ID: "key-a", Name: "ci", Hash: strings.Repeat("a", 64), CreatedAt: now.Add(-48 * time.Hour)}, 5_000_000))
	must(st.CreateAccount(ctx, store.Account{ID: "acct-b", Name: "beta", CreatedAt: now.Add(-24 * time.Hour),
		Limits: json.RawMessage(`{"max_sandboxes":3}`)}))
	must(st.CreateKey(ctx, store.Key{ID: "key-b", Owner: "acct-b", Role: store.RoleAdmin, Hash: strings.Repeat("b", 64), CreatedAt: now.Add(-23 * time.Hour)}))
	must(st.CreateKey(ctx, store.Key{ID: "key-c", Owner: "acct-b", Hash: strings.Repeat("c", 64), CreatedAt: now.Add(-22 * time.Hour)}))
	must(st.RevokeKey(ctx, "key-c", now.Add(-time.Hour)))

	// sandboxes: one running, one stopped; executions with code and output.
	must(st.PutSandbox(ctx, store.Sandbox{ID: "sb-1", Owner: "acct-a", Template: "python", State: store.SandboxRunning,
		CreatedAt: now.Add(-2 * time.Hour), ExpiresAt: now.Add(time.Hour), Metadata: json.RawMessage(`{"team":"x"}`),
		Resources: json.RawMessage(`{"memory_mb":512}`), Policy: json.RawMessage(`{"network_restricted":true}`)}))
	must(st.PutSandbox(ctx, store.Sandbox{ID: "sb-2", Owner: "acct-b", Template: "node", State: store.SandboxRunning,
		CreatedAt: now.Add(-3 * time.Hour), ExpiresAt: now.Add(-time.Hour)}))
	must(st.StopSandbox(ctx, "sb-2", "killed", now.Add(-90*time.Minute)))
	must(st.AddExecution(ctx, store.Execution{ID: "ex-1", SandboxID: "sb-1", Owner: "acct-a", Language: "python", Status: "success",
		ExecutionTimeMS: 12.5, CPUTimeMS: 3.25, PeakMemoryBytes: 1 << 20, CreatedAt: now.Add(-time.Hour), Code: code,
		Output: json.RawMessage(`{"stdout":"a\u0000b\n"}`)}))
	must(st.AddExecution(ctx, store.Execution{ID: "ex-2", SandboxID: "sb-1", Owner: "acct-a", Language: "python",
		Status: store.ExecutionRunning, CreatedAt: now.Add(-30 * time.Minute), Code: "while True: pass", Replica: "replica-a"}))
	must(st.PutSession(ctx, store.Session{ID: "sb-1", Owner: "acct-a", Model: "gpt-x", CreatedAt: now.Add(-2 * time.Hour)}))
	// secrets: one used, one at its second version; sealed bytes with a NUL.
	must(st.CreateSecret(ctx, store.Secret{Owner: "acct-a", Name: "openai", Metadata: json.RawMessage(`{"team":"x"}`), KeyID: "k1",
		Sealed: []byte{0, 1, 2, 0xff}, CreatedAt: now.Add(-2 * time.Hour)}, 10))
	must(st.TouchSecret(ctx, "acct-a", "openai", now.Add(-time.Hour)))
	must(st.CreateSecret(ctx, store.Secret{Owner: "acct-b", Name: "db", KeyID: "k1", Sealed: []byte{9}, CreatedAt: now.Add(-2 * time.Hour)}, 10))
	must(st.UpdateSecret(ctx, "acct-b", "db", 2, "k2", []byte{8, 0}, nil, now.Add(-time.Hour)))
	must(st.RecordSecretUses(ctx, []store.SecretUse{{Owner: "acct-a", Name: "openai", SandboxID: "sb-1", Host: "api.test",
		Method: "POST", Path: "/v1", Outcome: store.SecretInjected, At: now.Add(-time.Hour)}}))

	// volumes.
	must(st.CreateVolume(ctx, store.Volume{Owner: "acct-a", Name: "data", ID: "vol-1", SizeBytes: 64 << 20, CreatedAt: now.Add(-time.Hour)}, 0, 0))
	// snapshots' bytes on a server's disk.
	must(st.SetSnapshotBytes(ctx, "disk-1", "acct-a", 32<<20))

	// batches: one item ended, one pending.
	must(st.CreateBatch(ctx, store.Batch{ID: "bat-1", Owner: "acct-a", Status: store.BatchRunning, Template: "python", Language: "python",
		Code: "def handler(x): return x", Concurrency: 2, TimeoutMS: 1000, CreatedAt: now.Add(-time.Hour)},
		[]json.RawMessage{json.RawMessage(`"a"`), json.RawMessage(`[1]`)}))
	ended := now.Add(-30 * time.Minute)
	if _, err := st.EndBatchItem(ctx, store.BatchItem{BatchID: "bat-1", Index: 0, Status: store.BatchItemDone, Attempts: 1,
		Result: json.RawMessage(`1`), EndedAt: &ended}); err != nil {
		t.Fatal(err)
	}

	// events: the newest one is deleted by retention (its time is old),
	// so SQLite has handed out an id above every row's.
	evs := []store.Event{
		{Time: now.Add(-2 * time.Hour), Type: "sandbox.created", SandboxID: "sb-1", Owner: "acct-a", Details: json.RawMessage(`{"template":"python"}`)},
		{Time: now.Add(-time.Hour), Type: "execution.finished", SandboxID: "sb-1", Owner: "acct-a", ExecutionID: "ex-1"},
		{Time: now.Add(-90 * time.Minute), Type: "sandbox.stopped", SandboxID: "sb-2", Owner: "acct-b"},
		{Time: now.Add(-100 * 24 * time.Hour), Type: "sandbox.created", SandboxID: "sb-0", Owner: "acct-b"},
	}
	must(st.AddEvents(ctx, evs))
	if n, err := st.DeleteEventsBefore(ctx, now.Add(-50*24*time.Hour)); err != nil || n != 1 {
		t.Fatalf("retention deleted %d events (%v), want 1", n, err)
	}

	// webhooks and deliveries.
	must(st.CreateWebhook(ctx, store.Webhook{ID: "wh-1", Owner: "acct-a", URL: "https://example.test/hook", Secret: "s3cret",
		Types: []string{"sandbox.created", "sandbox.stopped"}, CreatedAt: now.Add(-3 * time.Hour)}))
	must(st.CreateWebhook(ctx, store.Webhook{ID: "wh-2", Owner: "acct-b", URL: "https://example.test/all", Secret: "x",
		CreatedAt: now.Add(-3 * time.Hour)}))
	must(st.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-1", EventID: evs[0].ID, EventType: "sandbox.created", Attempt: 1,
		StatusCode: 500, Error: "server error", Time: now.Add(-2 * time.Hour), DurationMS: 20.5}))
	must(st.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-1", EventID: evs[0].ID, EventType: "sandbox.created", Attempt: 2,
		StatusCode: 200, Succeeded: true, Time: now.Add(-119 * time.Minute), DurationMS: 4}))

	// usage, ledger, alerts, tokens.
	must(st.AddUsage(ctx, []store.UsageDelta{
		{SandboxID: "sb-1", Account: "acct-a", Template: "python", Hour: hour, WallNanos: 3e9, CPUNanos: 1e9, GBSecondsReserved: 1.5,
			GBSecondsUsed: 0.25, DiskPeakBytes: 4096, Executions: 2, Commands: 1, EgressRequests: 7},
		{SandboxID: "sb-2", Account: "acct-b", Template: "node", Hour: hour.Add(-time.Hour), WallNanos: 5e9, Executions: 1},
	}, []store.LedgerEntry{{Account: "acct-a", CreatedAt: now, Kind: store.LedgerUsage, AmountMicros: -1234, Reason: "usage"}}))
	must(st.AddLedger(ctx, store.LedgerEntry{Account: "acct-b", CreatedAt: now, Kind: store.LedgerGrant, AmountMicros: 10_000_000, Reason: "welcome"}))
	// Storage metered twice: a point, then an hour's storage.
	for _, at := range []time.Time{now.Add(-time.Hour), now} {
		if _, err := st.MeterStorage(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st.CreateAlert(ctx, store.Alert{ID: "al-1", Account: "acct-a", Severity: "high", Kind: "credits_low",
		Message: "low", DedupeKey: "credits_low", CreatedAt: now.Add(-time.Minute)}); err != nil || !ok {
		t.Fatalf("alert: %v, %v", ok, err)
	}
	if ok, err := st.CreateAlert(ctx, store.Alert{ID: "al-2", Account: "acct-a", Severity: "low", Kind: "security",
		Message: "blocked", SandboxID: "sb-1", SessionID: "sb-1", CreatedAt: now.Add(-2 * time.Minute)}); err != nil || !ok {
		t.Fatalf("alert: %v, %v", ok, err)
	}
	if _, err := st.AckAlert(ctx, "acct-a", "al-2", now); err != nil {
		t.Fatal(err)
	}
	must(st.AddTokenUsage(ctx, []store.TokenDelta{{Account: "acct-a", Model: "gpt-x", Hour: hour, Requests: 3, PromptTokens: 100,
		CompletionTokens: 50, CostMicros: 12.5}}))

	// admission: a live reservation, and this month's count of acct-a
	// (its usage's 2 executions, and 2 counted: 4).
	must(st.ReserveSandbox(ctx, "acct-b", "create-1", 5, now))
	must(st.CountExecution(ctx, "acct-a", month, 100))
	must(st.CountExecution(ctx, "acct-a", month, 100))

	// replicas and meter_leases: replica-a alive for an hour, metering
	// sb-1 for a minute from 5 CPU-seconds.
	must(st.Heartbeat(ctx, "replica-a", now.Add(time.Hour)))
	if _, held, err := st.TakeMeterLease(ctx, store.MeterLease{SandboxID: "sb-1", Replica: "replica-a", Until: now.Add(time.Minute),
		CPUNanos: 5e9, At: now}, now); err != nil || !held {
		t.Fatalf("meter lease: held %v, %v", held, err)
	}

	// rate_buckets: acct-a's requests bucket (3 a minute), emptied.
	for range 3 {
		if r, err := st.TakeRate(ctx, "requests/acct-a", 1, 3, 20*time.Second, now); err != nil || !r.Allowed {
			t.Fatalf("take: %+v, %v", r, err)
		}
	}
}

// records is what a store's API shows of everything populate wrote.
type records struct {
	Keys        []store.Key
	Accounts    []store.Account
	Sandboxes   []store.Sandbox
	Executions  map[string][]store.Execution
	Events      map[string][]store.Event
	Webhooks    []store.Webhook
	Deliveries  map[string][]store.WebhookDelivery
	UsageHours  []store.UsageRow
	UsageByBox  []store.UsageRow
	Balances    map[string]int64
	Credits     map[string]store.CreditTotals
	Alerts      map[string][]store.Alert
	Tokens      []store.TokenDelta
	Session     store.Session
	KeyByHashed store.Key
}

func read(t *testing.T, ctx context.Context, st store.Store) records {
	t.Helper()
	var r records
	var err error
	check := func(what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	r.Keys, err = st.ListKeys(ctx)
	check("keys")
	r.KeyByHashed, err = st.KeyByHash(ctx, strings.Repeat("b", 64))
	check("key by hash")
	r.Accounts, err = st.ListAccounts(ctx)
	check("accounts")
	r.Sandboxes, err = st.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true})
	check("sandboxes")
	r.Executions, r.Events, r.Deliveries = map[string][]store.Execution{}, map[string][]store.Event{}, map[string][]store.WebhookDelivery{}
	r.Credits, r.Alerts = map[string]store.CreditTotals{}, map[string][]store.Alert{}
	for _, sb := range r.Sandboxes {
		r.Executions[sb.ID], err = st.ListExecutions(ctx, sb.ID)
		check("executions")
	}
	for _, a := range r.Accounts {
		r.Events[a.ID], err = st.ListEvents(ctx, store.EventFilter{Owner: a.ID})
		check("events")
		r.Credits[a.ID], err = st.CreditTotals(ctx, a.ID)
		check("credits")
		r.Alerts[a.ID], err = st.ListAlerts(ctx, a.ID, false)
		check("alerts")
	}
	r.Webhooks, err = st.ListWebhooks(ctx, "")
	check("webhooks")
	for i, w := range r.Webhooks {
		if len(w.Types) == 0 {
			r.Webhooks[i].Types = nil // SQLite gives [], PostgreSQL {}: both none
		}
		r.Deliveries[w.ID], err = st.ListDeliveries(ctx, w.ID, 0, 0)
		check("deliveries")
	}
	r.UsageHours, err = st.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupHour})
	check("usage by hour")
	r.UsageByBox, err = st.QueryUsage(ctx, store.UsageFilter{GroupBy: store.GroupSandbox})
	check("usage by sandbox")
	r.Balances, err = st.Balances(ctx)
	check("balances")
	r.Tokens, err = st.QueryTokenUsage(ctx, store.TokenFilter{})
	check("tokens")
	r.Session, err = st.GetSession(ctx, "sb-1")
	check("session")
	return r
}

// newSource makes a populated SQLite database and returns its path and
// what its API shows, closed.
func newSource(t *testing.T) (string, records) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sheepfold.db")
	src, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	populate(t, ctx, src)
	want := read(t, ctx, src)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	return path, want
}

func openPG(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// targetCounts counts the rows of every table of the target but
// schema_migrations.
func targetCounts(t *testing.T, dsn string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'schema_migrations'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		t.Fatalf("tables %v, %v", names, err)
	}
	out := map[string]int64{}
	for _, n := range names {
		var c int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{n}.Sanitize()).Scan(&c); err != nil {
			t.Fatal(err)
		}
		out[n] = c
	}
	return out
}

// sourceCounts counts the rows of every table of a SQLite file, and the
// ids of those with an id that SQLite numbers.
func sourceCounts(t *testing.T, path string) map[string]int64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' AND name <> 'schema_migrations'`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		names = append(names, n)
	}
	rows.Close()
	out := map[string]int64{}
	for _, n := range names {
		var c int64
		if err := db.QueryRow(`SELECT count(*) FROM "` + n + `"`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		out[n] = c
	}
	return out
}

// sqliteIDs and pgIDs list a table's ids in order.
func sqliteIDs(t *testing.T, path, table string) []int64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT id FROM "` + table + `" ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		out = append(out, id)
	}
	return out
}

func pgIDs(t *testing.T, dsn, table string) []int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id FROM `+pgx.Identifier{table}.Sanitize()+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCopy copies a populated SQLite store into PostgreSQL and reads
// everything back through the postgres store.
func TestCopy(t *testing.T) {
	ctx := context.Background()
	path, want := newSource(t)
	dsn := pgtest.New(t)

	copied, err := transfer.Copy(ctx, path, dsn)
	if err != nil {
		t.Fatal(err)
	}

	// Every table has rows in the source, and as many in the target; a
	// table a migration adds fails here until populate fills it.
	src, dst := sourceCounts(t, path), targetCounts(t, dsn)
	if !reflect.DeepEqual(src, dst) {
		t.Fatalf("rows per table: source %v, target %v", src, dst)
	}
	// Each account's stored amounts are not copied but counted again by
	// the target's triggers, to the same figures.
	reported := map[string]int64{"stored": dst["stored"]}
	for _, c := range copied {
		reported[c.Name] = c.Rows
	}
	if !reflect.DeepEqual(reported, dst) {
		t.Fatalf("Copy reported %v, the target has %v", reported, dst)
	}
	for table, n := range dst {
		if n == 0 {
			t.Errorf("table %s has no rows in this test's source: fill it in populate, so that its copy is checked", table)
		}
	}
	// Webhooks before their deliveries (the foreign key).
	order := slices.IndexFunc(copied, func(c transfer.Table) bool { return c.Name == "webhooks" }) <
		slices.IndexFunc(copied, func(c transfer.Table) bool { return c.Name == "webhook_deliveries" })
	if !order {
		t.Errorf("copy order %v: webhook_deliveries before webhooks", copied)
	}
	for _, table := range []string{"events", "webhook_deliveries", "credit_ledger"} {
		if s, d := sqliteIDs(t, path, table), pgIDs(t, dsn, table); !slices.Equal(s, d) || len(s) == 0 {
			t.Errorf("%s ids: source %v, target %v", table, s, d)
		}
	}

	pg := openPG(t, dsn)
	srcStore, err := sqlite.OpenOptions(ctx, path, sqlite.Options{Existing: true})
	if err != nil {
		t.Fatal(err)
	}
	srcStored, err := srcStore.StoredAll(ctx)
	srcStore.Close()
	if err != nil {
		t.Fatal(err)
	}
	if dstStored, err := pg.StoredAll(ctx); err != nil || !reflect.DeepEqual(dstStored, srcStored) || len(srcStored) == 0 {
		t.Errorf("stored amounts: source %+v, target %+v (%v)", srcStored, dstStored, err)
	}
	got := read(t, ctx, pg)
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if g, w := gv.Field(i).Interface(), wv.Field(i).Interface(); !reflect.DeepEqual(g, w) {
			t.Errorf("%s through the postgres store:\n got %+v\nwant %+v", gv.Type().Field(i).Name, g, w)
		}
	}
	if ex := got.Executions["sb-1"]; len(ex) == 0 || ex[0].Code != code {
		t.Errorf("executions %+v: want the first's code %q", ex, code)
	}

	// The admission rows: acct-b's reservation holds its slot, acct-a's
	// month count (4) is the one copied, not one started again from
	// usage (2).
	if err := pg.ReserveSandbox(ctx, "acct-b", "create-2", 1, now); !errors.Is(err, store.ErrLimit) {
		t.Errorf("a reservation at a cap the copied one fills: %v, want ErrLimit", err)
	}
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if err := pg.CountExecution(ctx, "acct-a", month, 4); !errors.Is(err, store.ErrLimit) {
		t.Errorf("count at a quota of 4 after 4 counted: %v, want ErrLimit", err)
	}

	// The meter lease is replica-a's, with its counters; replica-a is
	// alive, so its running execution stays running.
	if l, held, err := pg.TakeMeterLease(ctx, store.MeterLease{SandboxID: "sb-1", Replica: "replica-b", Until: now.Add(time.Minute)}, now); err != nil ||
		held || l.Replica != "replica-a" || l.CPUNanos != 5e9 || !l.At.Equal(now) {
		t.Errorf("the copied lease: %+v, held by b %v, %v", l, held, err)
	}
	if n, err := pg.EndLapsedExecutions(ctx, now, "ERR_INTERNAL", "x"); err != nil || n != 0 {
		t.Errorf("ended %d executions of a live replica, %v", n, err)
	}

	// The rate bucket: acct-a's, empty at now, refuses a fourth take.
	if r, err := pg.TakeRate(ctx, "requests/acct-a", 1, 3, 20*time.Second, now); err != nil || r.Allowed {
		t.Errorf("a take from the copied empty bucket: %+v, %v; want refused", r, err)
	}

	// New rows take ids past the copied ones, and past the event SQLite
	// numbered and retention deleted.
	lastEvent := slices.Max(pgIDs(t, dsn, "events"))
	ev := []store.Event{{Time: now, Type: "sandbox.created", SandboxID: "sb-3", Owner: "acct-a"}}
	if err := pg.AddEvents(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if ev[0].ID != lastEvent+2 {
		t.Errorf("a new event's id %d, want %d (past the deleted %d)", ev[0].ID, lastEvent+2, lastEvent+1)
	}
	if err := pg.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-2", EventID: ev[0].ID, EventType: "sandbox.created", Attempt: 1, Time: now}); err != nil {
		t.Fatalf("a new delivery: %v", err)
	}
	if err := pg.AddLedger(ctx, store.LedgerEntry{Account: "acct-a", CreatedAt: now, Kind: store.LedgerGrant, AmountMicros: 1}); err != nil {
		t.Fatalf("a new ledger entry: %v", err)
	}
	if d, err := pg.ListDeliveries(ctx, "wh-2", 0, 0); err != nil || len(d) != 1 || d[0].ID != slices.Max(sqliteIDs(t, path, "webhook_deliveries"))+1 {
		t.Errorf("the new delivery: %+v, %v", d, err)
	}

	// A second copy into it refuses: it is no longer empty.
	if _, err := transfer.Copy(ctx, path, dsn); !errors.Is(err, transfer.ErrNotEmpty) {
		t.Errorf("a copy into the copied database: %v, want ErrNotEmpty", err)
	}
}

// TestTimes: SQLite's nanoseconds arrive as PostgreSQL's microseconds,
// the instant in UTC.
func TestTimes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	src, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 29, 1, 30, 0, 123456789, time.FixedZone("CEST", 2*3600))
	if err := src.PutSession(ctx, store.Session{ID: "s", Owner: "o", Model: "m", CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	src.Close()
	dsn := pgtest.New(t)
	if _, err := transfer.Copy(ctx, path, dsn); err != nil {
		t.Fatal(err)
	}
	s, err := openPG(t, dsn).GetSession(ctx, "s")
	want := at.UTC().Truncate(time.Microsecond)
	if err != nil || !s.CreatedAt.Equal(want) || s.CreatedAt.Location() != time.UTC {
		t.Fatalf("session created %v (%v), want %v", s.CreatedAt, err, want)
	}
}

// TestRefusals: what Copy refuses, writing nothing.
func TestRefusals(t *testing.T) {
	ctx := context.Background()
	path, _ := newSource(t)

	t.Run("target not empty", func(t *testing.T) {
		dsn := pgtest.New(t)
		pg := openPG(t, dsn)
		if err := pg.CreateKey(ctx, store.Key{ID: "k", Owner: "k", Hash: "h", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		_, err := transfer.Copy(ctx, path, dsn)
		if !errors.Is(err, transfer.ErrNotEmpty) || !strings.Contains(err.Error(), "the target database is not empty (table keys has rows)") {
			t.Fatalf("copy into a database with a key: %v", err)
		}
		if n := targetCounts(t, dsn); n["keys"] != 1 || n["accounts"] != 0 {
			t.Fatalf("after a refused copy: %v", n)
		}
	})

	t.Run("source in use", func(t *testing.T) {
		st, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		dsn := pgtest.New(t)
		if _, err := transfer.Copy(ctx, path, dsn); !errors.Is(err, sqlite.ErrInUse) || !strings.Contains(err.Error(), "stop the server") {
			t.Fatalf("copy of a database open elsewhere: %v", err)
		}
	})

	t.Run("source missing", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "none.db")
		if _, err := transfer.Copy(ctx, missing, pgtest.New(t)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("copy of a missing file: %v", err)
		}
		if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the copy made the source: %v", err)
		}
	})

	// schema: a copy of the source with its schema_migrations changed.
	edited := func(t *testing.T, q string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "edited.db")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite", "file:"+p)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
		return p
	}
	last := sqlite.Versions()[len(sqlite.Versions())-1]
	for _, tc := range []struct{ name, q, hint string }{
		{"source newer", `INSERT INTO schema_migrations VALUES ('9999_future', '2030-01-01T00:00:00.000000000Z')`, "copy with the sheepfold version that made it"},
		{"source older", `DELETE FROM schema_migrations WHERE version = '` + last + `'`, "open it once with this version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pgtest.New(t)
			_, err := transfer.Copy(ctx, edited(t, tc.q), dsn)
			if !errors.Is(err, transfer.ErrSchema) || !strings.Contains(err.Error(), tc.hint) {
				t.Fatalf("copy: %v, want ErrSchema and %q", err, tc.hint)
			}
		})
	}
	t.Run("target newer", func(t *testing.T) {
		dsn := pgtest.New(t)
		openPG(t, dsn).Close()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations VALUES ('9999_future', now())`); err != nil {
			t.Fatal(err)
		}
		if _, err := transfer.Copy(ctx, path, dsn); !errors.Is(err, transfer.ErrSchema) || !strings.Contains(err.Error(), "target") {
			t.Fatalf("copy into a newer target: %v", err)
		}
	})
	t.Run("extra table", func(t *testing.T) {
		p := edited(t, `CREATE TABLE notes (id TEXT PRIMARY KEY)`)
		if _, err := transfer.Copy(ctx, p, pgtest.New(t)); !errors.Is(err, transfer.ErrSchema) || !strings.Contains(err.Error(), "notes") {
			t.Fatalf("copy of a source with a table the target lacks: %v", err)
		}
	})

	// All or nothing: a value PostgreSQL cannot hold, in a table copied
	// after others, fails the copy and leaves the target empty.
	t.Run("all or nothing", func(t *testing.T) {
		p := edited(t, `UPDATE sandboxes SET stop_reason = 'a' || char(0) || 'b' WHERE id = 'sb-2'`)
		dsn := pgtest.New(t)
		_, err := transfer.Copy(ctx, p, dsn)
		if err == nil || !strings.Contains(err.Error(), "sandboxes row 2, column stop_reason") || !strings.Contains(err.Error(), "NUL") {
			t.Fatalf("copy of a NUL in text: %v", err)
		}
		for table, n := range targetCounts(t, dsn) {
			if n != 0 {
				t.Errorf("after a failed copy, %s has %d rows", table, n)
			}
		}
	})
}
