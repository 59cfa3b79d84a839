package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func testKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	k := store.Key{ID: "k1", Name: "ci", Owner: "k1", Hash: "abc", CreatedAt: now}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, store.Key{ID: "k2", Owner: "k2", Hash: "abc", CreatedAt: now}); err == nil {
		t.Fatal("duplicate hash accepted")
	}
	got, err := s.KeyByHash(ctx, "abc")
	if err != nil || got.ID != "k1" || got.Name != "ci" || got.Role != store.RoleUser || !got.CreatedAt.Equal(now) || got.RevokedAt != nil {
		t.Fatalf("KeyByHash = %+v, %v", got, err)
	}
	if got, err := s.KeyByID(ctx, "k1"); err != nil || got.Hash != "abc" {
		t.Fatalf("KeyByID = %+v, %v", got, err)
	}
	if _, err := s.KeyByHash(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing key by hash: %v", err)
	}
	if _, err := s.KeyByID(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing key by id: %v", err)
	}
	if n, _ := s.CountActiveKeys(ctx); n != 1 {
		t.Fatalf("active keys %d", n)
	}
	if err := s.RevokeKey(ctx, "k1", now); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, "k1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, _ = s.KeyByHash(ctx, "abc")
	if got.RevokedAt == nil || !got.RevokedAt.Equal(now) {
		t.Fatalf("revoked_at %v, want the first revocation %v", got.RevokedAt, now)
	}
	if n, _ := s.CountActiveKeys(ctx); n != 0 {
		t.Fatalf("active keys %d after revoke", n)
	}
	if err := s.RevokeKey(ctx, "zz", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if err := s.CreateKey(ctx, store.Key{ID: "k0", Owner: "k0", Hash: "def", Role: store.RoleAdmin, CreatedAt: now.Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListKeys(ctx)
	if err != nil || len(l) != 2 || l[0].ID != "k0" || l[0].Role != store.RoleAdmin || l[1].ID != "k1" {
		t.Fatalf("ListKeys (oldest first) = %+v, %v", l, err)
	}
}

// testTimes: a time comes back as the same instant, to the microsecond,
// in UTC, whatever zone it was written in.
func testTimes(t *testing.T, s store.Store) {
	ctx := context.Background()
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	at := time.Date(2026, 3, 4, 5, 6, 7, 123456000, zone)
	if err := s.PutSandbox(ctx, store.Sandbox{ID: "a", Owner: "o", Template: "python", State: store.SandboxRunning,
		CreatedAt: at, ExpiresAt: at.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(at) || got.CreatedAt.Location() != time.UTC || !got.ExpiresAt.Equal(at.Add(time.Hour)) {
		t.Fatalf("created %v (%v), expires %v; want %v in UTC", got.CreatedAt, got.CreatedAt.Location(), got.ExpiresAt, at)
	}
	// Finer than a microsecond may be lost, never more.
	fine := at.Add(999 * time.Nanosecond)
	if err := s.UpdateSandboxExpiry(ctx, "a", fine); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "a")
	if d := fine.Sub(got.ExpiresAt); d < 0 || d >= time.Microsecond {
		t.Fatalf("expiry %v read back as %v", fine, got.ExpiresAt)
	}
}

func testSandboxesAndRestartMarking(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	for i, id := range []string{"a", "b", "c"} {
		sb := store.Sandbox{ID: id, Owner: "o1", Template: "python", State: store.SandboxRunning,
			CreatedAt: now.Add(time.Duration(i) * time.Second), ExpiresAt: now.Add(time.Hour),
			Metadata: json.RawMessage(`{"k":"v"}`)}
		if id == "c" {
			sb.Owner = "o2"
		}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.StopSandbox(ctx, "a", "killed", now); err != nil {
		t.Fatal(err)
	}
	if err := s.StopSandbox(ctx, "a", "later", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	a, err := s.GetSandbox(ctx, "a")
	if err != nil || a.State != store.SandboxStopped || a.StopReason != "killed" || a.StoppedAt == nil || !a.StoppedAt.Equal(now) ||
		string(a.Metadata) != `{"k":"v"}` || string(a.Resources) != `{}` || a.Policy != nil || a.Template != "python" {
		t.Fatalf("a = %+v, %v", a, err)
	}
	run, _ := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o1", State: store.SandboxRunning})
	if len(run) != 1 || run[0].ID != "b" {
		t.Fatalf("running of o1 = %+v", run)
	}
	all, _ := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o1"})
	if len(all) != 2 || all[0].ID != "a" {
		t.Fatalf("all of o1 = %+v", all)
	}
	if every, err := s.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true, State: store.SandboxRunning}); err != nil ||
		len(every) != 2 || every[0].ID != "b" || every[1].ID != "c" {
		t.Fatalf("running of every owner = %+v, %v", every, err)
	}
	if none, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "nobody"}); err != nil || none == nil || len(none) != 0 {
		t.Fatalf("an owner without sandboxes: %#v, %v (want an empty, non-nil list)", none, err)
	}
	exp := now.Add(2 * time.Hour)
	if err := s.UpdateSandboxExpiry(ctx, "b", exp); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.GetSandbox(ctx, "b"); !b.ExpiresAt.Equal(exp) {
		t.Fatalf("expires %v want %v", b.ExpiresAt, exp)
	}
	if err := s.UpdateSandboxExpiry(ctx, "zz", exp); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("expiry of a missing sandbox: %v", err)
	}
	// Replacing a record keeps one record.
	b, _ := s.GetSandbox(ctx, "b")
	b.Metadata = json.RawMessage(`{"k":"w"}`)
	if err := s.PutSandbox(ctx, b); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o1"}); len(all) != 2 || string(all[1].Metadata) != `{"k":"w"}` {
		t.Fatalf("after replacing b: %+v", all)
	}

	// A restart marks what was running as stopped; what had passed its
	// deadline meanwhile timed out then.
	expired := now.Add(-time.Minute)
	if err := s.PutSandbox(ctx, store.Sandbox{ID: "d", Owner: "o3", Template: "python", State: store.SandboxRunning,
		CreatedAt: now.Add(-time.Hour), ExpiresAt: expired}); err != nil {
		t.Fatal(err)
	}
	n, err := s.StopAllRunning(ctx, "server restarted", now.Add(time.Second))
	if err != nil || n != 3 {
		t.Fatalf("StopAllRunning = %d, %v", n, err)
	}
	if d, _ := s.GetSandbox(ctx, "d"); d.State != store.SandboxStopped || d.StopReason != store.ReasonTimedOut ||
		d.StoppedAt == nil || !d.StoppedAt.Equal(expired) {
		t.Fatalf("expired while down: %+v", d)
	}
	for _, id := range []string{"b", "c"} {
		sb, _ := s.GetSandbox(ctx, id)
		if sb.State != store.SandboxStopped || sb.StopReason != "server restarted" || sb.StoppedAt == nil || !sb.StoppedAt.Equal(now.Add(time.Second)) {
			t.Fatalf("%s = %+v", id, sb)
		}
	}
	if a2, _ := s.GetSandbox(ctx, "a"); a2.StopReason != "killed" || !a2.StoppedAt.Equal(now) {
		t.Fatalf("a stopped before the restart changed: %+v", a2)
	}
	if n, err := s.StopAllRunning(ctx, "again", now); err != nil || n != 0 {
		t.Fatalf("StopAllRunning with nothing running = %d, %v", n, err)
	}
	if _, err := s.GetSandbox(ctx, "zz"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
}

