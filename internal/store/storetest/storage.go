package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// wantStored fails unless account keeps exactly want.
func wantStored(t *testing.T, s store.Store, account string, want store.Stored) {
	t.Helper()
	got, err := s.Stored(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("%s keeps %+v, want %+v", account, got, want)
	}
}

// add adds one record of size bytes to a.
func add(a *store.Amount, size int64) {
	a.Records++
	a.Bytes += size
}

// testStoredCounts: each account's stored records and bytes follow every
// write and delete, whatever made them (upserts, updates in place,
// retention, a webhook's deletion with its deliveries), and the byte
// counts are store.*Size's.
func testStoredCounts(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now().Add(-time.Hour)
	var want, other store.Stored

	sb := store.Sandbox{ID: "sb-a", Owner: "acct-a", Template: "python", State: store.SandboxRunning, CreatedAt: at,
		ExpiresAt: at.Add(time.Hour), Metadata: json.RawMessage(`{"k":"v"}`)}
	mustNil(t, s.PutSandbox(ctx, sb))
	add(&want.Sandboxes, store.SandboxSize(sb))
	wantStored(t, s, "acct-a", want)
	// Written again (a new policy, in place): one record, its new size.
	sb.Policy = json.RawMessage(`{"network":{"mode":"none"}}`)
	mustNil(t, s.PutSandbox(ctx, sb))
	want.Sandboxes = store.Amount{Records: 1, Bytes: store.SandboxSize(sb)}
	wantStored(t, s, "acct-a", want)
	mustNil(t, s.StopSandbox(ctx, "sb-a", "killed", at.Add(time.Minute)))
	sb.State, sb.StopReason = store.SandboxStopped, "killed"
	want.Sandboxes = store.Amount{Records: 1, Bytes: store.SandboxSize(sb)}
	wantStored(t, s, "acct-a", want)
	sbB := store.Sandbox{ID: "sb-b", Owner: "acct-b", Template: "python", State: store.SandboxRunning, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	mustNil(t, s.PutSandbox(ctx, sbB))
	add(&other.Sandboxes, store.SandboxSize(sbB))

	// An execution recorded as it starts, then as it ends with its
	// output: one record, its last size.
	ex := store.Execution{ID: "exe-1", SandboxID: "sb-a", Owner: "acct-a", Language: "python", Status: store.ExecutionRunning,
		CreatedAt: at, Code: "print('é')"}
	mustNil(t, s.AddExecution(ctx, ex))
	ex.Status, ex.Output = "success", json.RawMessage(`{"stdout":"é\n"}`)
	mustNil(t, s.AddExecution(ctx, ex))
	add(&want.Executions, store.ExecutionSize(ex))
	wantStored(t, s, "acct-a", want)

	evs := []store.Event{
		{Time: at, Type: "sandbox.created", SandboxID: "sb-a", Owner: "acct-a"},
		{Time: at, Type: "security_violation", Source: "gateway", SandboxID: "sb-a", Owner: "acct-a", ExecutionID: "exe-1",
			Details: json.RawMessage(`{"kind":"dns_denied","target":"x.example"}`)},
		{Time: at, Type: "sandbox.created", SandboxID: "sb-b", Owner: "acct-b"},
	}
	mustNil(t, s.AddEvents(ctx, evs))
	add(&want.Events, store.EventSize(evs[0]))
	add(&want.Events, store.EventSize(evs[1]))
	add(&other.Events, store.EventSize(evs[2]))
	wantStored(t, s, "acct-a", want)
	wantStored(t, s, "acct-b", other)

	al := store.Alert{ID: "alert-1", Account: "acct-a", Severity: "high", Kind: "manual", Message: "look", DedupeKey: "k", CreatedAt: at}
	if ok, err := s.CreateAlert(ctx, al); err != nil || !ok {
		t.Fatalf("CreateAlert = %v, %v", ok, err)
	}
	if ok, err := s.CreateAlert(ctx, store.Alert{ID: "alert-2", Account: "acct-a", Severity: "high", Kind: "manual",
		Message: "again", DedupeKey: "k", CreatedAt: at}); err != nil || ok {
		t.Fatalf("CreateAlert of a taken dedupe key = %v, %v", ok, err)
	}
	if _, err := s.AckAlert(ctx, "acct-a", "alert-1", at); err != nil {
		t.Fatal(err)
	}
	add(&want.Alerts, store.AlertSize(al))
	wantStored(t, s, "acct-a", want)

	mustNil(t, s.CreateWebhook(ctx, store.Webhook{ID: "wh-a", Owner: "acct-a", URL: "https://a.example/", Secret: "s", CreatedAt: at}))
	d := store.WebhookDelivery{WebhookID: "wh-a", EventID: evs[0].ID, EventType: "sandbox.created", Attempt: 1, Error: "not delivered", Time: at}
	mustNil(t, s.AddDelivery(ctx, d))
	mustNil(t, s.AddDelivery(ctx, d))
	add(&want.Deliveries, store.DeliverySize(d, "acct-a"))
	add(&want.Deliveries, store.DeliverySize(d, "acct-a"))
	wantStored(t, s, "acct-a", want)
	if err := s.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-gone", EventID: 1, EventType: "x", Attempt: 1, Time: at}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a delivery of no webhook: %v, want ErrNotFound", err)
	}

	all, err := s.StoredAll(ctx)
	if err != nil || len(all) != 2 || all["acct-a"] != want || all["acct-b"] != other {
		t.Fatalf("StoredAll = %+v, %v; want acct-a %+v, acct-b %+v", all, err, want, other)
	}
	if tot := want.Total(); tot.Records != 7 {
		t.Fatalf("Total %+v: 7 records", tot)
	}

	// Deletes: a webhook with its deliveries, retention of events, the
	// records of stopped sandboxes with their executions.
	mustNil(t, s.DeleteWebhook(ctx, "acct-a", "wh-a"))
	want.Deliveries = store.Amount{}
	wantStored(t, s, "acct-a", want)
	if _, err := s.DeleteEventsBefore(ctx, at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	want.Events, other.Events = store.Amount{}, store.Amount{}
	wantStored(t, s, "acct-a", want)
	wantStored(t, s, "acct-b", other)
	if _, _, err := s.DeleteStoppedBefore(ctx, now()); err != nil {
		t.Fatal(err)
	}
	want.Sandboxes, want.Executions = store.Amount{}, store.Amount{}
	wantStored(t, s, "acct-a", want)
	wantStored(t, s, "acct-b", other)
}

