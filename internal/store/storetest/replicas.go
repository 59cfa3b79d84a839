package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// testReplicaHeartbeats: the executions of a replica whose heartbeat
// lapsed, or that has none, are ended; those of live replicas, and those
// that name no replica, are not; lapsed heartbeats go, renewed ones stay.
func testReplicaHeartbeats(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now()
	mustNil(t, s.Heartbeat(ctx, "live", at.Add(time.Minute)))
	mustNil(t, s.Heartbeat(ctx, "dead", at.Add(-time.Second)))
	mustNil(t, s.Heartbeat(ctx, "renewed", at.Add(-time.Second)))
	mustNil(t, s.Heartbeat(ctx, "renewed", at.Add(time.Minute))) // replaces the lapsed time
	for i, e := range []store.Execution{
		{ID: "live", Replica: "live"},
		{ID: "renewed", Replica: "renewed"},
		{ID: "dead", Replica: "dead"},
		{ID: "gone", Replica: "gone"}, // a replica with no heartbeat
		{ID: "local"},                 // a server that shares nothing
		{ID: "done", Replica: "dead", Status: "success"},
	} {
		e.SandboxID, e.Owner, e.CreatedAt = "s", "o", at.Add(time.Duration(i)*time.Millisecond)
		if e.Status == "" {
			e.Status = store.ExecutionRunning
		}
		mustNil(t, s.AddExecution(ctx, e))
	}
	n, err := s.EndLapsedExecutions(ctx, at, "ERR_INTERNAL", "the server running it stopped")
	if err != nil || n != 2 {
		t.Fatalf("EndLapsedExecutions = %d, %v; want 2 (dead, gone)", n, err)
	}
	l, err := s.ListExecutions(ctx, "s")
	mustNil(t, err)
	got := map[string]store.Execution{}
	for _, e := range l {
		got[e.ID] = e
	}
	for _, id := range []string{"live", "renewed", "local"} {
		if got[id].Status != store.ExecutionRunning {
			t.Errorf("execution %s: %+v, want it running", id, got[id])
		}
	}
	for _, id := range []string{"dead", "gone"} {
		if e := got[id]; e.Status != store.ExecutionError || e.ErrorCode != "ERR_INTERNAL" || e.Error != "the server running it stopped" {
			t.Errorf("execution %s: %+v, want it ended", id, e)
		}
	}
	if got["done"].Status != "success" {
		t.Errorf("a finished execution changed: %+v", got["done"])
	}
	// The dead replica's heartbeat went: an execution it records now
	// (a replica that was only slow) is ended at the next pass, while
	// the live ones' are not, until they lapse.
	mustNil(t, s.AddExecution(ctx, store.Execution{ID: "late", SandboxID: "s", Owner: "o", Replica: "dead",
		Status: store.ExecutionRunning, CreatedAt: at}))
	if n, err := s.EndLapsedExecutions(ctx, at, "ERR_INTERNAL", "stopped"); err != nil || n != 1 {
		t.Fatalf("second pass: %d, %v; want the late one", n, err)
	}
	if n, err := s.EndLapsedExecutions(ctx, at.Add(2*time.Minute), "ERR_INTERNAL", "stopped"); err != nil || n != 2 {
		t.Fatalf("after the live ones lapsed: %d, %v; want 2", n, err)
	}
}