// testSandboxPaused: a sandbox recorded paused is listed live, outlives
// StopAllRunning (a restart), runs again, and is stopped as a running one
// is; a stopped one is not paused again; a missing one is ErrNotFound.
func testSandboxPaused(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	for _, id := range []string{"a", "b", "c"} {
		if err := s.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "o", Template: "python", State: store.SandboxRunning,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.StopSandbox(ctx, "c", "killed", now); err != nil {
		t.Fatal(err)
	}
	left := now.Add(30 * time.Minute)
	if err := s.SetSandboxPaused(ctx, "a", true, left); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetSandbox(ctx, "a"); a.State != store.SandboxPaused || !a.ExpiresAt.Equal(left) {
		t.Fatalf("paused: %+v", a)
	}
	if err := s.SetSandboxPaused(ctx, "c", true, left); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.GetSandbox(ctx, "c"); c.State != store.SandboxStopped {
		t.Fatalf("a stopped sandbox paused: %+v", c)
	}
	if err := s.SetSandboxPaused(ctx, "zz", true, left); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("pause of a missing sandbox: %v", err)
	}
	ids := func(f store.SandboxFilter) string {
		recs, err := s.ListSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range recs {
			out = append(out, r.ID+":"+r.State)
		}
		return strings.Join(out, " ")
	}
	if got := ids(store.SandboxFilter{Owner: "o", Live: true}); got != "a:paused b:running" {
		t.Fatalf("live: %s", got)
	}
	if got := ids(store.SandboxFilter{Owner: "o", State: store.SandboxPaused}); got != "a:paused" {
		t.Fatalf("paused: %s", got)
	}
	// A paused sandbox holds its place under the account's cap: with
	// a (paused) and b (running), a cap of 2 admits no third.
	if err := s.ReserveSandbox(ctx, "o", "h1", 2, now); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("reserve beside a paused and a running sandbox under a cap of 2: %v, want ErrLimit", err)
	}
	if n, err := s.StopAllRunning(ctx, "server restarted", now); err != nil || n != 1 {
		t.Fatalf("StopAllRunning = %d, %v", n, err)
	}
	if got := ids(store.SandboxFilter{Owner: "o"}); got != "a:paused b:stopped c:stopped" {
		t.Fatalf("after StopAllRunning: %s", got)
	}
	if err := s.SetSandboxPaused(ctx, "a", false, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetSandbox(ctx, "a"); a.State != store.SandboxRunning || !a.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("resumed: %+v", a)
	}
	if err := s.SetSandboxPaused(ctx, "a", true, left); err != nil {
		t.Fatal(err)
	}
	if err := s.StopSandbox(ctx, "a", "killed", now); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetSandbox(ctx, "a"); a.State != store.SandboxStopped || a.StopReason != "killed" {
		t.Fatalf("a paused sandbox stopped: %+v", a)
	}
}