// testStorageBounds: past a bound an account loses its own oldest
// records of that kind, in the write that took it past; another
// account's records stay; what may not go (running sandboxes, running
// executions, unacknowledged alerts) stays, and a new alert is then
// refused with ErrStorageBound.
func testStorageBounds(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now().Add(-time.Hour)
	s.SetBounds(store.Bounds{
		Events:     store.Amount{Records: 10, Bytes: 100 * 1024},
		Executions: store.Amount{Records: 4},
		Deliveries: store.Amount{Records: 3},
		Sandboxes:  store.Amount{Records: 3},
		Alerts:     store.Amount{Records: 2, Bytes: 4096},
	})

	t.Run("events by count", func(t *testing.T) {
		var ids []int64
		for i := range 5 {
			batch := make([]store.Event, 5)
			for j := range batch {
				batch[j] = store.Event{Time: at, Type: "security_violation", Owner: "ev-a", SandboxID: "sb",
					Details: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i*5+j))}
			}
			batch = append(batch, store.Event{Time: at, Type: "sandbox.created", Owner: "ev-b", SandboxID: "sbb"})
			mustNil(t, s.AddEvents(ctx, batch))
			for _, e := range batch[:5] {
				ids = append(ids, e.ID)
			}
		}
		got, err := s.ListEvents(ctx, store.EventFilter{Owner: "ev-a"})
		if err != nil {
			t.Fatal(err)
		}
		if g, w := eventIDs(got), ids[len(ids)-10:]; !slices.Equal(g, w) {
			t.Fatalf("ev-a keeps events %v, want its newest ten %v", g, w)
		}
		if b, _ := s.ListEvents(ctx, store.EventFilter{Owner: "ev-b"}); len(b) != 5 {
			t.Fatalf("ev-b keeps %d events, want its 5", len(b))
		}
		st, _ := s.Stored(ctx, "ev-a")
		if st.Events.Records != 10 {
			t.Fatalf("ev-a's stored events %+v", st.Events)
		}
	})

	t.Run("events by bytes", func(t *testing.T) {
		big := json.RawMessage(`{"target":"` + strings.Repeat("x", 30*1024) + `"}`)
		var last int64
		for range 6 {
			e := []store.Event{{Time: at, Type: "security_violation", Owner: "ev-big", Details: big}}
			mustNil(t, s.AddEvents(ctx, e))
			last = e[0].ID
			st, err := s.Stored(ctx, "ev-big")
			if err != nil {
				t.Fatal(err)
			}
			if st.Events.Bytes > 100*1024 {
				t.Fatalf("ev-big keeps %+v, past its 100 KiB", st.Events)
			}
		}
		got, _ := s.ListEvents(ctx, store.EventFilter{Owner: "ev-big"})
		if len(got) != 3 || got[2].ID != last {
			t.Fatalf("ev-big keeps %v, want its newest three", eventIDs(got))
		}
	})

	t.Run("executions", func(t *testing.T) {
		mustNil(t, s.PutSandbox(ctx, store.Sandbox{ID: "ex-sb", Owner: "ex-a", Template: "python", State: store.SandboxRunning,
			CreatedAt: at, ExpiresAt: at.Add(time.Hour)}))
		// The first stays running: it may not go.
		mustNil(t, s.AddExecution(ctx, store.Execution{ID: "exe-00", SandboxID: "ex-sb", Owner: "ex-a", Status: store.ExecutionRunning, CreatedAt: at}))
		for i := 1; i <= 8; i++ {
			mustNil(t, s.AddExecution(ctx, store.Execution{ID: fmt.Sprintf("exe-%02d", i), SandboxID: "ex-sb", Owner: "ex-a",
				Status: "success", CreatedAt: at.Add(time.Duration(i) * time.Second), Output: json.RawMessage(`{"stdout":"x"}`)}))
		}
		l, err := s.ListExecutions(ctx, "ex-sb")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range l {
			ids = append(ids, e.ID)
		}
		if want := []string{"exe-00", "exe-06", "exe-07", "exe-08"}; !slices.Equal(ids, want) {
			t.Fatalf("ex-a keeps executions %v, want the running one and the newest %v", ids, want)
		}
	})

	t.Run("deliveries", func(t *testing.T) {
		mustNil(t, s.CreateWebhook(ctx, store.Webhook{ID: "wh-d", Owner: "dl-a", URL: "https://a.example/", Secret: "s", CreatedAt: at}))
		mustNil(t, s.CreateWebhook(ctx, store.Webhook{ID: "wh-e", Owner: "dl-b", URL: "https://b.example/", Secret: "s", CreatedAt: at}))
		for i := 1; i <= 5; i++ {
			mustNil(t, s.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-d", EventID: int64(i), EventType: "x", Attempt: 1, Time: at}))
		}
		mustNil(t, s.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh-e", EventID: 1, EventType: "x", Attempt: 1, Time: at}))
		got, err := s.ListDeliveries(ctx, "wh-d", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var evs []int64
		for _, d := range got {
			evs = append(evs, d.EventID)
		}
		if !slices.Equal(evs, []int64{3, 4, 5}) {
			t.Fatalf("dl-a keeps deliveries of events %v, want its newest [3 4 5]", evs)
		}
		if b, _ := s.ListDeliveries(ctx, "wh-e", 0, 0); len(b) != 1 {
			t.Fatalf("dl-b keeps %d deliveries", len(b))
		}
	})

	t.Run("sandboxes", func(t *testing.T) {
		put := func(id, state string, i int) {
			sb := store.Sandbox{ID: id, Owner: "sb-a", Template: "python", State: state, CreatedAt: at.Add(time.Duration(i) * time.Second),
				ExpiresAt: at.Add(time.Hour)}
			if state == store.SandboxStopped {
				stopped := at.Add(time.Duration(i) * time.Second)
				sb.StoppedAt = &stopped
			}
			mustNil(t, s.PutSandbox(ctx, sb))
		}
		put("run-0", store.SandboxRunning, 0)
		put("stop-1", store.SandboxStopped, 1)
		mustNil(t, s.AddExecution(ctx, store.Execution{ID: "stop-1-exe", SandboxID: "stop-1", Owner: "sb-a", Status: "success", CreatedAt: at}))
		put("stop-2", store.SandboxStopped, 2)
		put("run-3", store.SandboxRunning, 3)
		put("run-4", store.SandboxRunning, 4)
		l, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "sb-a"})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range l {
			ids = append(ids, sb.ID)
		}
		// Past 3 records the stopped ones go, first stopped first, with
		// their executions; running ones stay, even past the bound.
		if want := []string{"run-0", "run-3", "run-4"}; !slices.Equal(ids, want) {
			t.Fatalf("sb-a keeps sandboxes %v, want %v", ids, want)
		}
		if ex, _ := s.ListExecutions(ctx, "stop-1"); len(ex) != 0 {
			t.Fatalf("the executions of a sandbox record that went stayed: %+v", ex)
		}
		put("run-5", store.SandboxRunning, 5)
		if st, _ := s.Stored(ctx, "sb-a"); st.Sandboxes.Records != 4 {
			t.Fatalf("running sandboxes past the bound: %+v", st.Sandboxes)
		}
	})

	t.Run("alerts", func(t *testing.T) {
		alert := func(id, msg string) (bool, error) {
			return s.CreateAlert(ctx, store.Alert{ID: id, Account: "al-a", Severity: "low", Kind: "manual", Message: msg, CreatedAt: at})
		}
		for _, id := range []string{"al-1", "al-2"} {
			if ok, err := alert(id, "m"); err != nil || !ok {
				t.Fatalf("CreateAlert %s = %v, %v", id, ok, err)
			}
		}
		// Both unacknowledged: no room.
		if ok, err := alert("al-3", "m"); !errors.Is(err, store.ErrStorageBound) || ok {
			t.Fatalf("an alert past the bound: %v, %v; want ErrStorageBound", ok, err)
		}
		// Another account's room is its own.
		if ok, err := s.CreateAlert(ctx, store.Alert{ID: "al-b", Account: "al-b", Severity: "low", Kind: "manual", Message: "m", CreatedAt: at}); err != nil || !ok {
			t.Fatalf("another account's alert = %v, %v", ok, err)
		}
		// An acknowledged one makes room.
		if _, err := s.AckAlert(ctx, "al-a", "al-1", at); err != nil {
			t.Fatal(err)
		}
		if ok, err := alert("al-3", "m"); err != nil || !ok {
			t.Fatalf("an alert once one is acknowledged = %v, %v", ok, err)
		}
		l, err := s.ListAlerts(ctx, "al-a", false)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range l {
			ids = append(ids, a.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"al-2", "al-3"}) {
			t.Fatalf("al-a keeps alerts %v", ids)
		}
		// Past the bytes, too.
		if _, err := s.AckAlert(ctx, "al-a", "al-2", at); err != nil {
			t.Fatal(err)
		}
		if ok, err := alert("al-4", strings.Repeat("y", 5000)); !errors.Is(err, store.ErrStorageBound) || ok {
			t.Fatalf("an alert larger than the bound: %v, %v; want ErrStorageBound", ok, err)
		}
	})

	t.Run("unbounded", func(t *testing.T) {
		s.SetBounds(store.Bounds{})
		for i := range 30 {
			mustNil(t, s.AddEvents(ctx, []store.Event{{Time: at, Type: "x", Owner: "ev-free", Details: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}}))
		}
		if st, _ := s.Stored(ctx, "ev-free"); st.Events.Records != 30 {
			t.Fatalf("without bounds: %+v", st.Events)
		}
	})
}

