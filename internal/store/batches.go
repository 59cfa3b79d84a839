package store

import (
	"context"
	"encoding/json"
	"time"
)

// Batch states. A batch is BatchRunning until every item has ended
// (BatchDone), it is canceled (BatchCanceled) or it cannot go on
// (BatchFailed, with an error code and message).
const (
	BatchRunning  = "running"
	BatchDone     = "done"
	BatchCanceled = "canceled"
	BatchFailed   = "failed"
)

// Batch item states: an item is BatchItemPending until it ends, done
// with a result or failed with an error.
const (
	BatchItemPending = "pending"
	BatchItemDone    = "done"
	BatchItemFailed  = "failed"
)

// Batch is one batch job of an account (internal/batch): a handler run
// over many inputs. The counts are the store's, read with the record.
type Batch struct {
	ID          string
	Owner       string
	Status      string
	Template    string
	Language    string
	Code        string
	Concurrency int
	TimeoutMS   int64
	Retries     int
	Resources   json.RawMessage // what each item's sandbox asks for (api.Resources JSON); nil: the defaults
	CreatedAt   time.Time
	EndedAt     *time.Time
	ErrorCode   string
	Error       string
	// Reuse is how items share sandboxes: "" (each item a fresh
	// sandbox) or "worker" (each worker's items one sandbox).
	Reuse string

	Total, Done, Failed int // Pending is Total - Done - Failed
	// Usage is what the batch's sandboxes used (AddBatchUsage's sum).
	Usage BatchUsage
}

// BatchUsage is what a batch's sandboxes used, summed as each ends: how
// many, their wall, CPU and reserved and used memory time, and their
// executions.
type BatchUsage struct {
	Sandboxes         int64
	WallNanos         int64
	CPUNanos          int64
	GBSecondsReserved float64
	GBSecondsUsed     float64
	Executions        int64
}

// BatchItem is one input of a batch and, once it ended, its outcome:
// Result (the handler's return value as JSON) or Error (a JSON object:
// name, value, traceback, code).
type BatchItem struct {
	BatchID  string
	Index    int
	Input    json.RawMessage
	Status   string
	Attempts int
	Result   json.RawMessage
	Error    json.RawMessage
	EndedAt  *time.Time
}

// BatchStore persists batches and their items. An item ends once: a
// second EndBatchItem of an ended item changes nothing, so an item a
// restarted server runs again never replaces the first outcome.
type BatchStore interface {
	// CreateBatch stores b (running) and its inputs as pending items
	// numbered from 0, in one transaction.
	CreateBatch(ctx context.Context, b Batch, inputs []json.RawMessage) error
	// GetBatch returns an owner's batch with its counts; ErrNotFound for
	// another owner's or an unknown one.
	GetBatch(ctx context.Context, owner, id string) (Batch, error)
	// ListBatches lists an owner's batches, newest first, at most limit.
	ListBatches(ctx context.Context, owner string, limit int) ([]Batch, error)
	// RunningBatches lists every owner's running batches, oldest first:
	// what a starting server takes up again.
	RunningBatches(ctx context.Context) ([]Batch, error)
	// PendingBatchItems lists a batch's pending items by index.
	PendingBatchItems(ctx context.Context, batchID string) ([]BatchItem, error)
	// EndBatchItem records a pending item's outcome (Status, Attempts,
	// Result or Error, EndedAt); it reports whether the item was pending.
	EndBatchItem(ctx context.Context, it BatchItem) (bool, error)
	// EndBatch moves a running batch to status (with code and message
	// when failed) and reports whether it was running.
	EndBatch(ctx context.Context, id, status, code, message string, at time.Time) (bool, error)
	// PageBatchItems lists a batch's ended items with an index above
	// after, by index, at most limit.
	PageBatchItems(ctx context.Context, batchID string, after, limit int) ([]BatchItem, error)
	// AddBatchUsage adds u to a batch's usage (any status).
	AddBatchUsage(ctx context.Context, id string, u BatchUsage) error
}
