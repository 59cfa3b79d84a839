package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

const secretColumns = `owner, name, metadata, version, key_id, sealed, created_at, updated_at, last_used_at`

// CreateSecret implements store.SecretStore. Writes take turns on the one
// write handle, so the count and the insert of one statement are one step.
func (d *DB) CreateSecret(ctx context.Context, s store.Secret, max int) error {
	res, err := d.db.ExecContext(ctx, `INSERT INTO secrets (`+secretColumns+`)
		SELECT ?, ?, ?, 1, ?, ?, ?, ?, NULL
		WHERE (SELECT count(*) FROM secrets WHERE owner = ?) < ?`,
		s.Owner, s.Name, jsonText(s.Metadata), s.KeyID, s.Sealed, fmtTime(s.CreatedAt), fmtTime(s.CreatedAt), s.Owner, max)
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create secret", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrLimit
	}
	return nil
}

func scanSecret(sc interface{ Scan(...any) error }) (store.Secret, error) {
	var s store.Secret
	var meta, created, updated string
	var used sql.NullString
	if err := sc.Scan(&s.Owner, &s.Name, &meta, &s.Version, &s.KeyID, &s.Sealed, &created, &updated, &used); err != nil {
		return s, err
	}
	s.Metadata = json.RawMessage(meta)
	var err error
	if s.CreatedAt, err = parseTime(created); err != nil {
		return s, err
	}
	if s.UpdatedAt, err = parseTime(updated); err != nil {
		return s, err
	}
	s.LastUsedAt, err = parseTimePtr(used)
	return s, err
}

// GetSecret implements store.SecretStore.
func (d *DB) GetSecret(ctx context.Context, owner, name string) (store.Secret, error) {
	s, err := scanSecret(d.rd.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE owner = ? AND name = ?`, owner, name))
	if errors.Is(err, sql.ErrNoRows) {
		return s, store.ErrNotFound
	}
	if err != nil {
		return s, storeErr("get secret", err)
	}
	return s, nil
}

func (d *DB) listSecrets(ctx context.Context, what, q string, args ...any) ([]store.Secret, error) {
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr(what, err)
	}
	defer rows.Close()
	out := []store.Secret{}
	for rows.Next() {
		s, err := scanSecret(rows)
		if err != nil {
			return nil, storeErr(what, err)
		}
		out = append(out, s)
	}
	return out, storeErr(what, rows.Err())
}

// ListSecrets implements store.SecretStore.
func (d *DB) ListSecrets(ctx context.Context, owner string) ([]store.Secret, error) {
	return d.listSecrets(ctx, "list secrets", `SELECT `+secretColumns+` FROM secrets WHERE owner = ? ORDER BY name`, owner)
}

// SecretsNotSealedWith implements store.SecretStore.
func (d *DB) SecretsNotSealedWith(ctx context.Context, keyID string, limit int) ([]store.Secret, error) {
	return d.listSecrets(ctx, "list secrets to reseal", `SELECT `+secretColumns+` FROM secrets WHERE key_id <> ?
		ORDER BY owner, name LIMIT ?`, keyID, limit)
}

// UpdateSecret implements store.SecretStore.
func (d *DB) UpdateSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte, metadata json.RawMessage, at time.Time) error {
	var meta any
	if metadata != nil {
		meta = jsonText(metadata)
	}
	res, err := d.db.ExecContext(ctx, `UPDATE secrets SET version = ?, key_id = ?, sealed = ?,
		metadata = coalesce(?, metadata), updated_at = ? WHERE owner = ? AND name = ? AND version = ?`,
		version, keyID, sealed, meta, fmtTime(at), owner, name, version-1)
	if err != nil {
		return storeErr("update secret", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := d.GetSecret(ctx, owner, name); err != nil {
		return err
	}
	return store.ErrExists
}

// ResealSecret implements store.SecretStore.
func (d *DB) ResealSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte) (bool, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE secrets SET key_id = ?, sealed = ? WHERE owner = ? AND name = ? AND version = ?`,
		keyID, sealed, owner, name, version)
	if err != nil {
		return false, storeErr("reseal secret", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// TouchSecret implements store.SecretStore.
func (d *DB) TouchSecret(ctx context.Context, owner, name string, at time.Time) error {
	_, err := d.db.ExecContext(ctx, `UPDATE secrets SET last_used_at = ? WHERE owner = ? AND name = ?`, fmtTime(at), owner, name)
	return storeErr("touch secret", err)
}

// DeleteSecret implements store.SecretStore.
func (d *DB) DeleteSecret(ctx context.Context, owner, name string) error {
	res, err := d.db.ExecContext(ctx, `DELETE FROM secrets WHERE owner = ? AND name = ?`, owner, name)
	if err != nil {
		return storeErr("delete secret", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}