func testSandboxPolicy(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	pol := json.RawMessage(`{"network":{"egress":["example.com"]}}`)
	if err := s.PutSandbox(ctx, store.Sandbox{ID: "a", Owner: "o", Template: "python", State: store.SandboxRunning,
		CreatedAt: now, ExpiresAt: now, Policy: pol, Resources: json.RawMessage(`{"cpu":1}`)}); err != nil {
		t.Fatal(err)
	}
	a, err := s.GetSandbox(ctx, "a")
	if err != nil || string(a.Policy) != string(pol) || string(a.Resources) != `{"cpu":1}` {
		t.Fatalf("a = %+v, %v", a, err)
	}
	if err := s.UpdateSandboxPolicy(ctx, "a", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetSandbox(ctx, "a"); string(a.Policy) != `{}` {
		t.Fatalf("policy after update %s", a.Policy)
	}
	if err := s.UpdateSandboxPolicy(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetSandbox(ctx, "a"); a.Policy != nil {
		t.Fatalf("policy after clearing %s, want none", a.Policy)
	}
	if err := s.UpdateSandboxPolicy(ctx, "zz", pol); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("policy of a missing sandbox: %v", err)
	}
}

// testPagesAndRetention: ListSandboxes pages by cursor; DeleteStoppedBefore
// removes stopped sandboxes (and their sessions) and executions older
// than the cut, and keeps running sandboxes whatever their age.
func testPagesAndRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	old := now.Add(-48 * time.Hour)
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		if err := s.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "o", Template: "python", State: store.SandboxRunning,
			CreatedAt: old.Add(time.Duration(i) * time.Minute), ExpiresAt: old}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddExecution(ctx, store.Execution{ID: "x" + id, SandboxID: id, Owner: "o", Status: "success", CreatedAt: old}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSession(ctx, store.Session{ID: "a", Owner: "o", Model: "m", CreatedAt: old}); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for {
		page, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o", After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			got = append(got, sb.ID)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].ID
	}
	if fmt.Sprint(got) != "[a b c d e]" {
		t.Fatalf("pages gave %v", got)
	}
	mustNil(t, s.StopSandbox(ctx, "a", "killed", old)) // stopped long ago: goes
	mustNil(t, s.StopSandbox(ctx, "b", "killed", now)) // stopped just now: stays
	mustNil(t, s.AddExecution(ctx, store.Execution{ID: "new", SandboxID: "b", Owner: "o", Status: "success", CreatedAt: now}))
	ns, ne, err := s.DeleteStoppedBefore(ctx, now.Add(-24*time.Hour))
	if err != nil || ns != 1 || ne != 5 {
		t.Fatalf("DeleteStoppedBefore = %d sandboxes, %d executions, %v", ns, ne, err)
	}
	if _, err := s.GetSandbox(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a stopped two days ago is still there: %v", err)
	}
	if _, err := s.GetSession(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the session of a pruned sandbox is still there: %v", err)
	}
	all, _ := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o"})
	if len(all) != 4 {
		t.Fatalf("%d sandboxes left, want 4 (b stopped now, c d e running)", len(all))
	}
	if l, _ := s.ListExecutions(ctx, "b"); len(l) != 1 || l[0].ID != "new" {
		t.Fatalf("executions of b: %+v", l)
	}
	// The cursor of a pruned record selects nothing (not the start again).
	if l, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "o", After: "a"}); err != nil || len(l) != 0 {
		t.Fatalf("after a pruned cursor: %+v, %v", l, err)
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testExecutions(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	// Code is the user's: any character, NUL too (JSON's \u0000), comes
	// back as it was.
	code := "print('a\x00b', \"\u00e9\U0001F600\")\n"
	e := store.Execution{ID: "e1", SandboxID: "s", Owner: "o", Language: "python", Status: "success",
		ExecutionTimeMS: 1.5, CPUTimeMS: 1, PeakMemoryBytes: 42, CreatedAt: now, Code: code}
	if err := s.AddExecution(ctx, e); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListExecutions(ctx, "s")
	if err != nil || len(l) != 1 || l[0].PeakMemoryBytes != 42 || l[0].ExecutionTimeMS != 1.5 || l[0].CPUTimeMS != 1 ||
		l[0].Language != "python" || l[0].Owner != "o" || !l[0].CreatedAt.Equal(now) || l[0].Output != nil {
		t.Fatalf("ListExecutions = %+v, %v", l, err)
	}
	if l[0].Code != code {
		t.Fatalf("code %q read back as %q", code, l[0].Code)
	}
	if l, err := s.ListExecutions(ctx, "none"); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("executions of an unknown sandbox: %#v, %v (want an empty, non-nil list)", l, err)
	}
}

