package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// BatchRequest runs Code's handler(item) over Inputs, each input in a
// fresh sandbox of Template, Concurrency at a time (CreateBatch).
type BatchRequest = api.BatchRequest

// Batch is a batch job: its status (running, done, canceled, failed) and
// its counts of items done, failed and pending.
type Batch = api.Batch

// BatchInputsFile names a batch's inputs as a JSON Lines file in one of
// the caller's volumes (BatchRequest.InputsFile; write it with
// WriteVolumeFile first).
type BatchInputsFile = api.BatchInputsFile

// BatchUsage is what a batch's sandboxes used and its cost (Batch.Usage).
type BatchUsage = api.BatchUsage

// BatchError is why a batch failed as a whole (credits or a quota ran
// out).
type BatchError = api.BatchError

// BatchResult is an ended item: Result (the handler's return value as
// JSON) or Error.
type BatchResult = api.BatchResult

// BatchItemError is how an item failed: the handler's exception (Name,
// Value, Traceback) or the run's (Code).
type BatchItemError = api.BatchItemError

// CreateBatch starts a batch. The code is checked first (parsed, not
// run): ErrInvalidHandler when it does not parse or binds no handler.
func (c *Client) CreateBatch(ctx context.Context, req BatchRequest) (*Batch, error) {
	var b Batch
	if err := c.call(ctx, request{method: "POST", path: "/v1/batches", json: req}, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// GetBatch returns one of the caller's batches; ErrNotFound for another
// account's.
func (c *Client) GetBatch(ctx context.Context, id string) (*Batch, error) {
	var b Batch
	if err := c.call(ctx, request{method: "GET", path: "/v1/batches/" + url.PathEscape(id)}, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// ListBatches returns the caller's batches, newest first.
func (c *Client) ListBatches(ctx context.Context) ([]Batch, error) {
	var body struct {
		Batches []Batch `json:"batches"`
	}
	if err := c.call(ctx, request{method: "GET", path: "/v1/batches"}, &body); err != nil {
		return nil, err
	}
	return body.Batches, nil
}

// CancelBatch cancels a batch: its pending items never run.
func (c *Client) CancelBatch(ctx context.Context, id string) (*Batch, error) {
	var b Batch
	if err := c.call(ctx, request{method: "POST", path: "/v1/batches/" + url.PathEscape(id) + "/cancel"}, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// BatchResults returns a page of at most limit (0: the server's page)
// ended items with an index above after (-1 for the first page), by
// index, and the after of the next page, or -1 when this one was the
// last of those ended so far.
func (c *Client) BatchResults(ctx context.Context, id string, after, limit int) ([]BatchResult, int, error) {
	q := url.Values{"after": {strconv.Itoa(after)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	res, err := c.do(ctx, request{method: "GET", path: "/v1/batches/" + url.PathEscape(id) + "/results", query: q,
		accept: "application/x-ndjson"})
	if err != nil {
		return nil, -1, err
	}
	defer res.Body.Close()
	out := []BatchResult{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var r BatchResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, -1, fmt.Errorf("sheepfold: decode a batch result: %w", err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, -1, err
	}
	next := -1
	if v := res.Header.Get("Sheepfold-Next-After"); v != "" {
		if next, err = strconv.Atoi(v); err != nil {
			return nil, -1, fmt.Errorf("sheepfold: Sheepfold-Next-After %q", v)
		}
	}
	return out, next, nil
}

// WaitBatch polls a batch every poll (a second when 0) until it is no
// longer running, and returns it.
func (c *Client) WaitBatch(ctx context.Context, id string, poll time.Duration) (*Batch, error) {
	if poll <= 0 {
		poll = time.Second
	}
	for {
		b, err := c.GetBatch(ctx, id)
		if err != nil || b.Status != "running" {
			return b, err
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}
