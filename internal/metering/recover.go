package metering

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Metering across a crash, on one box (no Config.Replica; shared
// sandboxes have their leases, leases.go). A sandbox outlives a server
// killed with SIGKILL: it runs on, its cgroup counting, until the next
// start destroys it as a leftover, or its agent ends it at its deadline
// while no server runs. Its usage since the last flush is recovered from
// its cgroup then, exactly once:
//
//   - Every flush also records each metered sandbox's point, its counters
//     as metered so far (its CPU counter, and the time up to which wall
//     and GB-seconds are counted: the last sample), in the same
//     transaction as the usage and cost that bring it there
//     (store.MeterPointStore). A sandbox's first point is recorded at the
//     first sample after its start (a second, not a flush interval), so
//     that a warm pool member's CPU before hand-out is never charged.
//   - At the next start, the engine hands each leftover's last reading to
//     Recover just before it destroys it (runtime.LeftoverFunc: the
//     Manager's reconcile of its own instance, the runtime's sweep of
//     dead ones). Recover charges what the counters moved past the point:
//     the CPU counter's difference, and wall and GB-seconds reserved
//     (limit × time) and device-seconds (the devices its record holds ×
//     time) from the point to the sandbox's end, which is the
//     stop its record holds (the restart marks it stopped at once, or at
//     its deadline when that passed while no server ran) or now. It
//     writes that usage, its cost and the point ended, in one
//     transaction: a second start (a leftover whose destroy failed)
//     finds the point ended and charges nothing more.
//   - A sandbox with no point yet (the crash came within a second of its
//     start) is charged from its record's creation with its whole CPU
//     counter. One with no record (a create the crash cut, a `sheepfold
//     run`'s) is charged nothing: nobody was given it.
//
// What no cgroup keeps is estimated or lost: GB-seconds used are the
// memory in use at the reading × the interval; the executions, commands,
// egress requests and model tokens counted since the last flush are lost
// (at most one flush interval), and so is the CPU of a sandbox whose
// cgroup is gone before the start reads it.

// RecoverStore is what Recover reads and writes: the sandbox's record
// and its meter point.
type RecoverStore interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	store.MeterPointStore
}

// Recover charges a sandbox left over from a crashed server (id, its last
// reading u, or readErr when none could be taken) with what it used
// since its last meter point, up to now at the latest, and ends the
// point. It returns what it charged (zero for a sandbox ended already or
// unknown to the store).
func Recover(ctx context.Context, st RecoverStore, prices Prices, id string, u runtime.Usage, readErr error, now time.Time) (store.UsageDelta, error) {
	rec, err := st.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.UsageDelta{}, nil
	}
	if err != nil {
		return store.UsageDelta{}, fmt.Errorf("read the sandbox's record: %w", err)
	}
	p, err := st.MeterPoint(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		p = store.MeterPoint{SandboxID: id, At: rec.CreatedAt}
	case err != nil:
		return store.UsageDelta{}, fmt.Errorf("read the sandbox's meter point: %w", err)
	}
	d, end, ok := recovered(rec, p, u, readErr == nil, now)
	if !ok {
		return store.UsageDelta{}, nil
	}
	var ledger []store.LedgerEntry
	cost := prices.Cost(float64(d.CPUNanos)/1e9, d.GBSecondsReserved, 0) + d.DeviceSeconds*prices.DeviceSecond
	if micros := int64(math.Round(cost)); micros > 0 {
		ledger = append(ledger, store.LedgerEntry{Account: rec.Owner, CreatedAt: now, Kind: store.LedgerUsage,
			AmountMicros: -micros, Reason: "metered usage recovered after a crash"})
	}
	if err := st.AddMeteredUsage(ctx, []store.UsageDelta{d}, ledger, []store.MeterPoint{end}); err != nil {
		return store.UsageDelta{}, fmt.Errorf("record the recovered usage: %w", err)
	}
	return d, nil
}

