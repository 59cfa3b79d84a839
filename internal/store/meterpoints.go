package store

import (
	"context"
	"time"
)

// MeterPointStore keeps, for the sandboxes of a server that does not
// share them (one box: no meter leases), each sandbox's counters as
// metered so far, written in the same transaction as the usage and cost
// that bring them there. After a crash, the next start charges each
// sandbox it finds left over with what its counters moved past its point
// (internal/metering, recover.go), and ends the point in the same
// transaction: what is recorded is always exactly what was charged, so a
// sandbox is never charged twice for a second.
//
// Only one process writes a sandbox's point at a time: the server
// metering it, or, once that server died, the one start that holds its
// engine instance's lock (internal/runtime/oci) and recovers it.
//
// A point is kept where a lease is (meter_leases), as a row that no
// replica holds; it goes with the records older than the retention.
type MeterPointStore interface {
	// AddMeteredUsage is AccountStore.AddUsage that also records points
	// (each replacing the sandbox's last), in the same transaction.
	AddMeteredUsage(ctx context.Context, deltas []UsageDelta, ledger []LedgerEntry, points []MeterPoint) error
	// MeterPoint returns a sandbox's last recorded point; ErrNotFound
	// when it has none.
	MeterPoint(ctx context.Context, sandboxID string) (MeterPoint, error)
}

// MeterPoint is a sandbox's counters as metered so far.
type MeterPoint struct {
	SandboxID string
	CPUNanos  uint64    // the sandbox's CPU counter as metered so far
	At        time.Time // the time metered up to
	// Ended: nothing more of the sandbox is metered (it stopped and its
	// last sample is in, or its usage was recovered after a crash).
	Ended bool
}

// Lease is the row of meter_leases that keeps the point: one no replica
// holds (Replica ""), kept until At (DeleteStoppedBefore prunes it with
// the records of its time). Implementations write it with
// AddLeasedUsage's transaction.
func (p MeterPoint) Lease() MeterLease {
	return MeterLease{SandboxID: p.SandboxID, Until: p.At, Ended: p.Ended, CPUNanos: p.CPUNanos, At: p.At}
}
