package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Storage per account (store.StorageStore): the stored table counts each
// account's records and bytes, kept by triggers (migrations/0014); the
// writes trim with it (trim).

// querier is what both *sql.DB and *sql.Tx offer for reading.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// storedOf reads what account keeps of kind.
func storedOf(ctx context.Context, db querier, account, kind string) (store.Amount, error) {
	var a store.Amount
	err := db.QueryRowContext(ctx, `SELECT records, bytes FROM stored WHERE account_id = ? AND kind = ?`, account, kind).
		Scan(&a.Records, &a.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Amount{}, nil
	}
	return a, err
}

// oldest are the statements that delete an account's n oldest records
// of each kind that may go to make room.
var oldest = map[string]string{
	store.KindEvents: `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE owner = ?1 ORDER BY id LIMIT ?2)`,
	store.KindExecutions: `DELETE FROM executions WHERE id IN (SELECT id FROM executions
		WHERE owner = ?1 AND status != 'running' ORDER BY created_at, id LIMIT ?2)`,
	store.KindDeliveries: `DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries
		WHERE owner = ?1 ORDER BY id LIMIT ?2)`,
	store.KindAlerts: `DELETE FROM alerts WHERE id IN (SELECT id FROM alerts
		WHERE account_id = ?1 AND acknowledged_at IS NOT NULL ORDER BY created_at, id LIMIT ?2)`,
}

