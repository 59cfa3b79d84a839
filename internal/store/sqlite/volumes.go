package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/sheepfold/sheepfold/internal/store"
)

const volumeColumns = `owner, name, id, size_bytes, created_at`

// CreateVolume implements store.VolumeStore. Writes take turns on the one
// write handle, so the bounds' check and the insert of one statement are
// one step.
func (d *DB) CreateVolume(ctx context.Context, v store.Volume, max int, maxBytes int64) error {
	res, err := d.db.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`)
		SELECT ?, ?, ?, ?, ?
		WHERE (? <= 0 OR (SELECT count(*) FROM volumes WHERE owner = ?) < ?)
		  AND (? <= 0 OR (SELECT coalesce(sum(size_bytes), 0) FROM volumes WHERE owner = ?) + ? <= ?)`,
		v.Owner, v.Name, v.ID, v.SizeBytes, fmtTime(v.CreatedAt),
		max, v.Owner, max, maxBytes, v.Owner, v.SizeBytes, maxBytes)
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create volume", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrLimit
	}
	return nil
}

func scanVolume(sc interface{ Scan(...any) error }) (store.Volume, error) {
	var v store.Volume
	var created string
	if err := sc.Scan(&v.Owner, &v.Name, &v.ID, &v.SizeBytes, &created); err != nil {
		return v, err
	}
	var err error
	v.CreatedAt, err = parseTime(created)
	return v, err
}

// GetVolume implements store.VolumeStore.
func (d *DB) GetVolume(ctx context.Context, owner, name string) (store.Volume, error) {
	v, err := scanVolume(d.rd.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE owner = ? AND name = ?`, owner, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, store.ErrNotFound
	}
	if err != nil {
		return v, storeErr("get volume", err)
	}
	return v, nil
}

func (d *DB) listVolumes(ctx context.Context, q string, args ...any) ([]store.Volume, error) {
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list volumes", err)
	}
	defer rows.Close()
	out := []store.Volume{}
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, storeErr("list volumes", err)
		}
		out = append(out, v)
	}
	return out, storeErr("list volumes", rows.Err())
}

// ListVolumes implements store.VolumeStore.
func (d *DB) ListVolumes(ctx context.Context, owner string) ([]store.Volume, error) {
	return d.listVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE owner = ? ORDER BY name`, owner)
}

// AllVolumes implements store.VolumeStore.
func (d *DB) AllVolumes(ctx context.Context) ([]store.Volume, error) {
	return d.listVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes ORDER BY owner, name`)
}

// DeleteVolume implements store.VolumeStore.
func (d *DB) DeleteVolume(ctx context.Context, owner, name string) error {
	res, err := d.db.ExecContext(ctx, `DELETE FROM volumes WHERE owner = ? AND name = ?`, owner, name)
	if err != nil {
		return storeErr("delete volume", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}
