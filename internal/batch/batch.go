// Package batch runs batch jobs: a handler over many inputs (items),
// a batch's Concurrency workers at once, each taking the next pending
// item when it is free, each item's outcome stored as it ends
// (store.BatchStore).
//
// The package decides what runs when and what is stored; how an item
// runs is the Runner's (internal/server, batches.go): a fresh sandbox
// per item, or (Reuse "worker") one sandbox per worker kept from item to
// item, made through the server's create path, so that every sandbox is
// admitted, limited, metered and charged like any of its account.
//
// An item ends once (the store keeps its first outcome). An item that has
// not ended when its server stops stays pending, and Resume, at the next
// start, runs every pending item of every running batch again: what
// ended is never repeated; what was running when a server died runs
// again (at least once per item, exactly once per stored outcome).
//
// A batch's code is checked before any sandbox is used by the host's
// Python in a confined child process (HostCheck, hostcheck.go).
//
// Imports: internal/store, internal/apierr, internal/account,
// internal/sandbox (its refusals' causes), golang.org/x/net/bpf and
// golang.org/x/sys/unix (the host check's seccomp filter and limits) and
// the standard library.
package batch

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// ItemError is how an item failed: the handler's exception (Name, Value,
// Traceback) or the run's (Code, Value).
type ItemError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
	Code      string `json:"code,omitempty"`
}

// Outcome is what one run of an item gave.
type Outcome struct {
	Result json.RawMessage // the handler's return value, when it returned
	Err    *ItemError      // the attempt failed: retried, then stored
	// Refused is set when the item could not start: Wait says when to
	// try again (the account holds its sandboxes, the server is full) and
	// the attempt does not count; without Wait the batch fails with it
	// (credits or a monthly quota used up).
	Refused error
	Wait    time.Duration
}

// Runner makes a batch's workers: a batch runs Concurrency of them at
// once, each taking the next pending item when it is free.
type Runner interface {
	Worker(b store.Batch) Worker
}

// Worker runs items of one batch one after another: its code's handler
// over each input. Whether it keeps a sandbox from one item to the next
// is the Runner's (the batch's Reuse). Close ends what it holds.
type Worker interface {
	RunItem(ctx context.Context, input json.RawMessage) Outcome
	Close()
}

// Classify turns a refused create into an Outcome: a refusal that passes
// with time waits (ERR_SHUTTING_DOWN too: the server stops the batch
// next, and the next start takes it up), another fails the batch.
func Classify(err error) Outcome {
	ae := apierr.From(err)
	wait := ae.RetryAfter
	switch {
	case ae.Code == apierr.SessionQuotaExceeded && errors.Is(err, account.ErrConcurrentCap),
		ae.Code == apierr.SessionQuotaExceeded && errors.Is(err, sandbox.ErrDeviceCap), // the account's devices at once
		ae.Code == apierr.Capacity, ae.Code == apierr.RateLimited, ae.Code == apierr.StorageUnavailable,
		ae.Code == apierr.TooManyConnections, ae.Code == apierr.ShuttingDown,
		ae.Code == apierr.DeviceInUse: // its devices are held by other sandboxes, the batch's own included
		if wait <= 0 {
			wait = 100 * time.Millisecond
		}
		return Outcome{Refused: err, Wait: wait}
	}
	return Outcome{Refused: err}
}

// Manager runs the batches of one server.
type Manager struct {
	st  store.BatchStore
	run Runner
	log *slog.Logger

	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards jobs: the batches running here, by id.
	mu   sync.Mutex
	jobs map[string]context.CancelFunc
}

// New returns a Manager; Close stops it.
func New(st store.BatchStore, run Runner, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{st: st, run: run, log: log, jobs: map[string]context.CancelFunc{}}
	m.base, m.cancel = context.WithCancel(context.Background())
	return m
}

// Start runs a stored, running batch's pending items in the background.
func (m *Manager) Start(b store.Batch) {
	ctx, cancel := context.WithCancel(m.base)
	m.mu.Lock()
	if m.base.Err() != nil || m.jobs[b.ID] != nil {
		m.mu.Unlock()
		cancel()
		return
	}
	m.jobs[b.ID] = cancel
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.jobs, b.ID)
			m.mu.Unlock()
			cancel()
		}()
		m.runBatch(ctx, b)
	}()
}