// testClearStopped: the code and output of a stopped sandbox's
// executions go after their retention, their records stay; a running
// sandbox's stay whole.
func testClearStopped(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now().Add(-2 * time.Hour)
	for _, id := range []string{"stopped", "running"} {
		mustNil(t, s.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "acct", Template: "python", State: store.SandboxRunning,
			CreatedAt: at, ExpiresAt: at.Add(3 * time.Hour)}))
		mustNil(t, s.AddExecution(ctx, store.Execution{ID: id + "-exe", SandboxID: id, Owner: "acct", Status: "success",
			CreatedAt: at, Code: "print(1)", Output: json.RawMessage(`{"stdout":"1\n"}`)}))
	}
	mustNil(t, s.StopSandbox(ctx, "stopped", "killed", at.Add(time.Minute)))
	before, _ := s.Stored(ctx, "acct")
	n, err := s.ClearStoppedBefore(ctx, at.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("ClearStoppedBefore = %d, %v; want 1", n, err)
	}
	l, _ := s.ListExecutions(ctx, "stopped")
	if len(l) != 1 || l[0].Code != "" || l[0].Output != nil || l[0].Status != "success" {
		t.Fatalf("a stopped sandbox's execution after its retention: %+v", l)
	}
	l, _ = s.ListExecutions(ctx, "running")
	if len(l) != 1 || l[0].Code != "print(1)" || l[0].Output == nil {
		t.Fatalf("a running sandbox's execution: %+v", l)
	}
	after, _ := s.Stored(ctx, "acct")
	if gone := before.Executions.Bytes - after.Executions.Bytes; gone != int64(len("print(1)")+len(`{"stdout":"1\n"}`)) ||
		after.Executions.Records != 2 {
		t.Fatalf("stored executions %+v, then %+v", before.Executions, after.Executions)
	}
	if n, err := s.ClearStoppedBefore(ctx, at.Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("ClearStoppedBefore again = %d, %v; want 0", n, err)
	}
}