// testMeterLeases: one replica holds a sandbox's meter lease at a time;
// another takes it once it lapsed and goes on from the counters its
// holder recorded; a holder that lost it writes nothing; an ended lease
// is never taken again.
func testMeterLeases(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now()
	mustNil(t, s.CreateAccount(ctx, store.Account{ID: "acct", Name: "acct", CreatedAt: at}))
	start := at.Add(-time.Minute)
	want := func(replica string, until time.Time) store.MeterLease {
		return store.MeterLease{SandboxID: "sb", Replica: replica, Until: until, CPUNanos: 7, At: start}
	}
	// The first taker records its counters.
	l, held, err := s.TakeMeterLease(ctx, want("a", at.Add(30*time.Second)), at)
	if err != nil || !held || l.Replica != "a" || l.CPUNanos != 7 || !l.At.Equal(start) || l.At.Location() != time.UTC || l.Ended {
		t.Fatalf("first take: %+v, %v, %v", l, held, err)
	}
	// Another cannot take it while it holds.
	if l, held, err := s.TakeMeterLease(ctx, want("b", at.Add(time.Minute)), at); err != nil || held || l.Replica != "a" {
		t.Fatalf("taken from a live holder: %+v, %v, %v", l, held, err)
	}
	// The holder adds usage and advances the counters, in one step.
	delta := store.UsageDelta{SandboxID: "sb", Account: "acct", Hour: at.Truncate(time.Hour), CPUNanos: 100, GBSecondsReserved: 1}
	ledger := []store.LedgerEntry{{Account: "acct", CreatedAt: at, Kind: store.LedgerUsage, AmountMicros: -10}}
	checkpoint := at.Add(-10 * time.Second)
	mustNil(t, s.AddLeasedUsage(ctx, []store.UsageDelta{delta}, ledger,
		[]store.MeterLease{{SandboxID: "sb", Replica: "a", Until: at.Add(-time.Second), CPUNanos: 107, At: checkpoint}}))
	// Renewed into the past: it lapsed; b takes it and goes on from a's
	// counters.
	l, held, err = s.TakeMeterLease(ctx, want("b", at.Add(time.Minute)), at)
	if err != nil || !held || l.Replica != "b" || l.CPUNanos != 107 || !l.At.Equal(checkpoint) || !l.Until.Equal(at.Add(time.Minute)) {
		t.Fatalf("take over: %+v, %v, %v", l, held, err)
	}
	// a's next write, usage and ledger included, is refused whole.
	err = s.AddLeasedUsage(ctx, []store.UsageDelta{delta}, ledger,
		[]store.MeterLease{{SandboxID: "sb", Replica: "a", Until: at.Add(time.Minute), CPUNanos: 200, At: at}})
	var lost *store.LeaseLostError
	if !errors.Is(err, store.ErrLeaseLost) || !errors.As(err, &lost) || len(lost.SandboxIDs) != 1 || lost.SandboxIDs[0] != "sb" {
		t.Fatalf("a write by a replica that lost the lease: %v", err)
	}
	rows, err := s.QueryUsage(ctx, store.UsageFilter{Account: "acct", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 100 {
		t.Fatalf("usage %+v, %v; want the holder's 100 ns alone", rows, err)
	}
	if ct, err := s.CreditTotals(ctx, "acct"); err != nil || ct.SpentMicros != 10 {
		t.Fatalf("credits %+v, %v; want 10 spent", ct, err)
	}
	// b retakes its own; it ends the lease, which nobody takes after.
	if _, held, err := s.TakeMeterLease(ctx, want("b", at.Add(2*time.Minute)), at); err != nil || !held {
		t.Fatalf("the holder renews: %v, %v", held, err)
	}
	mustNil(t, s.AddLeasedUsage(ctx, nil, nil,
		[]store.MeterLease{{SandboxID: "sb", Replica: "b", Until: at, Ended: true, CPUNanos: 300, At: at}}))
	if l, held, err := s.TakeMeterLease(ctx, want("a", at.Add(time.Hour)), at.Add(time.Hour)); err != nil || held || !l.Ended || l.CPUNanos != 300 {
		t.Fatalf("an ended lease taken: %+v, %v, %v", l, held, err)
	}
	// Leases that lapsed before the retention cut go with old records.
	if _, _, err := s.DeleteStoppedBefore(ctx, at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if l, held, err := s.TakeMeterLease(ctx, want("a", at.Add(time.Hour)), at); err != nil || !held || l.CPUNanos != 7 {
		t.Fatalf("after pruning, a new lease: %+v, %v, %v", l, held, err)
	}
}