// Resume starts every running batch in the store: what a stopped server
// left pending runs again.
func (m *Manager) Resume(ctx context.Context) error {
	bs, err := m.st.RunningBatches(ctx)
	if err != nil {
		return err
	}
	for _, b := range bs {
		m.Start(b)
	}
	return nil
}

// Cancel ends an owner's running batch: its pending items stay pending
// and are never run; those running are stopped. It returns the batch as
// stored after.
func (m *Manager) Cancel(ctx context.Context, owner, id string) (store.Batch, error) {
	b, err := m.st.GetBatch(ctx, owner, id)
	if err != nil {
		return b, err
	}
	if b.Status == store.BatchRunning {
		if _, err := m.st.EndBatch(ctx, id, store.BatchCanceled, "", "", time.Now()); err != nil {
			return b, err
		}
	}
	m.stopJob(id)
	return m.st.GetBatch(ctx, owner, id)
}

func (m *Manager) stopJob(id string) {
	m.mu.Lock()
	cancel := m.jobs[id]
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// Running reports whether a batch runs here now.
func (m *Manager) Running(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.jobs[id] != nil
}

// Close stops every batch here and waits for their items to stop: those
// that did not end stay pending, for Resume.
func (m *Manager) Close() {
	m.mu.Lock()
	m.cancel()
	m.mu.Unlock()
	m.wg.Wait()
}

func (m *Manager) runBatch(ctx context.Context, b store.Batch) {
	items, err := m.st.PendingBatchItems(ctx, b.ID)
	if err != nil {
		m.log.Error("batch: read its pending items; it is taken up at the next start", "batch", b.ID, "err", err)
		return
	}
	next := make(chan store.BatchItem)
	var wg sync.WaitGroup
	var fatal error
	var fatalOnce sync.Once
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	for range min(max(1, b.Concurrency), max(1, len(items))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := m.run.Worker(b)
			defer w.Close()
			for it := range next {
				if err := m.runItem(ctx, b, w, it); err != nil {
					fatalOnce.Do(func() { fatal = err; stop() })
				}
			}
		}()
	}
loop:
	for _, it := range items {
		select {
		case next <- it:
		case <-ctx.Done():
			break loop
		}
		if ctx.Err() != nil {
			break // both were ready: select chose at random
		}
	}
	close(next)
	wg.Wait()
	end := context.WithoutCancel(ctx)
	switch {
	case fatal != nil:
		ae := apierr.From(fatal)
		if _, err := m.st.EndBatch(end, b.ID, store.BatchFailed, string(ae.Code), ae.Message, time.Now()); err != nil {
			m.log.Error("batch: record its failure", "batch", b.ID, "err", err)
		}
	case ctx.Err() == nil:
		if _, err := m.st.EndBatch(end, b.ID, store.BatchDone, "", "", time.Now()); err != nil {
			m.log.Error("batch: record its end", "batch", b.ID, "err", err)
		}
	}
}

// runItem runs one item to its stored outcome, or until ctx ends (it then
// stays pending). It returns the error that fails the whole batch.
func (m *Manager) runItem(ctx context.Context, b store.Batch, w Worker, it store.BatchItem) error {
	attempts := 0
	for {
		if ctx.Err() != nil {
			return nil // the batch stopped: the item stays pending
		}
		out := w.RunItem(ctx, it.Input)
		if ctx.Err() != nil {
			return nil
		}
		if out.Refused != nil {
			if out.Wait <= 0 {
				return out.Refused
			}
			t := time.NewTimer(out.Wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		attempts++
		if out.Err != nil && attempts <= b.Retries {
			continue
		}
		now := time.Now()
		rec := store.BatchItem{BatchID: b.ID, Index: it.Index, Attempts: attempts, EndedAt: &now}
		if out.Err != nil {
			rec.Status = store.BatchItemFailed
			rec.Error, _ = json.Marshal(out.Err)
		} else {
			rec.Status, rec.Result = store.BatchItemDone, out.Result
		}
		if _, err := m.st.EndBatchItem(context.WithoutCancel(ctx), rec); err != nil {
			m.log.Error("batch: record an item's outcome; it runs again at the next start", "batch", b.ID, "item", it.Index, "err", err)
		}
		return nil
	}
}