// testStorageMeter: MeterStorage charges an account what it keeps over
// the time since it was last metered: nothing the first time, each
// second once when meterings race (as replicas sharing the store do), at
// most MaxStorageSpan after a pause, never a span backwards; the
// GB-seconds go to the hour of the metering, and StorageUsage reads them
// back.
func testStorageMeter(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now().Truncate(time.Hour).Add(-5*time.Hour + 30*time.Minute)
	sb := store.Sandbox{ID: "sb-m", Owner: "acct-m", Template: "python", State: store.SandboxRunning, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	mustNil(t, s.PutSandbox(ctx, sb))
	kept, err := s.Stored(ctx, "acct-m")
	mustNil(t, err)
	bytes := kept.Total().Bytes
	gb := func(seconds float64) float64 { return float64(bytes) / (1 << 30) * seconds }
	charged := func(cs []store.StorageCharge) (seconds float64) {
		for _, c := range cs {
			if c.Account != "acct-m" || c.Bytes != bytes || c.GBSeconds != gb(c.Seconds) {
				t.Fatalf("a charge %+v, want acct-m's %d bytes", c, bytes)
			}
			seconds += c.Seconds
		}
		return seconds
	}
	meter := func(at time.Time) float64 {
		t.Helper()
		cs, err := s.MeterStorage(ctx, at)
		mustNil(t, err)
		return charged(cs)
	}
	if got := meter(t0); got != 0 {
		t.Fatalf("the first metering charged %v s", got)
	}
	if got := meter(t0.Add(10 * time.Second)); got != 10 {
		t.Fatalf("10 s later: %v s charged", got)
	}
	// Two meterings at once of the same moment: 30 s between them.
	got := make(chan float64, 2)
	for range 2 {
		go func() {
			cs, err := s.MeterStorage(ctx, t0.Add(40*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- charged(cs)
		}()
	}
	if sum := <-got + <-got; sum != 30 {
		t.Fatalf("two meterings at once charged %v s, want 30", sum)
	}
	// A clock behind the point charges nothing and leaves it.
	if got := meter(t0.Add(20 * time.Second)); got != 0 {
		t.Fatalf("a metering before the point charged %v s", got)
	}
	// After three hours without one: MaxStorageSpan, in that hour.
	late := t0.Add(40*time.Second + 3*time.Hour)
	if got := meter(late); got != store.MaxStorageSpan.Seconds() {
		t.Fatalf("after 3 h: %v s charged, want %v", got, store.MaxStorageSpan.Seconds())
	}
	hours, err := s.StorageUsage(ctx, "acct-m", time.Time{}, time.Time{})
	mustNil(t, err)
	want := []store.StorageHour{{Hour: t0.Truncate(time.Hour).UTC(), GBSeconds: gb(40)}, {Hour: late.Truncate(time.Hour).UTC(), GBSeconds: gb(3600)}}
	if len(hours) != 2 || !hours[0].Hour.Equal(want[0].Hour) || !hours[1].Hour.Equal(want[1].Hour) ||
		math.Abs(hours[0].GBSeconds-want[0].GBSeconds) > 1e-12 || math.Abs(hours[1].GBSeconds-want[1].GBSeconds) > 1e-12 {
		t.Fatalf("storage usage %+v, want %+v", hours, want)
	}
	if hours, err := s.StorageUsage(ctx, "acct-m", late.Truncate(time.Hour), time.Time{}); err != nil || len(hours) != 1 {
		t.Fatalf("storage usage from the late hour: %+v %v", hours, err)
	}
	if hours, err := s.StorageUsage(ctx, "acct-other", time.Time{}, time.Time{}); err != nil || len(hours) != 0 {
		t.Fatalf("another account's storage usage: %+v %v", hours, err)
	}
}