// trim deletes account's oldest records of kind past its bound, in tx,
// and returns how many went.
func (d *DB) trim(ctx context.Context, tx *sql.Tx, account, kind string) (int64, error) {
	bound := d.BoundOf(kind)
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
func deleteOldest(ctx context.Context, tx *sql.Tx, account, kind string, n int64) (int64, error) {
	if kind == store.KindSandboxes {
		return deleteOldestSandboxes(ctx, tx, account, n)
	}
	res, err := tx.ExecContext(ctx, oldest[kind], account, n)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// deleteOldestSandboxes deletes the records of account's n sandboxes
// stopped first, with their executions and sessions.
func deleteOldestSandboxes(ctx context.Context, tx *sql.Tx, account string, n int64) (int64, error) {
	const pick = `SELECT id FROM sandboxes WHERE owner = ?1 AND state = 'stopped' ORDER BY stopped_at, id LIMIT ?2`
	for _, q := range []string{
		`DELETE FROM executions WHERE sandbox_id IN (` + pick + `)`,
		`DELETE FROM sessions WHERE id IN (` + pick + `)`,
	} {
		if _, err := tx.ExecContext(ctx, q, account, n); err != nil {
			return 0, err
		}
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id IN (`+pick+`)`, account, n)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Stored implements store.StorageStore.
func (d *DB) Stored(ctx context.Context, account string) (store.Stored, error) {
	all, err := d.stored(ctx, `WHERE account_id = ?`, account)
	return all[account], err
}

// StoredAll implements store.StorageStore.
func (d *DB) StoredAll(ctx context.Context) (map[string]store.Stored, error) {
	return d.stored(ctx, `WHERE records > 0`)
}

func (d *DB) stored(ctx context.Context, where string, args ...any) (map[string]store.Stored, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT account_id, kind, records, bytes FROM stored `+where, args...)
	if err != nil {
		return nil, storeErr("read stored amounts", err)
	}
	defer rows.Close()
	out := map[string]store.Stored{}
	for rows.Next() {
		var account, kind string
		var a store.Amount
		if err := rows.Scan(&account, &kind, &a.Records, &a.Bytes); err != nil {
			return nil, storeErr("read stored amounts", err)
		}
		s := out[account]
		s.Set(kind, a)
		out[account] = s
	}
	return out, storeErr("read stored amounts", rows.Err())
}

// ClearStoppedBefore implements store.StorageStore.
func (d *DB) ClearStoppedBefore(ctx context.Context, t time.Time) (int, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE executions SET code = '', output = ''
		WHERE (code != '' OR output != '')
		AND sandbox_id IN (SELECT id FROM sandboxes WHERE state = ? AND stopped_at < ?)`, store.SandboxStopped, fmtTime(t))
	if err != nil {
		return 0, storeErr("clear outputs of stopped sandboxes", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// addAlert inserts an alert in tx when its account has room for it,
// making room by deleting its oldest acknowledged alerts; false when its
// dedupe key is taken, store.ErrStorageBound when there is no room.
func (d *DB) addAlert(ctx context.Context, tx *sql.Tx, a store.Alert) (bool, error) {
	if a.DedupeKey != "" {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM alerts WHERE account_id = ? AND dedupe_key = ?`,
			a.Account, a.DedupeKey).Scan(&n); err != nil {
			return false, err
		}
		if n > 0 {
			return false, nil
		}
	}
	bound := d.BoundOf(store.KindAlerts)
	size := store.AlertSize(a)
	for round := 0; ; round++ {
		have, err := storedOf(ctx, tx, a.Account, store.KindAlerts)
		if err != nil {
			return false, err
		}
		if store.Fits(have, bound, size) {
			break
		}
		// Room for one more of this size: as if it were stored.
		n := store.Excess(store.Amount{Records: have.Records + 1, Bytes: have.Bytes + size}, bound)
		k, err := deleteOldest(ctx, tx, a.Account, store.KindAlerts, max(n, 1))
		if err != nil {
			return false, err
		}
		if k == 0 || round == store.MaxTrimRounds {
			return false, store.ErrStorageBound
		}
	}
	var dedupe any
	if a.DedupeKey != "" {
		dedupe = a.DedupeKey
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO alerts
		(id, account_id, severity, kind, message, sandbox_id, session_id, dedupe_key, created_at, acknowledged_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, a.Account, a.Severity, a.Kind, a.Message, a.SandboxID, a.SessionID, dedupe, fmtTime(a.CreatedAt), fmtTimePtr(a.AcknowledgedAt))
	if isUnique(err) && a.DedupeKey != "" {
		return false, nil
	}
	return err == nil, err
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

// trimErr names what trimming failed for.
func trimErr(kind, account string, err error) error {
	if err == nil {
		return nil
	}
	return storeErr(fmt.Sprintf("trim the %s of %s", kind, account), err)
}

// MeterStorage implements store.StorageStore.
func (d *DB) MeterStorage(ctx context.Context, now time.Time) ([]store.StorageCharge, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, storeErr("meter storage", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT s.account_id, sum(s.bytes), sum(s.volume_bytes), sum(s.snapshot_bytes), coalesce(p.metered_at, '')
		FROM (SELECT account_id, bytes, 0 AS volume_bytes, 0 AS snapshot_bytes FROM stored
			UNION ALL SELECT owner, 0, size_bytes, 0 FROM volumes
			UNION ALL SELECT account_id, 0, 0, bytes FROM snapshot_bytes) s
		LEFT JOIN storage_points p ON p.account_id = s.account_id
		GROUP BY s.account_id HAVING sum(s.bytes) + sum(s.volume_bytes) + sum(s.snapshot_bytes) > 0`)
	if err != nil {
		return nil, storeErr("meter storage", err)
	}
	type kept struct {
		account string
		bytes   int64
		volumes int64
		snaps   int64
		last    time.Time
	}
	var all []kept
	for rows.Next() {
		var k kept
		var last string
		if err := rows.Scan(&k.account, &k.bytes, &k.volumes, &k.snaps, &last); err != nil {
			rows.Close()
			return nil, storeErr("meter storage", err)
		}
		if last != "" {
			if k.last, err = parseTime(last); err != nil {
				rows.Close()
				return nil, storeErr("meter storage", err)
			}
		}
		all = append(all, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, storeErr("meter storage", err)
	}
	hour, at := fmtTime(now.Truncate(time.Hour)), fmtTime(now)
	var out []store.StorageCharge
	for _, k := range all {
		if span := store.StorageSpan(k.last, now); span > 0 {
			c := store.ChargeWithVolumes(k.account, k.bytes, k.volumes, k.snaps, span)
			if _, err := tx.ExecContext(ctx, `INSERT INTO storage_hours (account_id, hour, gb_seconds, volume_gb_seconds, snapshot_gb_seconds) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (account_id, hour) DO UPDATE SET gb_seconds = gb_seconds + excluded.gb_seconds,
					volume_gb_seconds = volume_gb_seconds + excluded.volume_gb_seconds,
					snapshot_gb_seconds = snapshot_gb_seconds + excluded.snapshot_gb_seconds`,
				k.account, hour, c.GBSeconds, c.VolumeGBSeconds, c.SnapshotGBSeconds); err != nil {
				return nil, storeErr("meter storage", err)
			}
			out = append(out, c)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO storage_points (account_id, metered_at) VALUES (?, ?)
			ON CONFLICT (account_id) DO UPDATE SET metered_at = max(metered_at, excluded.metered_at)`, k.account, at); err != nil {
			return nil, storeErr("meter storage", err)
		}
	}
	return out, storeErr("meter storage", tx.Commit())
}

// SetSnapshotBytes implements store.StorageStore.
func (d *DB) SetSnapshotBytes(ctx context.Context, disk, account string, bytes int64) error {
	var err error
	if bytes <= 0 {
		_, err = d.db.ExecContext(ctx, `DELETE FROM snapshot_bytes WHERE disk = ? AND account_id = ?`, disk, account)
	} else {
		_, err = d.db.ExecContext(ctx, `INSERT INTO snapshot_bytes (disk, account_id, bytes) VALUES (?, ?, ?)
			ON CONFLICT (disk, account_id) DO UPDATE SET bytes = excluded.bytes`, disk, account, bytes)
	}
	return storeErr("set snapshot bytes", err)
}

// ClearSnapshotBytes implements store.StorageStore.
func (d *DB) ClearSnapshotBytes(ctx context.Context, disk string) error {
	_, err := d.db.ExecContext(ctx, `DELETE FROM snapshot_bytes WHERE disk = ?`, disk)
	return storeErr("clear snapshot bytes", err)
}

// StorageUsage implements store.StorageStore.
func (d *DB) StorageUsage(ctx context.Context, account string, from, to time.Time) ([]store.StorageHour, error) {
	q, args := `SELECT hour, gb_seconds, volume_gb_seconds, snapshot_gb_seconds FROM storage_hours WHERE account_id = ?`, []any{account}
	if !from.IsZero() {
		q += ` AND hour >= ?`
		args = append(args, fmtTime(from))
	}
	if !to.IsZero() {
		q += ` AND hour < ?`
		args = append(args, fmtTime(to))
	}
	rows, err := d.rd.QueryContext(ctx, q+` ORDER BY hour`, args...)
	if err != nil {
		return nil, storeErr("read storage usage", err)
	}
	defer rows.Close()
	var out []store.StorageHour
	for rows.Next() {
		var h store.StorageHour
		var hour string
		if err := rows.Scan(&hour, &h.GBSeconds, &h.VolumeGBSeconds, &h.SnapshotGBSeconds); err != nil {
			return nil, storeErr("read storage usage", err)
		}
		if h.Hour, err = parseTime(hour); err != nil {
			return nil, storeErr("read storage usage", err)
		}
		out = append(out, h)
	}
	return out, storeErr("read storage usage", rows.Err())
}
