package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

const batchColumns = `id, owner, status, template, language, code, concurrency, timeout_ms, retries, resources, created_at, ended_at, error_code, error, reuse,
	sandboxes, wall_nanos, cpu_nanos, gb_seconds_reserved, gb_seconds_used, executions,
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id),
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.status = 'done'),
	(SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.status = 'failed')`

// CreateBatch implements store.BatchStore.
func (d *DB) CreateBatch(ctx context.Context, b store.Batch, inputs []json.RawMessage) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("create batch", err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO batches (id, owner, status, template, language, code, concurrency, timeout_ms, retries, resources, created_at, reuse)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, b.Owner, b.Status, b.Template, b.Language, b.Code, b.Concurrency, b.TimeoutMS, b.Retries, nullJSON(b.Resources), fmtTime(b.CreatedAt), b.Reuse)
	if isUnique(err) {
		return store.ErrExists
	}
	if err != nil {
		return storeErr("create batch", err)
	}
	st, err := tx.PrepareContext(ctx, `INSERT INTO batch_items (batch_id, idx, input, status) VALUES (?, ?, ?, 'pending')`)
	if err != nil {
		return storeErr("create batch", err)
	}
	defer st.Close()
	for i, in := range inputs {
		if _, err := st.ExecContext(ctx, b.ID, i, string(in)); err != nil {
			return storeErr("create batch", err)
		}
	}
	return storeErr("create batch", tx.Commit())
}

func scanBatch(sc interface{ Scan(...any) error }) (store.Batch, error) {
	var b store.Batch
	var created string
	var ended, resources sql.NullString
	if err := sc.Scan(&b.ID, &b.Owner, &b.Status, &b.Template, &b.Language, &b.Code, &b.Concurrency, &b.TimeoutMS, &b.Retries,
		&resources, &created, &ended, &b.ErrorCode, &b.Error, &b.Reuse,
		&b.Usage.Sandboxes, &b.Usage.WallNanos, &b.Usage.CPUNanos, &b.Usage.GBSecondsReserved, &b.Usage.GBSecondsUsed, &b.Usage.Executions, &b.Total, &b.Done, &b.Failed); err != nil {
		return b, err
	}
	if resources.Valid {
		b.Resources = json.RawMessage(resources.String)
	}
	var err error
	if b.CreatedAt, err = parseTime(created); err != nil {
		return b, err
	}
	b.EndedAt, err = parseTimePtr(ended)
	return b, err
}

// GetBatch implements store.BatchStore.
func (d *DB) GetBatch(ctx context.Context, owner, id string) (store.Batch, error) {
	b, err := scanBatch(d.rd.QueryRowContext(ctx, `SELECT `+batchColumns+` FROM batches b WHERE id = ? AND owner = ?`, id, owner))
	if errors.Is(err, sql.ErrNoRows) {
		return b, store.ErrNotFound
	}
	return b, storeErr("get batch", err)
}

func (d *DB) listBatches(ctx context.Context, q string, args ...any) ([]store.Batch, error) {
	rows, err := d.rd.QueryContext(ctx, q, args...)
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
func (d *DB) ListBatches(ctx context.Context, owner string, limit int) ([]store.Batch, error) {
	return d.listBatches(ctx, `SELECT `+batchColumns+` FROM batches b WHERE owner = ? ORDER BY created_at DESC, id DESC LIMIT ?`, owner, limit)
}

// RunningBatches implements store.BatchStore.
func (d *DB) RunningBatches(ctx context.Context) ([]store.Batch, error) {
	return d.listBatches(ctx, `SELECT `+batchColumns+` FROM batches b WHERE status = 'running' ORDER BY created_at, id`)
}

const batchItemColumns = `batch_id, idx, input, status, attempts, result, error, ended_at`

func (d *DB) batchItems(ctx context.Context, q string, args ...any) ([]store.BatchItem, error) {
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list batch items", err)
	}
	defer rows.Close()
	out := []store.BatchItem{}
	for rows.Next() {
		var it store.BatchItem
		var input string
		var result, e, ended sql.NullString
		if err := rows.Scan(&it.BatchID, &it.Index, &input, &it.Status, &it.Attempts, &result, &e, &ended); err != nil {
			return nil, storeErr("list batch items", err)
		}
		it.Input = json.RawMessage(input)
		if result.Valid {
			it.Result = json.RawMessage(result.String)
		}
		if e.Valid {
			it.Error = json.RawMessage(e.String)
		}
		if it.EndedAt, err = parseTimePtr(ended); err != nil {
			return nil, storeErr("list batch items", err)
		}
		out = append(out, it)
	}
	return out, storeErr("list batch items", rows.Err())
}

// PendingBatchItems implements store.BatchStore.
func (d *DB) PendingBatchItems(ctx context.Context, batchID string) ([]store.BatchItem, error) {
	return d.batchItems(ctx, `SELECT `+batchItemColumns+` FROM batch_items WHERE batch_id = ? AND status = 'pending' ORDER BY idx`, batchID)
}

// PageBatchItems implements store.BatchStore.
func (d *DB) PageBatchItems(ctx context.Context, batchID string, after, limit int) ([]store.BatchItem, error) {
	return d.batchItems(ctx, `SELECT `+batchItemColumns+` FROM batch_items WHERE batch_id = ? AND status <> 'pending' AND idx > ? ORDER BY idx LIMIT ?`,
		batchID, after, limit)
}

func nullJSON(j json.RawMessage) any {
	if j == nil {
		return nil
	}
	return string(j)
}

// EndBatchItem implements store.BatchStore.
func (d *DB) EndBatchItem(ctx context.Context, it store.BatchItem) (bool, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE batch_items SET status = ?, attempts = ?, result = ?, error = ?, ended_at = ?
		WHERE batch_id = ? AND idx = ? AND status = 'pending'`,
		it.Status, it.Attempts, nullJSON(it.Result), nullJSON(it.Error), fmtTimePtr(it.EndedAt), it.BatchID, it.Index)
	if err != nil {
		return false, storeErr("end batch item", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// EndBatch implements store.BatchStore.
func (d *DB) EndBatch(ctx context.Context, id, status, code, message string, at time.Time) (bool, error) {
	res, err := d.db.ExecContext(ctx, `UPDATE batches SET status = ?, error_code = ?, error = ?, ended_at = ? WHERE id = ? AND status = 'running'`,
		status, code, message, fmtTime(at), id)
	if err != nil {
		return false, storeErr("end batch", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// AddBatchUsage implements store.BatchStore.
func (d *DB) AddBatchUsage(ctx context.Context, id string, u store.BatchUsage) error {
	_, err := d.db.ExecContext(ctx, `UPDATE batches SET sandboxes = sandboxes + ?, wall_nanos = wall_nanos + ?, cpu_nanos = cpu_nanos + ?,
		gb_seconds_reserved = gb_seconds_reserved + ?, gb_seconds_used = gb_seconds_used + ?, executions = executions + ? WHERE id = ?`,
		u.Sandboxes, u.WallNanos, u.CPUNanos, u.GBSecondsReserved, u.GBSecondsUsed, u.Executions, id)
	return storeErr("add batch usage", err)
}
