package metering

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// TestRecoveredArithmetic: what a leftover used since its meter point,
// from its last reading and its record.
func TestRecoveredArithmetic(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 10, 59, 50, 0, time.UTC)
	now := t0.Add(20 * time.Second)
	stoppedAt := func(d time.Duration) *time.Time { at := t0.Add(d); return &at }
	rec := store.Sandbox{ID: "sb", Owner: "acct", Template: "python", Resources: []byte(`{"memory_mb":1024,"cpus":1}`)}
	point := store.MeterPoint{SandboxID: "sb", CPUNanos: 3e9, At: t0}
	reading := runtime.Usage{CPUNanos: 5_500_000_000, MemoryBytes: 256 << 20, MemoryLimit: 2 << 30, DiskBytes: 7 << 20}
	for _, tc := range []struct {
		name    string
		stopped *time.Time
		res     string
		p       store.MeterPoint
		u       runtime.Usage
		read    bool
		want    store.UsageDelta
		wantEnd store.MeterPoint
		ok      bool
	}{{
		name: "to now: the CPU counter's difference, the limit × time",
		p:    point, u: reading, read: true, ok: true,
		want: store.UsageDelta{WallNanos: 20e9, CPUNanos: 2_500_000_000, GBSecondsReserved: 20, GBSecondsUsed: 5, DiskPeakBytes: 7 << 20,
			Hour: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 5_500_000_000, At: now, Ended: true},
	}, {
		name: "to the record's stop (its deadline passed while no server ran)", stopped: stoppedAt(8 * time.Second),
		p: point, u: reading, read: true, ok: true,
		want: store.UsageDelta{WallNanos: 8e9, CPUNanos: 2_500_000_000, GBSecondsReserved: 8, GBSecondsUsed: 2, DiskPeakBytes: 7 << 20,
			Hour: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 5_500_000_000, At: t0.Add(8 * time.Second), Ended: true},
	}, {
		name: "a stop recorded before the point: no time", stopped: stoppedAt(-time.Second),
		p: point, u: reading, read: true, ok: true,
		want:    store.UsageDelta{CPUNanos: 2_500_000_000, DiskPeakBytes: 7 << 20, Hour: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 5_500_000_000, At: t0, Ended: true},
	}, {
		name: "no reading: time only, the counter stays",
		p:    point, ok: true,
		want:    store.UsageDelta{WallNanos: 20e9, GBSecondsReserved: 20, Hour: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 3e9, At: now, Ended: true},
	}, {
		name: "a counter below the point: no CPU",
		p:    point, u: runtime.Usage{CPUNanos: 1e9}, read: true, ok: true,
		want:    store.UsageDelta{WallNanos: 20e9, GBSecondsReserved: 20, Hour: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 3e9, At: now, Ended: true},
	}, {
		name: "no memory in the record: the cgroup's limit", res: `{}`,
		p: point, u: reading, read: true, ok: true,
		want: store.UsageDelta{WallNanos: 20e9, CPUNanos: 2_500_000_000, GBSecondsReserved: 40, GBSecondsUsed: 5, DiskPeakBytes: 7 << 20,
			Hour: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		wantEnd: store.MeterPoint{CPUNanos: 5_500_000_000, At: now, Ended: true},
	}, {
		name: "an ended point: nothing", p: store.MeterPoint{SandboxID: "sb", CPUNanos: 3e9, At: t0, Ended: true},
		u: reading, read: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := rec
			r.StoppedAt = tc.stopped
			if tc.res != "" {
				r.Resources = []byte(tc.res)
			}
			d, end, ok := recovered(r, tc.p, tc.u, tc.read, now)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			tc.want.SandboxID, tc.want.Account, tc.want.Template = "sb", "acct", "python"
			tc.wantEnd.SandboxID = "sb"
			if diff := cmp.Diff(tc.want, d); diff != "" {
				t.Errorf("delta (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEnd, end); diff != "" {
				t.Errorf("end point (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRecoverOnce: a leftover is charged, in the store, what its counters
// moved past its last flushed point, with its cost in the ledger; a
// second start charges nothing more of it, however its counters moved
// meanwhile; a sandbox never flushed is charged from its creation; one
// the store does not know, nothing.
func TestRecoverOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	prices := Prices{CPUSecond: 10, GBSecond: 2}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	created := t0.Add(-30 * time.Second)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.CreateAccount(ctx, store.Account{ID: "acct", Name: "acct", CreatedAt: created}))
	must(st.AddLedger(ctx, store.LedgerEntry{Account: "acct", CreatedAt: created, Kind: store.LedgerGrant, AmountMicros: 1e6}))
	for _, id := range []string{"flushed", "fresh"} {
		must(st.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "acct", Template: "python", State: store.SandboxRunning,
			CreatedAt: created, ExpiresAt: created.Add(time.Hour), Resources: []byte(`{"memory_mb":512}`)}))
	}
	// The crashed server's last flush: 30 s and 3 CPU-seconds metered,
	// its point at t0 with the counter at 3.2 s (0.2 s before hand-out).
	must(st.AddMeteredUsage(ctx, []store.UsageDelta{{SandboxID: "flushed", Account: "acct", Template: "python",
		Hour: t0.Truncate(time.Hour), WallNanos: 30e9, CPUNanos: 3e9, GBSecondsReserved: 15}},
		[]store.LedgerEntry{{Account: "acct", CreatedAt: t0, Kind: store.LedgerUsage, AmountMicros: -60}},
		[]store.MeterPoint{{SandboxID: "flushed", CPUNanos: 3_200_000_000, At: t0}}))
	// The restart marks the records stopped, then meets the leftovers.
	restart := t0.Add(40 * time.Second)
	if _, err := st.StopAllRunning(ctx, "server restarted", restart); err != nil {
		t.Fatal(err)
	}
	now := restart.Add(100 * time.Millisecond)
	d, err := Recover(ctx, st, prices, "flushed", runtime.Usage{CPUNanos: 5_700_000_000}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if d.CPUNanos != 2_500_000_000 || d.WallNanos != 40e9 || math.Abs(d.GBSecondsReserved-20) > 1e-9 {
		t.Fatalf("recovered %+v; want 2.5 CPU-seconds and 40 s of 0.5 GB", d)
	}
	total := func(id string) store.UsageDelta {
		t.Helper()
		rows, err := st.QueryUsage(ctx, store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			return store.UsageDelta{}
		}
		return rows[0].UsageDelta
	}
	spent := func() int64 {
		t.Helper()
		ct, err := st.CreditTotals(ctx, "acct")
		if err != nil {
			t.Fatal(err)
		}
		return ct.SpentMicros
	}
	check := func(when string) {
		t.Helper()
		// The whole life from hand-out: 5.5 CPU-seconds of the counter's
		// 5.7, 70 s of 0.5 GB; the cost is the flushed 60 plus 2.5 × 10 +
		// 20 × 2.
		if u := total("flushed"); u.CPUNanos != 5_500_000_000 || u.WallNanos != 70e9 || math.Abs(u.GBSecondsReserved-35) > 1e-9 {
			t.Fatalf("%s: stored %+v; want 5.5 CPU-seconds, 70 s, 35 GB-seconds", when, u)
		}
		if s := spent(); s != 60+25+40 {
			t.Fatalf("%s: spent %d micros, want 125", when, s)
		}
		if p, err := st.MeterPoint(ctx, "flushed"); err != nil || !p.Ended || p.CPUNanos != 5_700_000_000 || !p.At.Equal(restart) {
			t.Fatalf("%s: point %+v, %v; want ended at the restart's stop with the counter at 5.7 s", when, p, err)
		}
	}
	check("after the first start")
	// A second start finds it again (its destroy failed), its counter
	// further on: nothing more is charged.
	if d, err := Recover(ctx, st, prices, "flushed", runtime.Usage{CPUNanos: 9e9}, nil, now.Add(time.Minute)); err != nil || d != (store.UsageDelta{}) {
		t.Fatalf("second recovery: %+v, %v; want nothing", d, err)
	}
	check("after a second start")

	// Never flushed (the crash came right after its create): from its
	// creation, its whole counter; no reading: time alone.
	if d, err := Recover(ctx, st, prices, "fresh", runtime.Usage{}, errors.New("no cgroup"), now); err != nil ||
		d.CPUNanos != 0 || d.WallNanos != restart.Sub(created).Nanoseconds() {
		t.Fatalf("a sandbox never flushed, without a reading: %+v, %v", d, err)
	}
	// Unknown to the store: nothing, nowhere.
	if d, err := Recover(ctx, st, prices, "stranger", runtime.Usage{CPUNanos: 1e9}, nil, now); err != nil || d != (store.UsageDelta{}) {
		t.Fatalf("a sandbox of no record: %+v, %v", d, err)
	}
	if _, err := st.MeterPoint(ctx, "stranger"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a point recorded for a sandbox of no record: %v", err)
	}
}

// TestRecoverDeviceSeconds: a leftover that held devices is charged its
// device-seconds from its last point to the restart's stop, as its
// sandbox- and GB-seconds are, at the operator's price, once.
func TestRecoverDeviceSeconds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	prices := Prices{DeviceSecond: 3}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	created := t0.Add(-10 * time.Second)
	must(st.CreateAccount(ctx, store.Account{ID: "acct", Name: "acct", CreatedAt: created}))
	// As the server records them: the devices it was given, by name
	// (a GPU drawn by number among them), and a Kubernetes one's count.
	for id, res := range map[string]string{
		"named": `{"memory_mb":512,"gpu":1,"devices":["sheepfold.test/dev=0","sheepfold.test/gpu=0"]}`,
		"kube":  `{"gpu":3}`,
		"none":  `{"memory_mb":512}`,
	} {
		must(st.PutSandbox(ctx, store.Sandbox{ID: id, Owner: "acct", Template: "python", State: store.SandboxRunning,
			CreatedAt: created, ExpiresAt: created.Add(time.Hour), Resources: []byte(res)}))
		must(st.AddMeteredUsage(ctx, nil, nil, []store.MeterPoint{{SandboxID: id, At: t0}}))
	}
	restart := t0.Add(40 * time.Second)
	if _, err := st.StopAllRunning(ctx, "server restarted", restart); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]float64{"named": 80, "kube": 120, "none": 0} {
		d, err := Recover(ctx, st, prices, id, runtime.Usage{}, nil, restart.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(d.DeviceSeconds-want) > 1e-9 {
			t.Errorf("%s: recovered %g device-seconds, want %g (40 s × its devices)", id, d.DeviceSeconds, want)
		}
		rows, err := st.QueryUsage(ctx, store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
		if err != nil {
			t.Fatal(err)
		}
		if got := rows[0].DeviceSeconds; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: stored %g device-seconds, want %g", id, got, want)
		}
		// A second start charges nothing more.
		if d, err := Recover(ctx, st, prices, id, runtime.Usage{}, nil, restart.Add(time.Minute)); err != nil || d != (store.UsageDelta{}) {
			t.Fatalf("%s: second recovery %+v, %v; want nothing", id, d, err)
		}
	}
	ct, err := st.CreditTotals(ctx, "acct")
	if err != nil {
		t.Fatal(err)
	}
	if ct.SpentMicros != (80+120)*3 {
		t.Fatalf("spent %d micros, want %d (200 device-seconds at 3)", ct.SpentMicros, 200*3)
	}
}
