package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// Batches: items per second of a batch of small items (handler returns
// len(item)), each item in a fresh sandbox from the warm pool, and with
// reuse "worker" (one sandbox per worker).

// batchResult is one batch run of the bench.
type batchResult struct {
	Reuse       string  `json:"reuse"`
	Items       int     `json:"items"`
	Concurrency int     `json:"concurrency"`
	Failed      int     `json:"failed"`
	Seconds     float64 `json:"seconds"` // from the create's answer to the batch's end
	PerSecond   float64 `json:"items_per_second"`
	Sandboxes   int64   `json:"sandboxes"`
	CPUSeconds  float64 `json:"cpu_seconds"`
}

// batchBenchItems and batchBenchConcurrency are issue 36's bar: 1,000
// small items at concurrency 8.
const (
	batchBenchItems       = 1000
	batchBenchConcurrency = 8
)

func (b *bencher) batches(ctx context.Context) error {
	in := make([]json.RawMessage, batchBenchItems)
	for i := range in {
		in[i], _ = json.Marshal(strings.Repeat("x", i%50))
	}
	for _, reuse := range []string{"", "worker"} {
		if _, err := b.waitPool(ctx); err != nil {
			return err
		}
		made, err := b.c.CreateBatch(ctx, client.BatchRequest{Code: "def handler(item):\n    return len(item)\n", Inputs: in,
			Concurrency: batchBenchConcurrency, Reuse: reuse})
		if err != nil {
			return err
		}
		start := time.Now()
		done, err := b.c.WaitBatch(ctx, made.ID, 50*time.Millisecond)
		if err != nil {
			return err
		}
		secs := time.Since(start).Seconds()
		if done.Status != "done" || done.Done+done.Failed != batchBenchItems {
			return fmt.Errorf("batch %s (reuse %q) ended %s with %d done, %d failed of %d", done.ID, reuse, done.Status, done.Done, done.Failed, done.Total)
		}
		b.res.Batches = append(b.res.Batches, batchResult{Reuse: reuse, Items: batchBenchItems, Concurrency: batchBenchConcurrency,
			Failed: done.Failed, Seconds: secs, PerSecond: float64(batchBenchItems) / secs, Sandboxes: done.Usage.Sandboxes,
			CPUSeconds: done.Usage.CPUSeconds})
	}
	return nil
}

func printBatches(w io.Writer, rs []batchResult) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		reuse := "a fresh sandbox per item"
		if r.Reuse != "" {
			reuse = "reuse " + r.Reuse
		}
		fmt.Fprintf(w, "batch of %d len(item) at concurrency %d, %s: %.1f items/s (%.1f s, %d failed, %d sandboxes, %.1f CPU-s)\n",
			r.Items, r.Concurrency, reuse, r.PerSecond, r.Seconds, r.Failed, r.Sandboxes, r.CPUSeconds)
	}
}
