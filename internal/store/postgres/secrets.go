package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

const secretColumns = `owner, name, metadata, version, key_id, sealed, created_at, updated_at, last_used_at, use_count`

// CreateSecret implements store.SecretStore: the count and the insert
// under the account's advisory lock, one step for every server.
func (s *Store) CreateSecret(ctx context.Context, sec store.Secret, max int) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("create secret", err)
	}
	defer tx.Rollback(ctx)
	if err := lockAccount(ctx, tx, sec.Owner); err != nil {
		return storeErr("create secret", err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM secrets WHERE owner = $1`, sec.Owner).Scan(&n); err != nil {
		return storeErr("create secret", err)
	}
	if n >= max {
		return store.ErrLimit
	}
	_, err = tx.Exec(ctx, `INSERT INTO secrets (`+secretColumns+`) VALUES ($1, $2, $3, 1, $4, $5, $6, $6, NULL, 0)`,
		sec.Owner, sec.Name, jsonText(sec.Metadata), sec.KeyID, sec.Sealed, dbTime(sec.CreatedAt))
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create secret", err)
	}
	return storeErr("create secret", tx.Commit(ctx))
}

func scanSecret(sc pgx.Row) (store.Secret, error) {
	var s store.Secret
	var meta string
	if err := sc.Scan(&s.Owner, &s.Name, &meta, &s.Version, &s.KeyID, &s.Sealed, &s.CreatedAt, &s.UpdatedAt, &s.LastUsedAt, &s.UseCount); err != nil {
		return s, err
	}
	s.Metadata = json.RawMessage(meta)
	s.CreatedAt, s.UpdatedAt, s.LastUsedAt = s.CreatedAt.UTC(), s.UpdatedAt.UTC(), utcPtr(s.LastUsedAt)
	return s, nil
}

// GetSecret implements store.SecretStore.
func (s *Store) GetSecret(ctx context.Context, owner, name string) (store.Secret, error) {
	sec, err := scanSecret(s.pool.QueryRow(ctx, `SELECT `+secretColumns+` FROM secrets WHERE owner = $1 AND name = $2`, owner, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return sec, store.ErrNotFound
	}
	return sec, storeErr("get secret", err)
}

func (s *Store) listSecrets(ctx context.Context, what, q string, args ...any) ([]store.Secret, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, storeErr(what, err)
	}
	defer rows.Close()
	out := []store.Secret{}
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, storeErr(what, err)
		}
		out = append(out, sec)
	}
	return out, storeErr(what, rows.Err())
}

// ListSecrets implements store.SecretStore.
func (s *Store) ListSecrets(ctx context.Context, owner string) ([]store.Secret, error) {
	return s.listSecrets(ctx, "list secrets", `SELECT `+secretColumns+` FROM secrets WHERE owner = $1 ORDER BY name`, owner)
}

// SecretsNotSealedWith implements store.SecretStore.
func (s *Store) SecretsNotSealedWith(ctx context.Context, keyID string, limit int) ([]store.Secret, error) {
	return s.listSecrets(ctx, "list secrets to reseal", `SELECT `+secretColumns+` FROM secrets WHERE key_id <> $1
		ORDER BY owner, name LIMIT $2`, keyID, limit)
}

// UpdateSecret implements store.SecretStore.
func (s *Store) UpdateSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte, metadata json.RawMessage, at time.Time) error {
	var meta *string
	if metadata != nil {
		m := jsonText(metadata)
		meta = &m
	}
	tag, err := s.pool.Exec(ctx, `UPDATE secrets SET version = $1, key_id = $2, sealed = $3,
		metadata = coalesce($4, metadata), updated_at = $5 WHERE owner = $6 AND name = $7 AND version = $8`,
		version, keyID, sealed, meta, dbTime(at), owner, name, version-1)
	if err != nil {
		return storeErr("update secret", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	if _, err := s.GetSecret(ctx, owner, name); err != nil {
		return err
	}
	return store.ErrExists
}

// ResealSecret implements store.SecretStore.
func (s *Store) ResealSecret(ctx context.Context, owner, name string, version int64, keyID string, sealed []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE secrets SET key_id = $1, sealed = $2 WHERE owner = $3 AND name = $4 AND version = $5`,
		keyID, sealed, owner, name, version)
	if err != nil {
		return false, storeErr("reseal secret", err)
	}
	return tag.RowsAffected() == 1, nil
}

