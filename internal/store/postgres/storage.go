package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Storage per account (store.StorageStore): the stored table counts each
// account's records and bytes, kept by triggers (migrations/0014); the
// writes trim with it (trim), as SQLite's do.

// storedOf reads what account keeps of kind.
func storedOf(ctx context.Context, db querier, account, kind string) (store.Amount, error) {
	var a store.Amount
	err := db.QueryRow(ctx, `SELECT records, bytes FROM stored WHERE account_id = $1 AND kind = $2`, account, kind).
		Scan(&a.Records, &a.Bytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Amount{}, nil
	}
	return a, err
}

// oldest are the statements that delete an account's n oldest records
// of each kind that may go to make room.
var oldest = map[string]string{
	store.KindEvents: `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE owner = $1 ORDER BY id LIMIT $2)`,
	store.KindExecutions: `DELETE FROM executions WHERE id IN (SELECT id FROM executions
		WHERE owner = $1 AND status != 'running' ORDER BY created_at, id LIMIT $2)`,
	store.KindDeliveries: `DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries
		WHERE owner = $1 ORDER BY id LIMIT $2)`,
	store.KindAlerts: `DELETE FROM alerts WHERE id IN (SELECT id FROM alerts
		WHERE account_id = $1 AND acknowledged_at IS NOT NULL ORDER BY created_at, id LIMIT $2)`,
}

// trim deletes account's oldest records of kind past its bound, in tx,
// and returns how many went.
func (s *Store) trim(ctx context.Context, tx pgx.Tx, account, kind string) (int64, error) {
	bound := s.BoundOf(kind)
	if bound == (store.Amount{}) {
		return 0, nil
	}
	var gone int64
	for range store.MaxTrimRounds {
		have, err := storedOf(ctx, tx, account, kind)
		if err != nil {
			return gone, err
		}
		n := store.Excess(have, bound)
		if n == 0 {
			return gone, nil
		}
		k, err := deleteOldest(ctx, tx, account, kind, n)
		if err != nil || k == 0 {
			return gone, err // nothing more of it may go
		}
		gone += k
	}
	return gone, nil
}

// deleteOldest deletes account's n oldest records of kind that may go.
func deleteOldest(ctx context.Context, tx pgx.Tx, account, kind string, n int64) (int64, error) {
	if kind == store.KindSandboxes {
		return deleteOldestSandboxes(ctx, tx, account, n)
	}
	tag, err := tx.Exec(ctx, oldest[kind], account, n)
	return tag.RowsAffected(), err
}

// deleteOldestSandboxes deletes the records of account's n sandboxes
// stopped first, with their executions and sessions.
func deleteOldestSandboxes(ctx context.Context, tx pgx.Tx, account string, n int64) (int64, error) {
	var ids []string
	rows, err := tx.Query(ctx, `SELECT id FROM sandboxes WHERE owner = $1 AND state = 'stopped'
		ORDER BY stopped_at, id LIMIT $2`, account, n)
	if err != nil {
		return 0, err
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) == 0 {
		return 0, err
	}
	for _, q := range []string{
		`DELETE FROM executions WHERE sandbox_id = ANY($1)`,
		`DELETE FROM sessions WHERE id = ANY($1)`,
	} {
		if _, err := tx.Exec(ctx, q, ids); err != nil {
			return 0, err
		}
	}
	tag, err := tx.Exec(ctx, `DELETE FROM sandboxes WHERE id = ANY($1)`, ids)
	return tag.RowsAffected(), err
}

// trimErr names what trimming failed for.
func trimErr(kind, account string, err error) error {
	if err == nil {
		return nil
	}
	return storeErr(fmt.Sprintf("trim the %s of %s", kind, account), err)
}

// Stored implements store.StorageStore.
func (s *Store) Stored(ctx context.Context, account string) (store.Stored, error) {
	all, err := s.stored(ctx, `WHERE account_id = $1`, account)
	return all[account], err
}

// StoredAll implements store.StorageStore.
func (s *Store) StoredAll(ctx context.Context) (map[string]store.Stored, error) {
	return s.stored(ctx, `WHERE records > 0`)
}

