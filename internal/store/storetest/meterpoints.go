package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// testMeterPoints: a sandbox's meter point is written with the usage and
// cost that bring it there and replaces the last; it reads back as
// written (UTC, to the microsecond), ended included; a sandbox without
// one is ErrNotFound; points go with the records older than the
// retention, and a point never touches another sandbox's lease.
func testMeterPoints(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := now()
	mustNil(t, s.CreateAccount(ctx, store.Account{ID: "acct", Name: "acct", CreatedAt: at}))
	if _, err := s.MeterPoint(ctx, "sb"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the point of a sandbox never metered: %v, want ErrNotFound", err)
	}
	// A replica's lease on another sandbox.
	if _, held, err := s.TakeMeterLease(ctx, store.MeterLease{SandboxID: "shared", Replica: "a", Until: at.Add(time.Hour),
		CPUNanos: 5, At: at}, at); err != nil || !held {
		t.Fatalf("take lease: %v, %v", held, err)
	}
	delta := store.UsageDelta{SandboxID: "sb", Account: "acct", Template: "python", Hour: at.Truncate(time.Hour),
		WallNanos: 10e9, CPUNanos: 2e9, GBSecondsReserved: 5}
	ledger := []store.LedgerEntry{{Account: "acct", CreatedAt: at, Kind: store.LedgerUsage, AmountMicros: -30}}
	first := store.MeterPoint{SandboxID: "sb", CPUNanos: 2_500_000_000, At: at.Add(-time.Minute)}
	mustNil(t, s.AddMeteredUsage(ctx, []store.UsageDelta{delta}, ledger, []store.MeterPoint{first}))
	p, err := s.MeterPoint(ctx, "sb")
	if err != nil || p != (store.MeterPoint{SandboxID: "sb", CPUNanos: first.CPUNanos, At: first.At.UTC()}) || p.At.Location() != time.UTC {
		t.Fatalf("point %+v, %v; want %+v in UTC", p, err, first)
	}
	rows, err := s.QueryUsage(ctx, store.UsageFilter{SandboxID: "sb", GroupBy: store.GroupNone})
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 2e9 || rows[0].WallNanos != 10e9 {
		t.Fatalf("usage %+v, %v", rows, err)
	}
	if ct, err := s.CreditTotals(ctx, "acct"); err != nil || ct.SpentMicros != 30 {
		t.Fatalf("credits %+v, %v; want 30 spent", ct, err)
	}
	// The next replaces it; an ended one reads back ended; points alone
	// (no usage) are written too.
	last := store.MeterPoint{SandboxID: "sb", CPUNanos: 1 << 62, At: at, Ended: true}
	mustNil(t, s.AddMeteredUsage(ctx, nil, nil, []store.MeterPoint{last}))
	if p, err := s.MeterPoint(ctx, "sb"); err != nil || p.CPUNanos != last.CPUNanos || !p.At.Equal(at) || !p.Ended {
		t.Fatalf("replaced point %+v, %v; want %+v", p, err, last)
	}
	if l, held, err := s.TakeMeterLease(ctx, store.MeterLease{SandboxID: "shared", Replica: "a", Until: at.Add(time.Hour)}, at); err != nil ||
		!held || l.CPUNanos != 5 || l.Replica != "a" {
		t.Fatalf("the lease beside the points: %+v, %v, %v", l, held, err)
	}
	// Pruned with the records of its time.
	if _, _, err := s.DeleteStoppedBefore(ctx, at.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MeterPoint(ctx, "sb"); err != nil {
		t.Fatalf("a point newer than the cut was pruned: %v", err)
	}
	if _, _, err := s.DeleteStoppedBefore(ctx, at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MeterPoint(ctx, "sb"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a point older than the cut: %v, want ErrNotFound", err)
	}
}
