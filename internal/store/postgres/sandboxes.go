package postgres

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// policyText is a policy as stored: none is null.
func policyText(p json.RawMessage) string {
	if len(p) == 0 {
		return "null"
	}
	return string(p)
}

// PutSandbox implements store.Store: it inserts or replaces the record,
// and deletes the owner's stopped sandboxes past its bound.
func (s *Store) PutSandbox(ctx context.Context, sb store.Sandbox) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("put sandbox", err)
	}
	defer tx.Rollback(ctx)
	if err := s.putSandbox(ctx, tx, sb); err != nil {
		return err
	}
	return storeErr("put sandbox", tx.Commit(ctx))
}

// putSandbox writes a sandbox's record and trims the owner's sandboxes.
func (s *Store) putSandbox(ctx context.Context, tx pgx.Tx, sb store.Sandbox) error {
	_, err := tx.Exec(ctx, `INSERT INTO sandboxes
		(id, owner, template, state, created_at, expires_at, stopped_at, stop_reason, metadata, resources, policy)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, template = excluded.template, state = excluded.state,
			created_at = excluded.created_at, expires_at = excluded.expires_at, stopped_at = excluded.stopped_at,
			stop_reason = excluded.stop_reason, metadata = excluded.metadata, resources = excluded.resources,
			policy = excluded.policy`,
		sb.ID, sb.Owner, sb.Template, sb.State, dbTime(sb.CreatedAt), dbTime(sb.ExpiresAt), dbTimePtr(sb.StoppedAt),
		sb.StopReason, jsonText(sb.Metadata), jsonText(sb.Resources), policyText(sb.Policy))
	if err != nil {
		return storeErr("put sandbox", err)
	}
	_, err = s.trim(ctx, tx, sb.Owner, store.KindSandboxes)
	return trimErr(store.KindSandboxes, sb.Owner, err)
}

const sandboxCols = `id, owner, template, state, created_at, expires_at, stopped_at, stop_reason, metadata, resources, policy`

func scanSandbox(row pgx.Row) (store.Sandbox, error) {
	var sb store.Sandbox
	var meta, res, pol string
	err := row.Scan(&sb.ID, &sb.Owner, &sb.Template, &sb.State, &sb.CreatedAt, &sb.ExpiresAt, &sb.StoppedAt, &sb.StopReason,
		&meta, &res, &pol)
	sb.CreatedAt, sb.ExpiresAt, sb.StoppedAt = sb.CreatedAt.UTC(), sb.ExpiresAt.UTC(), utcPtr(sb.StoppedAt)
	sb.Metadata, sb.Resources = json.RawMessage(meta), json.RawMessage(res)
	if pol != "null" {
		sb.Policy = json.RawMessage(pol)
	}
	return sb, err
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1`, id))
	return sb, notFound("get sandbox", err)
}

// ListSandboxes implements store.Store, oldest first.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	var a args
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE true`
	if !f.AnyOwner {
		q += ` AND owner = ` + a.add(f.Owner)
	}
	switch {
	case f.Live:
		q += ` AND state IN (` + a.add(store.SandboxRunning) + `, ` + a.add(store.SandboxPaused) + `)`
	case f.State != "":
		q += ` AND state = ` + a.add(f.State)
	}
	if f.After != "" {
		// A cursor of a deleted record (pruned meanwhile) starts over at
		// nothing rather than at the beginning: the row compares with
		// NULL and selects no row.
		q += ` AND (created_at, id) > (SELECT created_at, id FROM sandboxes WHERE id = ` + a.add(f.After) + `)`
	}
	q += ` ORDER BY created_at, id`
	if f.Limit > 0 {
		q += ` LIMIT ` + a.add(f.Limit)
	}
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("list sandboxes", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Sandbox, error) { return scanSandbox(r) })
	return out, storeErr("list sandboxes", err)
}