func (s *Store) stored(ctx context.Context, where string, args ...any) (map[string]store.Stored, error) {
	rows, err := s.pool.Query(ctx, `SELECT account_id, kind, records, bytes FROM stored `+where, args...)
	if err != nil {
		return nil, storeErr("read stored amounts", err)
	}
	out := map[string]store.Stored{}
	var account, kind string
	var a store.Amount
	_, err = pgx.ForEachRow(rows, []any{&account, &kind, &a.Records, &a.Bytes}, func() error {
		st := out[account]
		st.Set(kind, a)
		out[account] = st
		return nil
	})
	return out, storeErr("read stored amounts", err)
}

// ClearStoppedBefore implements store.StorageStore.
func (s *Store) ClearStoppedBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE executions SET code = '', output = ''
		WHERE (code != '' OR output != '')
		AND sandbox_id IN (SELECT id FROM sandboxes WHERE state = $1 AND stopped_at < $2)`, store.SandboxStopped, dbTime(t))
	if err != nil {
		return 0, storeErr("clear outputs of stopped sandboxes", err)
	}
	return int(tag.RowsAffected()), nil
}

// CreateAlert implements store.Store: under the account's lock (so that
// two servers do not both take its last room), past its bound its oldest
// acknowledged alerts make room, or store.ErrStorageBound.
func (s *Store) CreateAlert(ctx context.Context, a store.Alert) (bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, storeErr("create alert", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, a.Account); err != nil {
		return false, storeErr("create alert", err)
	}
	if a.DedupeKey != "" {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE account_id = $1 AND dedupe_key = $2`,
			a.Account, a.DedupeKey).Scan(&n); err != nil {
			return false, storeErr("create alert", err)
		}
		if n > 0 {
			return false, nil
		}
	}
	bound := s.BoundOf(store.KindAlerts)
	size := store.AlertSize(a)
	for round := 0; ; round++ {
		have, err := storedOf(ctx, tx, a.Account, store.KindAlerts)
		if err != nil {
			return false, storeErr("create alert", err)
		}
		if store.Fits(have, bound, size) {
			break
		}
		// Room for one more of this size: as if it were stored.
		n := store.Excess(store.Amount{Records: have.Records + 1, Bytes: have.Bytes + size}, bound)
		k, err := deleteOldest(ctx, tx, a.Account, store.KindAlerts, max(n, 1))
		if err != nil {
			return false, storeErr("create alert", err)
		}
		if k == 0 || round == store.MaxTrimRounds {
			return false, store.ErrStorageBound
		}
	}
	var dedupe *string
	if a.DedupeKey != "" {
		dedupe = &a.DedupeKey
	}
	tag, err := tx.Exec(ctx, `INSERT INTO alerts
		(id, account_id, severity, kind, message, sandbox_id, session_id, dedupe_key, created_at, acknowledged_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (account_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`,
		a.ID, a.Account, a.Severity, a.Kind, a.Message, a.SandboxID, a.SessionID, dedupe, dbTime(a.CreatedAt), dbTimePtr(a.AcknowledgedAt))
	if err != nil {
		return false, storeErr("create alert", err)
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	return true, storeErr("create alert", tx.Commit(ctx))
}

// ownersOf lists the distinct owners of a batch of events, in order.
func ownersOf(evs []store.Event) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range evs {
		if !seen[e.Owner] {
			seen[e.Owner] = true
			out = append(out, e.Owner)
		}
	}
	return out
}