// recovered is what a sandbox (its record rec) used from its meter point
// p to its end, by its last reading u (read false: none), and the point
// that ends it; ok is false when p ended already.
func recovered(rec store.Sandbox, p store.MeterPoint, u runtime.Usage, read bool, now time.Time) (d store.UsageDelta, end store.MeterPoint, ok bool) {
	if p.Ended {
		return d, p, false
	}
	at := now
	if rec.StoppedAt != nil && rec.StoppedAt.Before(at) {
		at = *rec.StoppedAt
	}
	if at.Before(p.At) {
		at = p.At
	}
	dt := at.Sub(p.At)
	reserved := recordedMemory(rec.Resources)
	if reserved <= 0 && read {
		reserved = u.MemoryLimit
	}
	d = store.UsageDelta{SandboxID: rec.ID, Account: rec.Owner, Template: rec.Template, Hour: at.UTC().Truncate(time.Hour),
		WallNanos: dt.Nanoseconds(), GBSecondsReserved: float64(reserved) / gib * dt.Seconds(),
		DeviceSeconds: float64(recordedDevices(rec.Resources)) * dt.Seconds()}
	end = store.MeterPoint{SandboxID: rec.ID, CPUNanos: p.CPUNanos, At: at, Ended: true}
	if read {
		if u.CPUNanos > p.CPUNanos {
			d.CPUNanos, end.CPUNanos = int64(u.CPUNanos-p.CPUNanos), u.CPUNanos
		}
		d.GBSecondsUsed = float64(u.MemoryBytes) / gib * dt.Seconds()
		d.DiskPeakBytes = u.DiskBytes
	}
	return d, end, true
}

// recordedMemory is the memory limit a sandbox's record holds (its
// resources' memory_mb, as the server records them), in bytes; 0 when it
// holds none.
func recordedMemory(resources json.RawMessage) int64 {
	var r struct {
		MemoryMB int64 `json:"memory_mb"`
	}
	if json.Unmarshal(resources, &r) != nil || r.MemoryMB <= 0 || r.MemoryMB > math.MaxInt64>>20 {
		return 0
	}
	return r.MemoryMB << 20
}

// recordedDevices is the number of devices a sandbox's record says it
// held (its resources' devices, as the server records every device it
// was given, or gpu for a runtime whose cluster chose them), as the
// meter counts them (sandbox.Sandbox.DeviceCount); 0 when none.
func recordedDevices(resources json.RawMessage) int {
	var r struct {
		GPU     int      `json:"gpu"`
		Devices []string `json:"devices"`
	}
	if json.Unmarshal(resources, &r) != nil || r.GPU < 0 {
		return 0
	}
	return max(len(r.Devices), r.GPU)
}

// Recoverer returns the engine's hook for leftovers (sandbox.Config.Leftover):
// Recover, bounded by ctx, logged with what it charged or, when it
// could not, with the figures it could not record.
func Recoverer(st RecoverStore, prices Prices, log *slog.Logger) runtime.LeftoverFunc {
	return func(ctx context.Context, id string, u runtime.Usage, readErr error) {
		if readErr != nil {
			log.Warn("no last reading of a sandbox left by a crash: its CPU since the last metering flush is lost",
				"sandbox", id, "err", readErr)
		}
		d, err := Recover(ctx, st, prices, id, u, readErr, time.Now())
		if err != nil {
			log.Error("could not charge the usage of a sandbox left by a crash", "sandbox", id, "err", err,
				"cpu_counter_ns", u.CPUNanos)
			return
		}
		if d.SandboxID != "" {
			log.Info("charged the usage of a sandbox left by a crash since its last metering flush", "sandbox", id,
				"account", d.Account, "cpu_seconds", float64(d.CPUNanos)/1e9, "sandbox_seconds", float64(d.WallNanos)/1e9,
				"gb_seconds_reserved", d.GBSecondsReserved, "device_seconds", d.DeviceSeconds)
		}
	}
}

// pointed reports whether flushes record meter points: on one box, over
// a store that keeps them.
func (m *Meter) pointed() bool { return m.ps != nil && !m.leased() }

// points returns every tracker's meter point for the next flush; m.mu is
// held.
func (m *Meter) points() []store.MeterPoint {
	var out []store.MeterPoint
	for _, t := range m.trackers {
		out = append(out, store.MeterPoint{SandboxID: t.sb.ID, CPUNanos: t.lastCPU, At: t.last, Ended: t.stopped})
	}
	return out
}
