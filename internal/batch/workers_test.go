package batch

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// countingRunner's workers return their item's number and count how many
// were made, closed and at work at once.
type countingRunner struct {
	mu                      sync.Mutex
	made, closed, busy, top int
	perWorker               []int // items each worker ran
}

type countingWorker struct {
	r *countingRunner
	i int
}

func (r *countingRunner) Worker(store.Batch) Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.made++
	r.perWorker = append(r.perWorker, 0)
	return &countingWorker{r: r, i: len(r.perWorker) - 1}
}

func (w *countingWorker) RunItem(_ context.Context, input json.RawMessage) Outcome {
	w.r.mu.Lock()
	w.r.busy++
	w.r.top = max(w.r.top, w.r.busy)
	w.r.perWorker[w.i]++
	w.r.mu.Unlock()
	time.Sleep(time.Millisecond)
	w.r.mu.Lock()
	w.r.busy--
	w.r.mu.Unlock()
	return Outcome{Result: input}
}

func (w *countingWorker) Close() {
	w.r.mu.Lock()
	w.r.closed++
	w.r.mu.Unlock()
}

// TestWorkers: a batch runs min(concurrency, items) workers, never more
// items at once than its concurrency, every worker closed before the
// batch ends, every item run once by one of them.
func TestWorkers(t *testing.T) {
	for _, c := range []struct{ items, conc, workers int }{{30, 4, 4}, {2, 8, 2}, {5, 1, 1}} {
		t.Run(strconv.Itoa(c.items)+"/"+strconv.Itoa(c.conc), func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			in := make([]json.RawMessage, c.items)
			for i := range in {
				in[i] = json.RawMessage(strconv.Itoa(i))
			}
			b := store.Batch{ID: "bat_w", Owner: "a", Status: store.BatchRunning, Template: "python", Language: "python",
				Concurrency: c.conc, CreatedAt: time.Now()}
			if err := st.CreateBatch(ctx, b, in); err != nil {
				t.Fatal(err)
			}
			r := &countingRunner{}
			m := New(st, r, nil)
			defer m.Close()
			m.Start(b)
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := st.GetBatch(ctx, "a", b.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.Status != store.BatchRunning {
					if got.Status != store.BatchDone || got.Done != c.items {
						t.Fatalf("ended %+v", got)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("never ended: %+v", got)
				}
				time.Sleep(5 * time.Millisecond)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			ran := 0
			for _, n := range r.perWorker {
				ran += n
			}
			if r.made != c.workers || r.closed != c.workers || r.top > c.conc || ran != c.items {
				t.Fatalf("workers made %d, closed %d, most at once %d, items run %d; want %d workers, at most %d at once, %d items",
					r.made, r.closed, r.top, ran, c.workers, c.conc, c.items)
			}
		})
	}
}