// MeterStorage implements store.StorageStore. The points' table is locked
// for the transaction, so that replicas metering at once take turns and
// the second sees the first's points.
func (s *Store) MeterStorage(ctx context.Context, now time.Time) ([]store.StorageCharge, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, storeErr("meter storage", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE storage_points IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return nil, storeErr("meter storage", err)
	}
	rows, err := tx.Query(ctx, `SELECT s.account_id, sum(s.bytes)::bigint, sum(s.volume_bytes)::bigint, sum(s.snapshot_bytes)::bigint, p.metered_at
		FROM (SELECT account_id, bytes, 0::bigint AS volume_bytes, 0::bigint AS snapshot_bytes FROM stored
			UNION ALL SELECT owner, 0, size_bytes, 0 FROM volumes
			UNION ALL SELECT account_id, 0, 0, bytes FROM snapshot_bytes) s
		LEFT JOIN storage_points p ON p.account_id = s.account_id
		GROUP BY s.account_id, p.metered_at HAVING sum(s.bytes) + sum(s.volume_bytes) + sum(s.snapshot_bytes) > 0`)
	if err != nil {
		return nil, storeErr("meter storage", err)
	}
	type kept struct {
		account string
		bytes   int64
		volumes int64
		snaps   int64
		last    *time.Time
	}
	var all []kept
	var k kept
	if _, err := pgx.ForEachRow(rows, []any{&k.account, &k.bytes, &k.volumes, &k.snaps, &k.last}, func() error {
		all = append(all, k)
		return nil
	}); err != nil {
		return nil, storeErr("meter storage", err)
	}
	now = dbTime(now)
	var out []store.StorageCharge
	for _, k := range all {
		var last time.Time
		if k.last != nil {
			last = *k.last
		}
		if span := store.StorageSpan(last, now); span > 0 {
			c := store.ChargeWithVolumes(k.account, k.bytes, k.volumes, k.snaps, span)
			if _, err := tx.Exec(ctx, `INSERT INTO storage_hours AS h (account_id, hour, gb_seconds, volume_gb_seconds, snapshot_gb_seconds) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (account_id, hour) DO UPDATE SET gb_seconds = h.gb_seconds + excluded.gb_seconds,
					volume_gb_seconds = h.volume_gb_seconds + excluded.volume_gb_seconds,
					snapshot_gb_seconds = h.snapshot_gb_seconds + excluded.snapshot_gb_seconds`,
				k.account, now.Truncate(time.Hour), c.GBSeconds, c.VolumeGBSeconds, c.SnapshotGBSeconds); err != nil {
				return nil, storeErr("meter storage", err)
			}
			out = append(out, c)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO storage_points AS p (account_id, metered_at) VALUES ($1, $2)
			ON CONFLICT (account_id) DO UPDATE SET metered_at = greatest(p.metered_at, excluded.metered_at)`, k.account, now); err != nil {
			return nil, storeErr("meter storage", err)
		}
	}
	return out, storeErr("meter storage", tx.Commit(ctx))
}

// SetSnapshotBytes implements store.StorageStore.
func (s *Store) SetSnapshotBytes(ctx context.Context, disk, account string, bytes int64) error {
	var err error
	if bytes <= 0 {
		_, err = s.pool.Exec(ctx, `DELETE FROM snapshot_bytes WHERE disk = $1 AND account_id = $2`, disk, account)
	} else {
		_, err = s.pool.Exec(ctx, `INSERT INTO snapshot_bytes (disk, account_id, bytes) VALUES ($1, $2, $3)
			ON CONFLICT (disk, account_id) DO UPDATE SET bytes = excluded.bytes`, disk, account, bytes)
	}
	return storeErr("set snapshot bytes", err)
}

// ClearSnapshotBytes implements store.StorageStore.
func (s *Store) ClearSnapshotBytes(ctx context.Context, disk string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM snapshot_bytes WHERE disk = $1`, disk)
	return storeErr("clear snapshot bytes", err)
}

// StorageUsage implements store.StorageStore.
func (s *Store) StorageUsage(ctx context.Context, account string, from, to time.Time) ([]store.StorageHour, error) {
	q, args := `SELECT hour, gb_seconds, volume_gb_seconds, snapshot_gb_seconds FROM storage_hours WHERE account_id = $1`, []any{account}
	if !from.IsZero() {
		args = append(args, dbTime(from))
		q += fmt.Sprintf(` AND hour >= $%d`, len(args))
	}
	if !to.IsZero() {
		args = append(args, dbTime(to))
		q += fmt.Sprintf(` AND hour < $%d`, len(args))
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY hour`, args...)
	if err != nil {
		return nil, storeErr("read storage usage", err)
	}
	var out []store.StorageHour
	var h store.StorageHour
	_, err = pgx.ForEachRow(rows, []any{&h.Hour, &h.GBSeconds, &h.VolumeGBSeconds, &h.SnapshotGBSeconds}, func() error {
		h.Hour = h.Hour.UTC()
		out = append(out, h)
		return nil
	})
	return out, storeErr("read storage usage", err)
}
