package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

const batchColumns = `id, owner, status, template, language, code, concurrency, timeout_ms, retries, resources, created_at, ended_at, error_code, error, reuse,
	sandboxes, wall_nanos, cpu_nanos, gb_seconds_reserved, gb_seconds_used, executions,
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id),
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.status = 'done'),
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.status = 'failed')`

// CreateBatch implements store.BatchStore.
func (s *Store) CreateBatch(ctx context.Context, b store.Batch, inputs []json.RawMessage) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("create batch", err)
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO batches (id, owner, status, template, language, code, concurrency, timeout_ms, retries, resources, created_at, reuse)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		b.ID, b.Owner, b.Status, b.Template, b.Language, b.Code, b.Concurrency, b.TimeoutMS, b.Retries, nullJSON(b.Resources), dbTime(b.CreatedAt), b.Reuse)
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create batch", err)
	}
	rows := make([][]any, len(inputs))
	for i, in := range inputs {
		rows[i] = []any{b.ID, i, string(in), store.BatchItemPending}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"batch_items"}, []string{"batch_id", "idx", "input", "status"}, pgx.CopyFromRows(rows)); err != nil {
		return storeErr("create batch", err)
	}
	return storeErr("create batch", tx.Commit(ctx))
}

func scanBatch(sc pgx.Row) (store.Batch, error) {
	var b store.Batch
	var resources *string
	err := sc.Scan(&b.ID, &b.Owner, &b.Status, &b.Template, &b.Language, &b.Code, &b.Concurrency, &b.TimeoutMS, &b.Retries,
		&resources, &b.CreatedAt, &b.EndedAt, &b.ErrorCode, &b.Error, &b.Reuse,
		&b.Usage.Sandboxes, &b.Usage.WallNanos, &b.Usage.CPUNanos, &b.Usage.GBSecondsReserved, &b.Usage.GBSecondsUsed, &b.Usage.Executions, &b.Total, &b.Done, &b.Failed)
	b.CreatedAt = b.CreatedAt.UTC()
	if resources != nil {
		b.Resources = json.RawMessage(*resources)
	}
	if b.EndedAt != nil {
		u := b.EndedAt.UTC()
		b.EndedAt = &u
	}
	return b, err
}

// GetBatch implements store.BatchStore.
func (s *Store) GetBatch(ctx context.Context, owner, id string) (store.Batch, error) {
	b, err := scanBatch(s.pool.QueryRow(ctx, `SELECT `+batchColumns+` FROM batches b WHERE id = $1 AND owner = $2`, id, owner))
	if errors.Is(err, pgx.ErrNoRows) {
		return b, store.ErrNotFound
	}
	return b, storeErr("get batch", err)
}

func (s *Store) listBatches(ctx context.Context, q string, args ...any) ([]store.Batch, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list batches", err)
	}
	defer rows.Close()
	out := []store.Batch{}
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, storeErr("list batches", err)
		}
		out = append(out, b)
	}
	return out, storeErr("list batches", rows.Err())
}

// ListBatches implements store.BatchStore.
func (s *Store) ListBatches(ctx context.Context, owner string, limit int) ([]store.Batch, error) {
	return s.listBatches(ctx, `SELECT `+batchColumns+` FROM batches b WHERE owner = $1 ORDER BY created_at DESC, id DESC LIMIT $2`, owner, limit)
}

// RunningBatches implements store.BatchStore.
func (s *Store) RunningBatches(ctx context.Context) ([]store.Batch, error) {
	return s.listBatches(ctx, `SELECT `+batchColumns+` FROM batches b WHERE status = 'running' ORDER BY created_at, id`)
}

const batchItemColumns = `batch_id, idx, input, status, attempts, result, error, ended_at`

func (s *Store) batchItems(ctx context.Context, q string, args ...any) ([]store.BatchItem, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list batch items", err)
	}
	defer rows.Close()
	out := []store.BatchItem{}
	for rows.Next() {
		var it store.BatchItem
		var input string
		var result, e *string
		if err := rows.Scan(&it.BatchID, &it.Index, &input, &it.Status, &it.Attempts, &result, &e, &it.EndedAt); err != nil {
			return nil, storeErr("list batch items", err)
		}
		it.Input = json.RawMessage(input)
		if result != nil {
			it.Result = json.RawMessage(*result)
		}
		if e != nil {
			it.Error = json.RawMessage(*e)
		}
		if it.EndedAt != nil {
			u := it.EndedAt.UTC()
			it.EndedAt = &u
		}
		out = append(out, it)
	}
	return out, storeErr("list batch items", rows.Err())
}

// PendingBatchItems implements store.BatchStore.
func (s *Store) PendingBatchItems(ctx context.Context, batchID string) ([]store.BatchItem, error) {
	return s.batchItems(ctx, `SELECT `+batchItemColumns+` FROM batch_items WHERE batch_id = $1 AND status = 'pending' ORDER BY idx`, batchID)
}

// PageBatchItems implements store.BatchStore.
func (s *Store) PageBatchItems(ctx context.Context, batchID string, after, limit int) ([]store.BatchItem, error) {
	return s.batchItems(ctx, `SELECT `+batchItemColumns+` FROM batch_items WHERE batch_id = $1 AND status <> 'pending' AND idx > $2 ORDER BY idx LIMIT $3`,
		batchID, after, limit)
}

func nullJSON(j json.RawMessage) *string {
	if j == nil {
		return nil
	}
	v := string(j)
	return &v
}

// EndBatchItem implements store.BatchStore.
func (s *Store) EndBatchItem(ctx context.Context, it store.BatchItem) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE batch_items SET status = $1, attempts = $2, result = $3, error = $4, ended_at = $5
		WHERE batch_id = $6 AND idx = $7 AND status = 'pending'`,
		it.Status, it.Attempts, nullJSON(it.Result), nullJSON(it.Error), dbTimePtr(it.EndedAt), it.BatchID, it.Index)
	if err != nil {
		return false, storeErr("end batch item", err)
	}
	return tag.RowsAffected() > 0, nil
}

// EndBatch implements store.BatchStore.
func (s *Store) EndBatch(ctx context.Context, id, status, code, message string, at time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE batches SET status = $1, error_code = $2, error = $3, ended_at = $4 WHERE id = $5 AND status = 'running'`,
		status, code, message, dbTime(at), id)
	if err != nil {
		return false, storeErr("end batch", err)
	}
	return tag.RowsAffected() > 0, nil
}

// AddBatchUsage implements store.BatchStore.
func (s *Store) AddBatchUsage(ctx context.Context, id string, u store.BatchUsage) error {
	_, err := s.pool.Exec(ctx, `UPDATE batches SET sandboxes = sandboxes + $1, wall_nanos = wall_nanos + $2, cpu_nanos = cpu_nanos + $3,
		gb_seconds_reserved = gb_seconds_reserved + $4, gb_seconds_used = gb_seconds_used + $5, executions = executions + $6 WHERE id = $7`,
		u.Sandboxes, u.WallNanos, u.CPUNanos, u.GBSecondsReserved, u.GBSecondsUsed, u.Executions, id)
	return storeErr("add batch usage", err)
}