// testExecutionsCutByRestart: an execution is recorded as it starts and
// replaced when it ends; one still running when the server died is ended
// at the next start with the reason, and only those.
func testExecutionsCutByRestart(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now()
	for _, e := range []store.Execution{
		{ID: "done", SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: at},
		{ID: "done", SandboxID: "s", Owner: "o", Status: "success", ExecutionTimeMS: 3, CreatedAt: at},
		{ID: "cut", SandboxID: "s", Owner: "o", Status: store.ExecutionRunning, CreatedAt: at.Add(time.Millisecond)},
	} {
		if err := s.AddExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.EndRunningExecutions(ctx, "ERR_INTERNAL", "server restarted")
	if err != nil || n != 1 {
		t.Fatalf("EndRunningExecutions = %d, %v; want 1", n, err)
	}
	l, err := s.ListExecutions(ctx, "s")
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

// testPageExecutions: pages newest first before a cursor, with code and
// output; only a sandbox's newest store.KeptOutputs keep their output.
func testPageExecutions(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now()
	n := store.KeptOutputs + 2
	for i := range n {
		e := store.Execution{ID: fmt.Sprintf("e%03d", i), SandboxID: "s", Owner: "o", Status: "success",
			CreatedAt: at.Add(time.Duration(i) * time.Millisecond), Code: fmt.Sprint("print(", i, ")"),
			Output: json.RawMessage(fmt.Sprintf(`{"stdout":"%d\n"}`, i))}
		if err := s.AddExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// Another sandbox's executions keep theirs.
	mustNil(t, s.AddExecution(ctx, store.Execution{ID: "other", SandboxID: "t", Owner: "o", Status: "success", CreatedAt: at, Output: json.RawMessage(`{}`)}))
	page, err := s.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "s", Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != fmt.Sprintf("e%03d", n-1) || page[0].Code != fmt.Sprint("print(", n-1, ")") ||
		string(page[0].Output) != fmt.Sprintf(`{"stdout":"%d\n"}`, n-1) {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	page, err = s.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "s", Before: page[1].ID})
	if err != nil || len(page) != n-2 || page[0].ID != fmt.Sprintf("e%03d", n-3) {
		t.Fatalf("after the cursor: %d, %v", len(page), err)
	}
	for _, e := range page {
		if kept := e.ID >= fmt.Sprintf("e%03d", n-store.KeptOutputs); kept != (e.Output != nil) {
			t.Fatalf("%s: output %q (kept %v)", e.ID, e.Output, kept)
		}
	}
	if l, _ := s.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "t"}); len(l) != 1 || l[0].Output == nil {
		t.Fatalf("sandbox t: %+v", l)
	}
	// A cursor from another sandbox selects nothing.
	if l, err := s.PageExecutions(ctx, store.ExecutionFilter{SandboxID: "s", Before: "other"}); err != nil || len(l) != 0 {
		t.Fatalf("a cursor of sandbox t in s: %d, %v", len(l), err)
	}
}
