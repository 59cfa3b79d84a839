package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ReplicaStore is what servers sharing their sandboxes (replicas over one
// database: the Kubernetes backend) coordinate through. Times are the
// callers' clocks: replicas' clocks are assumed to agree within a
// fraction of the margins the callers choose (seconds, where leases last
// tens of seconds).
//
//   - Heartbeats. Every replica records until when it is alive, and
//     renews that well before; every execution it runs names it
//     (Execution.Replica). A replica whose time lapsed, or that has no
//     heartbeat at all (its row was removed when it lapsed), is dead,
//     and any other ends the executions it was running.
//   - Meter leases. Exactly one replica meters a shared sandbox: the one
//     holding its lease. The lease keeps the sandbox's counters as
//     metered so far; the holder advances them in the same transaction
//     that adds the usage, only while the lease is still its own, and a
//     replica taking a lapsed lease goes on from those counters. So
//     every CPU-second and GB-second is counted once, whoever holds the
//     lease when, and whatever replica dies.
type ReplicaStore interface {
	// Heartbeat records that replica is alive until until.
	Heartbeat(ctx context.Context, replica string, until time.Time) error
	// EndLapsedExecutions ends (ExecutionError, with code and message)
	// the executions recorded as running by replicas that are dead at
	// at: whose heartbeat lapsed by then, or that have none. Executions
	// that name no replica (a server that does not share its sandboxes)
	// are left alone. The heartbeats that lapsed are removed, in the
	// same transaction. It returns how many executions it ended.
	EndLapsedExecutions(ctx context.Context, at time.Time, code, message string) (int, error)

	// TakeMeterLease gives want.Replica want.SandboxID's meter lease
	// until want.Until when nobody holds it at at (there is none yet: it
	// is recorded with want's counters; or its holder's lapsed by then;
	// or it is want.Replica's already) and it has not ended. It returns
	// the lease as it stands after the call, with the counters as
	// metered so far, and whether want.Replica holds it.
	TakeMeterLease(ctx context.Context, want MeterLease, at time.Time) (MeterLease, bool, error)
	// AddLeasedUsage is AccountStore.AddUsage for metered sandboxes under
	// leases: in the same transaction it records each lease in leases
	// (its new end, counters, ended) where its replica still holds it.
	// When some replica holds one of them no longer, nothing is written
	// and the error is a *LeaseLostError.
	AddLeasedUsage(ctx context.Context, deltas []UsageDelta, ledger []LedgerEntry, leases []MeterLease) error
}

// MeterLease is a replica's lease on metering one sandbox, with the
// sandbox's counters as metered so far.
type MeterLease struct {
	SandboxID string
	Replica   string
	Until     time.Time // the lease lapses then
	// Ended: the sandbox stopped and its last usage is metered; nobody
	// takes the lease again.
	Ended    bool
	CPUNanos uint64    // the sandbox's CPU counter as metered so far
	At       time.Time // the time metered up to
}

// ErrLeaseLost is what a *LeaseLostError is (errors.Is).
var ErrLeaseLost = errors.New("store: meter lease lost")

// LeaseLostError lists the sandboxes whose meter lease a replica wrote
// no longer holds.
type LeaseLostError struct {
	SandboxIDs []string
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("%v: %s", ErrLeaseLost, strings.Join(e.SandboxIDs, ", "))
}

// Is makes errors.Is(err, ErrLeaseLost) hold.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }
