package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Heartbeat implements store.ReplicaStore.
func (s *Store) Heartbeat(ctx context.Context, replica string, until time.Time) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO replicas (id, alive_until) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET alive_until = excluded.alive_until`, replica, dbTime(until))
	return storeErr("heartbeat", err)
}

// EndLapsedExecutions implements store.ReplicaStore. A heartbeat renewed
// while this runs is not removed (the DELETE re-reads the row it waited
// for).
func (s *Store) EndLapsedExecutions(ctx context.Context, at time.Time, code, message string) (int, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, storeErr("end executions of lapsed replicas", err)
	}
	defer tx.Rollback(ctx)
	now := dbTime(at)
	tag, err := tx.Exec(ctx, `UPDATE executions SET status = $1, error_code = $2, error = $3
		WHERE status = $4 AND replica != ''
		AND replica NOT IN (SELECT id FROM replicas WHERE alive_until >= $5)`,
		store.ExecutionError, code, message, store.ExecutionRunning, now)
	if err != nil {
		return 0, storeErr("end executions of lapsed replicas", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM replicas WHERE alive_until < $1`, now); err != nil {
		return 0, storeErr("remove lapsed replicas", err)
	}
	return int(tag.RowsAffected()), storeErr("end executions of lapsed replicas", tx.Commit(ctx))
}

// TakeMeterLease implements store.ReplicaStore. The upsert locks the
// lease's row, so two replicas taking it at once take it one after the
// other, the second seeing the first's.
func (s *Store) TakeMeterLease(ctx context.Context, want store.MeterLease, at time.Time) (store.MeterLease, bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO meter_leases AS l (sandbox_id, replica, lease_until, ended, cpu_ns, metered_at)
		VALUES ($1, $2, $3, false, $4, $5)
		ON CONFLICT (sandbox_id) DO UPDATE SET replica = excluded.replica, lease_until = excluded.lease_until
		WHERE NOT l.ended AND (l.replica = excluded.replica OR l.lease_until < $6)`,
		want.SandboxID, want.Replica, dbTime(want.Until), int64(want.CPUNanos), dbTime(want.At), dbTime(at)); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	l := store.MeterLease{SandboxID: want.SandboxID}
	var cpu int64
	if err := tx.QueryRow(ctx, `SELECT replica, lease_until, ended, cpu_ns, metered_at FROM meter_leases WHERE sandbox_id = $1`,
		want.SandboxID).Scan(&l.Replica, &l.Until, &l.Ended, &cpu, &l.At); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	l.CPUNanos, l.Until, l.At = uint64(cpu), l.Until.UTC(), l.At.UTC()
	if err := tx.Commit(ctx); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	return l, !l.Ended && l.Replica == want.Replica, nil
}

// putLeases records leases in tx where their replicas still hold them:
// a *store.LeaseLostError names those they do not. A lease no replica
// holds is a sandbox's meter point (store.MeterPoint.Lease): it replaces
// the sandbox's last.
func putLeases(ctx context.Context, tx pgx.Tx, leases []store.MeterLease) error {
	var lost []string
	for _, l := range leases {
		if l.Replica == "" {
			if _, err := tx.Exec(ctx, `INSERT INTO meter_leases (sandbox_id, replica, lease_until, ended, cpu_ns, metered_at)
				VALUES ($1, '', $2, $3, $4, $5)
				ON CONFLICT (sandbox_id) DO UPDATE SET replica = '', lease_until = excluded.lease_until, ended = excluded.ended,
					cpu_ns = excluded.cpu_ns, metered_at = excluded.metered_at`,
				l.SandboxID, dbTime(l.Until), l.Ended, int64(l.CPUNanos), dbTime(l.At)); err != nil {
				return storeErr("record meter point", err)
			}
			continue
		}
		tag, err := tx.Exec(ctx, `UPDATE meter_leases SET lease_until = $1, ended = $2, cpu_ns = $3, metered_at = $4
			WHERE sandbox_id = $5 AND replica = $6 AND NOT ended`,
			dbTime(l.Until), l.Ended, int64(l.CPUNanos), dbTime(l.At), l.SandboxID, l.Replica)
		if err != nil {
			return storeErr("record meter lease", err)
		}
		if tag.RowsAffected() == 0 {
			lost = append(lost, l.SandboxID)
		}
	}
	if len(lost) > 0 {
		return &store.LeaseLostError{SandboxIDs: lost}
	}
	return nil
}

// AddMeteredUsage implements store.MeterPointStore.
func (s *Store) AddMeteredUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry, points []store.MeterPoint) error {
	leases := make([]store.MeterLease, len(points))
	for i, p := range points {
		leases[i] = p.Lease()
	}
	return s.AddLeasedUsage(ctx, deltas, ledger, leases)
}

// MeterPoint implements store.MeterPointStore.
func (s *Store) MeterPoint(ctx context.Context, sandboxID string) (store.MeterPoint, error) {
	p := store.MeterPoint{SandboxID: sandboxID}
	var cpu int64
	if err := s.pool.QueryRow(ctx, `SELECT ended, cpu_ns, metered_at FROM meter_leases WHERE sandbox_id = $1`,
		sandboxID).Scan(&p.Ended, &cpu, &p.At); err != nil {
		return p, notFound("read meter point", err)
	}
	p.CPUNanos, p.At = uint64(cpu), p.At.UTC()
	return p, nil
}