// TouchSecret implements store.SecretStore.
func (s *Store) TouchSecret(ctx context.Context, owner, name string, at time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE secrets SET last_used_at = $1 WHERE owner = $2 AND name = $3`, dbTime(at), owner, name)
	return storeErr("touch secret", err)
}

// DeleteSecret implements store.SecretStore.
func (s *Store) DeleteSecret(ctx context.Context, owner, name string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("delete secret", err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `DELETE FROM secrets WHERE owner = $1 AND name = $2`, owner, name)
	if err != nil {
		return storeErr("delete secret", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	if _, err := tx.Exec(ctx, `DELETE FROM secret_uses WHERE owner = $1 AND name = $2`, owner, name); err != nil {
		return storeErr("delete secret", err)
	}
	return storeErr("delete secret", tx.Commit(ctx))
}

// RecordSecretUses implements store.SecretStore, in one transaction.
func (s *Store) RecordSecretUses(ctx context.Context, uses []store.SecretUse) error {
	if len(uses) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("record secret uses", err)
	}
	defer tx.Rollback(ctx)
	touched := map[[2]string]bool{}
	for i := range uses {
		u := &uses[i]
		err := tx.QueryRow(ctx, `INSERT INTO secret_uses (owner, name, sandbox_id, host, method, path, outcome, at)
			SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE EXISTS (SELECT 1 FROM secrets WHERE owner = $1 AND name = $2)
			RETURNING id`, u.Owner, u.Name, u.SandboxID, u.Host, u.Method, u.Path, u.Outcome, dbTime(u.At)).Scan(&u.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return storeErr("record secret uses", err)
		}
		touched[[2]string{u.Owner, u.Name}] = true
		if u.Outcome == store.SecretInjected {
			if _, err := tx.Exec(ctx, `UPDATE secrets SET use_count = use_count + 1,
				last_used_at = greatest(coalesce(last_used_at, $1), $1) WHERE owner = $2 AND name = $3`,
				dbTime(u.At), u.Owner, u.Name); err != nil {
				return storeErr("record secret uses", err)
			}
		}
	}
	for k := range touched {
		if _, err := tx.Exec(ctx, `DELETE FROM secret_uses WHERE owner = $1 AND name = $2 AND id <= (
			SELECT id FROM secret_uses WHERE owner = $1 AND name = $2 ORDER BY id DESC LIMIT 1 OFFSET $3)`,
			k[0], k[1], store.MaxSecretUses); err != nil {
			return storeErr("record secret uses", err)
		}
	}
	return storeErr("record secret uses", tx.Commit(ctx))
}

// ListSecretUses implements store.SecretStore.
func (s *Store) ListSecretUses(ctx context.Context, owner, name string, before int64, limit int) ([]store.SecretUse, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := s.pool.Query(ctx, `SELECT id, owner, name, sandbox_id, host, method, path, outcome, at FROM secret_uses
		WHERE owner = $1 AND name = $2 AND id < $3 ORDER BY id DESC LIMIT $4`, owner, name, before, limit)
	if err != nil {
		return nil, storeErr("list secret uses", err)
	}
	defer rows.Close()
	out := []store.SecretUse{}
	for rows.Next() {
		var u store.SecretUse
		if err := rows.Scan(&u.ID, &u.Owner, &u.Name, &u.SandboxID, &u.Host, &u.Method, &u.Path, &u.Outcome, &u.At); err != nil {
			return nil, storeErr("list secret uses", err)
		}
		u.At = u.At.UTC()
		out = append(out, u)
	}
	return out, storeErr("list secret uses", rows.Err())
}
