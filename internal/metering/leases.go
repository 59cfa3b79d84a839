package metering

import (
	"context"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Shared sandboxes (Config.Replica): several replicas over one store hold
// each sandbox, and any of them may die. Each sandbox is metered exactly
// once through a lease in the store (store.ReplicaStore), which also
// keeps the sandbox's counters as metered so far (its CPU counter, and
// the time up to which wall and GB-seconds are counted):
//
//   - Only the replica holding the lease samples the sandbox. Every
//     flush renews it, and writes the counters of the last sample in the
//     same transaction as the usage that brings them there, only while
//     the lease is still this replica's. A holder that lost it (it was
//     too slow, and another took it) writes nothing of that sandbox, and
//     gives back to the account what it had accrued (refund).
//   - The others keep a standby tracker: they count the executions,
//     commands and egress requests made through them (events of their
//     own, counted once wherever they happen), and at flushes try to
//     take the lease; they get it once it lapsed (its holder died or
//     stopped) and go on sampling from the counters it holds. So what a
//     dead holder had sampled and not flushed is counted by its
//     successor, and nothing twice.
//   - The creator starts as holder before the lease exists, from its
//     first reading; its first flush records the lease with that
//     reading. An adopter that finds no lease yet (its creator died
//     before its first flush) records one from the sandbox's creation
//     (CPU counter 0; a warm pool member's CPU before hand-out is then
//     counted too).
//   - A holder whose sandbox stopped ends the lease (nobody takes it
//     again); one that only lets go of it (the replica stops) makes it
//     lapse at once. A standby tracker tries to take a lease once the
//     holder's last renewal it saw would lapse, not at every flush.
//
// Why a lease and not compare-and-set of the counters by every replica:
// both are exactly once, but with a lease one replica samples each
// sandbox, as on one box, instead of every replica sampling it and all
// but one having their flush refused. That nothing is counted twice
// rests on the store's checks of the holder, never on clocks: replicas'
// clocks apart by more than a lease would only have leases change hands
// too early (a refused flush, a refund), and a replica too slow to
// renew likewise.
//
// On one box (Replica "") none of this runs: every tracker samples, and
// flushes write no lease.

// leaseFlushes is how many flush intervals a lease lasts: a holder
// renews it at every flush.
const leaseFlushes = 3

func (m *Meter) leased() bool { return m.cfg.Replica != "" && m.rs != nil }

// Adopt meters a sandbox another replica created (Config.Replica): on
// standby until this replica takes its meter lease.
func (m *Meter) Adopt(sb *sandbox.Sandbox, acct *account.Account) {
	t := &tracker{sb: sb, account: acct, template: sb.Template,
		pending: map[time.Time]*store.UsageDelta{}, base: counters{at: sb.Created.Truncate(time.Microsecond)},
		// Its creator records the lease at its first flush: give it time.
		retry: sb.Created.Add(leaseFlushes * m.cfg.FlushInterval)}
	t.total = store.UsageDelta{SandboxID: sb.ID, Account: acct.ID, Template: sb.Template}
	m.mu.Lock()
	if m.trackers[sb.ID] != nil {
		// Metered here already (or held before and not yet flushed: the
		// others meter it meanwhile).
		m.mu.Unlock()
		return
	}
	m.trackers[sb.ID] = t
	m.mu.Unlock()
	m.live.Store(sb.ID, t)
}

// counters are a sandbox's counters as metered up to a point.
type counters struct {
	cpu uint64
	at  time.Time
}

// takeLeases tries to take the lease of every tracker that does not hold
// it yet; m.mu is held.
func (m *Meter) takeLeases(ctx context.Context, now time.Time) {
	until := now.Add(leaseFlushes * m.cfg.FlushInterval)
	for _, t := range m.trackers {
		if t.confirmed || t.stopped && !t.holder || now.Before(t.retry) {
			continue
		}
		l, held, err := m.rs.TakeMeterLease(ctx, store.MeterLease{SandboxID: t.sb.ID, Replica: m.cfg.Replica,
			Until: until, CPUNanos: t.base.cpu, At: t.base.at}, now)
		if err != nil {
			m.cfg.Logger.Error("take meter lease", "sandbox", t.sb.ID, "err", err)
			continue
		}
		cp := counters{cpu: l.CPUNanos, at: l.At}
		switch {
		case held && t.holder && cp.cpu == t.base.cpu && cp.at.Equal(t.base.at):
			t.confirmed = true // recorded from this tracker's own reading
		case held:
			// Go on from the counters the lease holds.
			m.refund(t)
			t.holder, t.confirmed, t.base = true, true, cp
			t.lastCPU, t.last = cp.cpu, cp.at
			t.epoch++
		default:
			// Another replica holds it, or it ended: only counts here,
			// and the next try once the lease seen would lapse.
			m.refund(t)
			t.holder, t.retry = false, l.Until
			t.epoch++
			if l.Ended {
				t.retry = now.Add(leaseFlushes * m.cfg.FlushInterval)
			}
		}
	}
}

// leases returns the leases the next flush writes: every one this
// replica holds, renewed, ended or let go of with its sandbox; m.mu is
// held.
func (m *Meter) leases(now time.Time) []store.MeterLease {
	var out []store.MeterLease
	for _, t := range m.trackers {
		if !t.holder || !t.confirmed {
			continue
		}
		l := store.MeterLease{SandboxID: t.sb.ID, Replica: m.cfg.Replica, Until: now.Add(leaseFlushes * m.cfg.FlushInterval),
			CPUNanos: t.lastCPU, At: t.last}
		if t.stopped {
			// Ended where it stopped (here, or another replica stopped
			// it: its record's reason); let go of where this replica
			// only let go of it (it stops: no reason), for another to
			// take at once.
			l.Until, l.Ended = now, !t.sb.Released() || t.sb.Info().StopReason != ""
		}
		out = append(out, l)
	}
	return out
}

// lostLeases handles a flush refused because some leases were lost: those
// trackers give back what they accrued and go on standby. It reports
// whether err was that.
func (m *Meter) lostLeases(err error) bool {
	var lost *store.LeaseLostError
	if !errors.As(err, &lost) {
		return false
	}
	for _, id := range lost.SandboxIDs {
		if t := m.trackers[id]; t != nil {
			m.cfg.Logger.Warn("meter lease lost: another replica meters the sandbox", "sandbox", id)
			m.refund(t)
			t.holder, t.confirmed = false, false
			t.epoch++
		}
	}
	return true
}

// refund takes back what a tracker sampled and did not flush (it was not
// its to count), keeping the counts of events made here; m.mu is held.
func (m *Meter) refund(t *tracker) {
	for _, p := range t.pending {
		cpu := float64(p.CPUNanos) / 1e9
		t.account.Accrue(account.Usage{SandboxSeconds: -float64(p.WallNanos) / 1e9, CPUSeconds: -cpu, GBSeconds: -p.GBSecondsReserved},
			-m.cfg.Prices.Cost(cpu, p.GBSecondsReserved, 0))
		t.total.WallNanos -= p.WallNanos
		t.total.CPUNanos -= p.CPUNanos
		t.total.GBSecondsReserved -= p.GBSecondsReserved
		t.total.GBSecondsUsed -= p.GBSecondsUsed
		p.WallNanos, p.CPUNanos, p.GBSecondsReserved, p.GBSecondsUsed, p.DiskPeakBytes = 0, 0, 0, 0, 0
	}
}
