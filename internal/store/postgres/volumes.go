package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

const volumeColumns = `owner, name, id, size_bytes, created_at`

// CreateVolume implements store.VolumeStore: the bounds' check and the
// insert under the account's advisory lock, one step for every server.
func (s *Store) CreateVolume(ctx context.Context, v store.Volume, max int, maxBytes int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("create volume", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, v.Owner); err != nil {
		return storeErr("create volume", err)
	}
	var n int
	var bytes int64
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(size_bytes), 0) FROM volumes WHERE owner = $1`, v.Owner).Scan(&n, &bytes); err != nil {
		return storeErr("create volume", err)
	}
	if (max > 0 && n >= max) || (maxBytes > 0 && bytes+v.SizeBytes > maxBytes) {
		return store.ErrLimit
	}
	_, err = tx.Exec(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES ($1, $2, $3, $4, $5)`,
		v.Owner, v.Name, v.ID, v.SizeBytes, dbTime(v.CreatedAt))
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create volume", err)
	}
	return storeErr("create volume", tx.Commit(ctx))
}

func scanVolume(sc pgx.Row) (store.Volume, error) {
	var v store.Volume
	err := sc.Scan(&v.Owner, &v.Name, &v.ID, &v.SizeBytes, &v.CreatedAt)
	v.CreatedAt = v.CreatedAt.UTC()
	return v, err
}

// GetVolume implements store.VolumeStore.
func (s *Store) GetVolume(ctx context.Context, owner, name string) (store.Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE owner = $1 AND name = $2`, owner, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return v, store.ErrNotFound
	}
	return v, storeErr("get volume", err)
}

func (s *Store) listVolumes(ctx context.Context, q string, args ...any) ([]store.Volume, error) {
	rows, err := s.pool.Query(ctx, q, args...)
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
func (s *Store) ListVolumes(ctx context.Context, owner string) ([]store.Volume, error) {
	return s.listVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE owner = $1 ORDER BY name`, owner)
}

// AllVolumes implements store.VolumeStore.
func (s *Store) AllVolumes(ctx context.Context) ([]store.Volume, error) {
	return s.listVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes ORDER BY owner, name`)
}

// DeleteVolume implements store.VolumeStore.
func (s *Store) DeleteVolume(ctx context.Context, owner, name string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM volumes WHERE owner = $1 AND name = $2`, owner, name)
	if err != nil {
		return storeErr("delete volume", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}
