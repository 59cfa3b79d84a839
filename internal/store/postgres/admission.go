package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// admissionLock is the class of the per-account transaction advisory
// locks that serialise admissions (the two-int4 key space, apart from the
// bigint keys of postgres.go): the count and the insert it allows are one
// step for every server sharing the database.
const admissionLock int32 = 0x53686565

// lockAccount takes account's admission lock until tx ends.
func lockAccount(ctx context.Context, tx pgx.Tx, account string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, admissionLock, account)
	return err
}

// ReserveSandbox implements store.AdmissionStore.
func (s *Store) ReserveSandbox(ctx context.Context, owner, holder string, max int64, at time.Time) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("reserve sandbox", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, owner); err != nil {
		return storeErr("reserve sandbox", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_reservations WHERE owner = $1 AND created_at <= $2`,
		owner, dbTime(at.Add(-store.ReservationTTL))); err != nil {
		return storeErr("reserve sandbox", err)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE owner = $1 AND state != $2) +
		(SELECT count(*) FROM sandbox_reservations WHERE owner = $1)`, owner, store.SandboxStopped).Scan(&n); err != nil {
		return storeErr("reserve sandbox", err)
	}
	if n >= max {
		return store.ErrLimit
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sandbox_reservations (holder, owner, created_at) VALUES ($1, $2, $3)`,
		holder, owner, dbTime(at)); err != nil {
		return storeErr("reserve sandbox", err)
	}
	return storeErr("reserve sandbox", tx.Commit(ctx))
}

// ConfirmSandbox implements store.AdmissionStore.
func (s *Store) ConfirmSandbox(ctx context.Context, holder string, sb store.Sandbox) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("confirm sandbox", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, sb.Owner); err != nil {
		return storeErr("confirm sandbox", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_reservations WHERE holder = $1`, holder); err != nil {
		return storeErr("confirm sandbox", err)
	}
	if err := s.putSandbox(ctx, tx, sb); err != nil {
		return err
	}
	return storeErr("confirm sandbox", tx.Commit(ctx))
}

// DropReservation implements store.AdmissionStore.
func (s *Store) DropReservation(ctx context.Context, holder string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM sandbox_reservations WHERE holder = $1`, holder)
	return storeErr("drop reservation", err)
}

// CountExecution implements store.AdmissionStore.
func (s *Store) CountExecution(ctx context.Context, account string, month time.Time, max int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("count execution", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, account); err != nil {
		return storeErr("count execution", err)
	}
	m := dbTime(month)
	var n int64
	err = tx.QueryRow(ctx, `SELECT n FROM execution_counts WHERE account_id = $1 AND month = $2`, account, m).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		// The month's first count here: what its usage already holds.
		err = tx.QueryRow(ctx, `SELECT coalesce(sum(executions), 0)::bigint FROM usage_hours
			WHERE account_id = $1 AND hour >= $2 AND hour < $3`, account, m, dbTime(month.AddDate(0, 1, 0))).Scan(&n)
	}
	if err != nil {
		return storeErr("count execution", err)
	}
	if n >= max {
		return store.ErrLimit
	}
	if _, err := tx.Exec(ctx, `INSERT INTO execution_counts (account_id, month, n) VALUES ($1, $2, $3)
		ON CONFLICT (account_id, month) DO UPDATE SET n = excluded.n`, account, m, n+1); err != nil {
		return storeErr("count execution", err)
	}
	return storeErr("count execution", tx.Commit(ctx))
}
