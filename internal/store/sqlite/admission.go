package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Every write transaction here begins IMMEDIATE (the DSN's _txlock): one
// writer at a time, so a count and the insert it allows are one step.

// ReserveSandbox implements store.AdmissionStore.
func (d *DB) ReserveSandbox(ctx context.Context, owner, holder string, max int64, at time.Time) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("reserve sandbox", err)
	}
	defer tx.Rollback()
	cutoff := fmtTime(at.Add(-store.ReservationTTL))
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_reservations WHERE owner = ? AND created_at <= ?`, owner, cutoff); err != nil {
		return storeErr("reserve sandbox", err)
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE owner = ? AND state != ?) +
		(SELECT count(*) FROM sandbox_reservations WHERE owner = ?)`,
		owner, store.SandboxStopped, owner).Scan(&n); err != nil {
		return storeErr("reserve sandbox", err)
	}
	if n >= max {
		return store.ErrLimit
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_reservations (holder, owner, created_at) VALUES (?, ?, ?)`,
		holder, owner, fmtTime(at)); err != nil {
		return storeErr("reserve sandbox", err)
	}
	return storeErr("reserve sandbox", tx.Commit())
}

// ConfirmSandbox implements store.AdmissionStore.
func (d *DB) ConfirmSandbox(ctx context.Context, holder string, s store.Sandbox) error {
	give, err := d.turns.take(ctx, s.Owner)
	if err != nil {
		return storeErr("confirm sandbox", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("confirm sandbox", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_reservations WHERE holder = ?`, holder); err != nil {
		return storeErr("confirm sandbox", err)
	}
	if err := d.putSandbox(ctx, tx, s); err != nil {
		return err
	}
	return storeErr("confirm sandbox", tx.Commit())
}

// DropReservation implements store.AdmissionStore.
func (d *DB) DropReservation(ctx context.Context, holder string) error {
	_, err := d.db.ExecContext(ctx, `DELETE FROM sandbox_reservations WHERE holder = ?`, holder)
	return storeErr("drop reservation", err)
}

// CountExecution implements store.AdmissionStore.
func (d *DB) CountExecution(ctx context.Context, account string, month time.Time, max int64) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("count execution", err)
	}
	defer tx.Rollback()
	m := fmtTime(month)
	var n int64
	err = tx.QueryRowContext(ctx, `SELECT n FROM execution_counts WHERE account_id = ? AND month = ?`, account, m).Scan(&n)
	if err == sql.ErrNoRows {
		// The month's first count here: what its usage already holds.
		err = tx.QueryRowContext(ctx, `SELECT coalesce(sum(executions), 0) FROM usage_hours
			WHERE account_id = ? AND hour >= ? AND hour < ?`, account, m, fmtTime(month.AddDate(0, 1, 0))).Scan(&n)
	}
	if err != nil {
		return storeErr("count execution", err)
	}
	if n >= max {
		return store.ErrLimit
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO execution_counts (account_id, month, n) VALUES (?, ?, ?)
		ON CONFLICT (account_id, month) DO UPDATE SET n = excluded.n`, account, m, n+1); err != nil {
		return fmt.Errorf("count execution: %w", err)
	}
	return storeErr("count execution", tx.Commit())
}
