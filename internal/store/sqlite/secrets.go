package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

const secretColumns = `owner, name, metadata, version, key_id, sealed, created_at, updated_at, last_used_at, use_count`

// CreateSecret implements store.SecretStore. Writes take turns on the one
// write handle, so the count and the insert of one statement are one step.
func (d *DB) CreateSecret(ctx context.Context, s store.Secret, max int) error {
	res, err := d.db.ExecContext(ctx, `INSERT INTO secrets (`+secretColumns+`)
		SELECT ?, ?, ?, 1, ?, ?, ?, ?, NULL, 0
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
	if err := sc.Scan(&s.Owner, &s.Name, &meta, &s.Version, &s.KeyID, &s.Sealed, &created, &updated, &used, &s.UseCount); err != nil {
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
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("delete secret", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE owner = ? AND name = ?`, owner, name)
	if err != nil {
		return storeErr("delete secret", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM secret_uses WHERE owner = ? AND name = ?`, owner, name); err != nil {
		return storeErr("delete secret", err)
	}
	return storeErr("delete secret", tx.Commit())
}

// RecordSecretUses implements store.SecretStore, in one transaction.
func (d *DB) RecordSecretUses(ctx context.Context, uses []store.SecretUse) error {
	if len(uses) == 0 {
		return nil
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("record secret uses", err)
	}
	defer tx.Rollback()
	touched := map[[2]string]bool{}
	for i := range uses {
		u := &uses[i]
		res, err := tx.ExecContext(ctx, `INSERT INTO secret_uses (owner, name, sandbox_id, host, method, path, outcome, at)
			SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM secrets WHERE owner = ? AND name = ?)`,
			u.Owner, u.Name, u.SandboxID, u.Host, u.Method, u.Path, u.Outcome, fmtTime(u.At), u.Owner, u.Name)
		if err != nil {
			return storeErr("record secret uses", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			continue
		}
		u.ID, _ = res.LastInsertId()
		touched[[2]string{u.Owner, u.Name}] = true
		if u.Outcome == store.SecretInjected {
			if _, err := tx.ExecContext(ctx, `UPDATE secrets SET use_count = use_count + 1,
				last_used_at = CASE WHEN last_used_at IS NULL OR last_used_at < ? THEN ? ELSE last_used_at END
				WHERE owner = ? AND name = ?`, fmtTime(u.At), fmtTime(u.At), u.Owner, u.Name); err != nil {
				return storeErr("record secret uses", err)
			}
		}
	}
	for k := range touched {
		if _, err := tx.ExecContext(ctx, `DELETE FROM secret_uses WHERE owner = ? AND name = ? AND id <= (
			SELECT id FROM secret_uses WHERE owner = ? AND name = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
			k[0], k[1], k[0], k[1], store.MaxSecretUses); err != nil {
			return storeErr("record secret uses", err)
		}
	}
	return storeErr("record secret uses", tx.Commit())
}

// ListSecretUses implements store.SecretStore.
func (d *DB) ListSecretUses(ctx context.Context, owner, name string, before int64, limit int) ([]store.SecretUse, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := d.rd.QueryContext(ctx, `SELECT id, owner, name, sandbox_id, host, method, path, outcome, at FROM secret_uses
		WHERE owner = ? AND name = ? AND id < ? ORDER BY id DESC LIMIT ?`, owner, name, before, limit)
	if err != nil {
		return nil, storeErr("list secret uses", err)
	}
	defer rows.Close()
	out := []store.SecretUse{}
	for rows.Next() {
		var u store.SecretUse
		var at string
		if err := rows.Scan(&u.ID, &u.Owner, &u.Name, &u.SandboxID, &u.Host, &u.Method, &u.Path, &u.Outcome, &at); err != nil {
			return nil, storeErr("list secret uses", err)
		}
		if u.At, err = parseTime(at); err != nil {
			return nil, storeErr("list secret uses", err)
		}
		out = append(out, u)
	}
	return out, storeErr("list secret uses", rows.Err())
}