// UpdateSandboxExpiry implements store.Store.
func (s *Store) UpdateSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET expires_at = $1 WHERE id = $2`, dbTime(expiresAt), id)
	if err != nil {
		return storeErr("update sandbox", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// UpdateSandboxPolicy implements store.Store.
func (s *Store) UpdateSandboxPolicy(ctx context.Context, id string, policy json.RawMessage) error {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET policy = $1 WHERE id = $2`, policyText(policy), id)
	if err != nil {
		return storeErr("update sandbox policy", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// SetSandboxPaused implements store.Store.
func (s *Store) SetSandboxPaused(ctx context.Context, id string, paused bool, expiresAt time.Time) error {
	state := store.SandboxRunning
	if paused {
		state = store.SandboxPaused
	}
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET state = $1, expires_at = $2 WHERE id = $3 AND state != $4`,
		state, dbTime(expiresAt), id, store.SandboxStopped)
	if err != nil {
		return storeErr("update sandbox", err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := s.GetSandbox(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// StopSandbox implements store.Store.
func (s *Store) StopSandbox(ctx context.Context, id, reason string, at time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE sandboxes SET state = $1, stopped_at = $2, stop_reason = $3
		WHERE id = $4 AND state != $1`, store.SandboxStopped, dbTime(at), reason, id)
	return storeErr("stop sandbox", err)
}

// StopAllRunning implements store.Store.
func (s *Store) StopAllRunning(ctx context.Context, reason string, at time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET state = $1,
		stopped_at = CASE WHEN expires_at <= $2 THEN expires_at ELSE $2 END,
		stop_reason = CASE WHEN expires_at <= $2 THEN $3 ELSE $4 END
		WHERE state = $5`,
		store.SandboxStopped, dbTime(at), store.ReasonTimedOut, reason, store.SandboxRunning)
	if err != nil {
		return 0, storeErr("stop sandboxes", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteStoppedBefore implements store.Store, in one transaction.
func (s *Store) DeleteStoppedBefore(ctx context.Context, t time.Time) (sandboxes, executions int, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, 0, storeErr("prune records", err)
	}
	defer tx.Rollback(ctx)
	at := dbTime(t)
	tag, err := tx.Exec(ctx, `DELETE FROM executions WHERE created_at < $1
		OR sandbox_id IN (SELECT id FROM sandboxes WHERE state = $2 AND stopped_at < $1)`, at, store.SandboxStopped)
	if err != nil {
		return 0, 0, storeErr("prune executions", err)
	}
	ne := tag.RowsAffected()
	if _, err := tx.Exec(ctx, `DELETE FROM sessions
		WHERE id IN (SELECT id FROM sandboxes WHERE state = $1 AND stopped_at < $2)`, store.SandboxStopped, at); err != nil {
		return 0, 0, storeErr("prune sessions", err)
	}
	tag, err = tx.Exec(ctx, `DELETE FROM sandboxes WHERE state = $1 AND stopped_at < $2`, store.SandboxStopped, at)
	if err != nil {
		return 0, 0, storeErr("prune sandboxes", err)
	}
	ns := tag.RowsAffected()
	if _, err := tx.Exec(ctx, `DELETE FROM meter_leases WHERE lease_until < $1`, at); err != nil {
		return 0, 0, storeErr("prune meter leases", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, storeErr("prune records", err)
	}
	return int(ns), int(ne), nil
}

// AddExecution implements store.Store, in one transaction. An execution
// recorded with its output clears the output of the sandbox's executions
// past the newest store.KeptOutputs, so that a sandbox's history stays
// bounded; the owner's oldest executions past its bound go.
func (s *Store) AddExecution(ctx context.Context, e store.Execution) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("add execution", err)
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO executions
		(id, sandbox_id, owner, language, status, error_code, error, execution_time_ms, cpu_time_ms, peak_memory_bytes,
		created_at, code, output, replica)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
		ON CONFLICT (id) DO UPDATE SET sandbox_id = excluded.sandbox_id, owner = excluded.owner, language = excluded.language,
			status = excluded.status, error_code = excluded.error_code, error = excluded.error,
			execution_time_ms = excluded.execution_time_ms, cpu_time_ms = excluded.cpu_time_ms,
			peak_memory_bytes = excluded.peak_memory_bytes, created_at = excluded.created_at, code = excluded.code,
			output = excluded.output, replica = excluded.replica`,
		e.ID, e.SandboxID, e.Owner, e.Language, e.Status, e.ErrorCode, e.Error, e.ExecutionTimeMS, e.CPUTimeMS,
		e.PeakMemoryBytes, dbTime(e.CreatedAt), []byte(e.Code), string(e.Output), e.Replica)
	if err != nil {
		return storeErr("add execution", err)
	}
	if len(e.Output) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE executions SET output = '' WHERE sandbox_id = $1 AND output != ''
			AND id NOT IN (SELECT id FROM executions WHERE sandbox_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2)`,
			e.SandboxID, store.KeptOutputs); err != nil {
			return storeErr("trim execution outputs", err)
		}
	}
	if _, err := s.trim(ctx, tx, e.Owner, store.KindExecutions); err != nil {
		return trimErr(store.KindExecutions, e.Owner, err)
	}
	return storeErr("add execution", tx.Commit(ctx))
}

// EndRunningExecutions implements store.Store.
func (s *Store) EndRunningExecutions(ctx context.Context, code, message string) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE executions SET status = $1, error_code = $2, error = $3 WHERE status = $4`,
		store.ExecutionError, code, message, store.ExecutionRunning)
	if err != nil {
		return 0, storeErr("end running executions", err)
	}
	return int(tag.RowsAffected()), nil
}

// ListExecutions implements store.Store, oldest first.
func (s *Store) ListExecutions(ctx context.Context, sandboxID string) ([]store.Execution, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+executionCols+` FROM executions
		WHERE sandbox_id = $1 ORDER BY created_at, id`, sandboxID)
	if err != nil {
		return nil, storeErr("list executions", err)
	}
	out, err := pgx.CollectRows(rows, scanExecution)
	return out, storeErr("list executions", err)
}

// PageExecutions implements store.Store: newest first, before the
// cursor's (created_at, id).
func (s *Store) PageExecutions(ctx context.Context, f store.ExecutionFilter) ([]store.Execution, error) {
	var a args
	sb := a.add(f.SandboxID)
	q := `SELECT ` + executionCols + ` FROM executions WHERE sandbox_id = ` + sb
	if f.Before != "" {
		q += ` AND (created_at, id) < (SELECT created_at, id FROM executions WHERE id = ` + a.add(f.Before) + ` AND sandbox_id = ` + sb + `)`
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		q += ` LIMIT ` + a.add(f.Limit)
	}
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("page executions", err)
	}
	out, err := pgx.CollectRows(rows, scanExecution)
	return out, storeErr("page executions", err)
}

const executionCols = `id, sandbox_id, owner, language, status, error_code, error,
		execution_time_ms, cpu_time_ms, peak_memory_bytes, created_at, code, output`

func scanExecution(row pgx.CollectableRow) (store.Execution, error) {
	var e store.Execution
	var code []byte // bytea (migrations/0008)
	var output string
	err := row.Scan(&e.ID, &e.SandboxID, &e.Owner, &e.Language, &e.Status, &e.ErrorCode, &e.Error,
		&e.ExecutionTimeMS, &e.CPUTimeMS, &e.PeakMemoryBytes, &e.CreatedAt, &code, &output)
	e.CreatedAt, e.Code = e.CreatedAt.UTC(), string(code)
	if output != "" {
		e.Output = json.RawMessage(output)
	}
	return e, err
}
