package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Heartbeat implements store.ReplicaStore.
func (d *DB) Heartbeat(ctx context.Context, replica string, until time.Time) error {
	_, err := d.db.ExecContext(ctx, `INSERT INTO replicas (id, alive_until) VALUES (?, ?)
		ON CONFLICT (id) DO UPDATE SET alive_until = excluded.alive_until`, replica, fmtTime(until))
	return storeErr("heartbeat", err)
}

// EndLapsedExecutions implements store.ReplicaStore.
func (d *DB) EndLapsedExecutions(ctx context.Context, at time.Time, code, message string) (int, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, storeErr("end executions of lapsed replicas", err)
	}
	defer tx.Rollback()
	now := fmtTime(at)
	res, err := tx.ExecContext(ctx, `UPDATE executions SET status = ?, error_code = ?, error = ?
		WHERE status = ? AND replica != ''
		AND replica NOT IN (SELECT id FROM replicas WHERE alive_until >= ?)`,
		store.ExecutionError, code, message, store.ExecutionRunning, now)
	if err != nil {
		return 0, storeErr("end executions of lapsed replicas", err)
	}
	n, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `DELETE FROM replicas WHERE alive_until < ?`, now); err != nil {
		return 0, storeErr("remove lapsed replicas", err)
	}
	return int(n), storeErr("end executions of lapsed replicas", tx.Commit())
}

// TakeMeterLease implements store.ReplicaStore.
func (d *DB) TakeMeterLease(ctx context.Context, want store.MeterLease, at time.Time) (store.MeterLease, bool, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO meter_leases (sandbox_id, replica, lease_until, ended, cpu_ns, metered_at)
		VALUES (?, ?, ?, 0, ?, ?)
		ON CONFLICT (sandbox_id) DO UPDATE SET replica = excluded.replica, lease_until = excluded.lease_until
		WHERE NOT ended AND (replica = excluded.replica OR lease_until < ?)`,
		want.SandboxID, want.Replica, fmtTime(want.Until), int64(want.CPUNanos), fmtTime(want.At), fmtTime(at)); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	l := store.MeterLease{SandboxID: want.SandboxID}
	var until, metered string
	var cpu int64
	if err := tx.QueryRowContext(ctx, `SELECT replica, lease_until, ended, cpu_ns, metered_at FROM meter_leases WHERE sandbox_id = ?`,
		want.SandboxID).Scan(&l.Replica, &until, &l.Ended, &cpu, &metered); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	l.CPUNanos = uint64(cpu)
	if l.Until, err = parseTime(until); err != nil {
		return store.MeterLease{}, false, err
	}
	if l.At, err = parseTime(metered); err != nil {
		return store.MeterLease{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return store.MeterLease{}, false, storeErr("take meter lease", err)
	}
	return l, !l.Ended && l.Replica == want.Replica, nil
}

// putLeases records leases in tx where their replicas still hold them:
// a *store.LeaseLostError names those they do not. A lease no replica
// holds is a sandbox's meter point (store.MeterPoint.Lease): it replaces
// the sandbox's last.
func putLeases(ctx context.Context, tx *sql.Tx, leases []store.MeterLease) error {
	var lost []string
	for _, l := range leases {
		if l.Replica == "" {
			if _, err := tx.ExecContext(ctx, `INSERT INTO meter_leases (sandbox_id, replica, lease_until, ended, cpu_ns, metered_at)
				VALUES (?, '', ?, ?, ?, ?)
				ON CONFLICT (sandbox_id) DO UPDATE SET replica = '', lease_until = excluded.lease_until, ended = excluded.ended,
					cpu_ns = excluded.cpu_ns, metered_at = excluded.metered_at`,
				l.SandboxID, fmtTime(l.Until), l.Ended, int64(l.CPUNanos), fmtTime(l.At)); err != nil {
				return storeErr("record meter point", err)
			}
			continue
		}
		res, err := tx.ExecContext(ctx, `UPDATE meter_leases SET lease_until = ?, ended = ?, cpu_ns = ?, metered_at = ?
			WHERE sandbox_id = ? AND replica = ? AND NOT ended`,
			fmtTime(l.Until), l.Ended, int64(l.CPUNanos), fmtTime(l.At), l.SandboxID, l.Replica)
		if err != nil {
			return storeErr("record meter lease", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storeErr("record meter lease", err)
		} else if n == 0 {
			lost = append(lost, l.SandboxID)
		}
	}
	if len(lost) > 0 {
		return &store.LeaseLostError{SandboxIDs: lost}
	}
	return nil
}

// AddMeteredUsage implements store.MeterPointStore.
func (d *DB) AddMeteredUsage(ctx context.Context, deltas []store.UsageDelta, ledger []store.LedgerEntry, points []store.MeterPoint) error {
	leases := make([]store.MeterLease, len(points))
	for i, p := range points {
		leases[i] = p.Lease()
	}
	return d.AddLeasedUsage(ctx, deltas, ledger, leases)
}

// MeterPoint implements store.MeterPointStore.
func (d *DB) MeterPoint(ctx context.Context, sandboxID string) (store.MeterPoint, error) {
	p := store.MeterPoint{SandboxID: sandboxID}
	var cpu int64
	var metered string
	err := d.db.QueryRowContext(ctx, `SELECT ended, cpu_ns, metered_at FROM meter_leases WHERE sandbox_id = ?`,
		sandboxID).Scan(&p.Ended, &cpu, &metered)
	if errors.Is(err, sql.ErrNoRows) {
		return p, store.ErrNotFound
	}
	if err != nil {
		return p, storeErr("read meter point", err)
	}
	p.CPUNanos = uint64(cpu)
	p.At, err = parseTime(metered)
	return p, err
}
