package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/batch"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// A batch's bounds: its inputs (each item a stored row and a sandbox),
// its concurrency (each a sandbox at once, within the account's own
// limits), its retries and each run's timeout.
const (
	maxBatchInputs      = 10000
	maxBatchConcurrency = 64
	maxBatchRetries     = 10
	maxBatchTimeoutMS   = 24 * 3600 * 1000
	// maxHostChecks bounds the host checks of batches' code running at
	// once (each a Python process of up to 1 GiB of address space);
	// others wait for a place.
	maxHostChecks = 4
)

// The ways a batch's items share sandboxes (api.BatchRequest.Reuse).
const (
	reuseNone   = ""
	reuseWorker = "worker"
)

func (s *Server) batchRoutes(add addFunc) {
	add("POST /v1/batches", true, s.createBatch)
	add("GET /v1/batches", true, s.listBatches)
	add("GET /v1/batches/{id}", true, s.getBatch)
	add("GET /v1/batches/{id}/results", true, s.batchResults)
	add("POST /v1/batches/{id}/cancel", true, s.cancelBatch)
}

// startBatches makes the server's batch manager and takes up the batches
// a stopped server left running (their pending items run again), unless
// the store is shared with replicas.
func (s *Server) startBatches() {
	s.batches = batch.New(s.store, batchRunner{s}, s.log)
	s.hostChecks = make(chan struct{}, maxHostChecks)
	s.hostPython = sync.OnceValues(func() (string, error) {
		if s.cfg.BatchCheckPython == "-" {
			return "", batch.ErrCheckUnavailable
		}
		v, err := s.hostCheck().Version(context.Background())
		if err != nil {
			s.log.Warn("batches: the host's Python cannot check batches' code; each check takes a sandbox", "err", err)
		}
		return v, err
	})
	if s.shared() {
		// Replicas would each take up every running batch: a batch
		// runs on the server that took it (docs/ARCHITECTURE.md).
		return
	}
	if err := s.batches.Resume(context.Background()); err != nil {
		s.log.Error("batches: take up those left running; they wait for the next start", "err", err)
	}
}

// stopBatches stops the items running here: those not ended stay
// pending, for the next start.
func (s *Server) stopBatches() {
	if s.batches != nil {
		s.batches.Close()
	}
}

func (s *Server) batchOf(b store.Batch) api.Batch {
	out := api.Batch{ID: b.ID, Status: b.Status, Template: b.Template, Language: b.Language, Concurrency: b.Concurrency,
		TimeoutMS: b.TimeoutMS, Retries: b.Retries, Reuse: b.Reuse, Total: b.Total, Done: b.Done, Failed: b.Failed,
		Pending: b.Total - b.Done - b.Failed, CreatedAt: b.CreatedAt.UTC(), EndedAt: b.EndedAt}
	u := b.Usage
	f := metering.FiguresOf(store.UsageDelta{WallNanos: u.WallNanos, CPUNanos: u.CPUNanos, GBSecondsReserved: u.GBSecondsReserved,
		GBSecondsUsed: u.GBSecondsUsed, Executions: u.Executions}, s.meter.Prices())
	out.Usage = api.BatchUsage{Sandboxes: u.Sandboxes, SandboxSeconds: f.SandboxSeconds, CPUSeconds: f.CPUSeconds,
		GBSecondsReserved: f.GBSecondsReserved, GBSecondsUsed: f.GBSecondsUsed, Executions: f.Executions, CostMicros: f.CostMicros, Cost: f.Cost}
	if b.ErrorCode != "" {
		out.Error = &api.BatchError{Code: b.ErrorCode, Message: b.Error}
	}
	out.Resources = batchResources(b)
	return out
}

// batchResources is what each item's sandbox of b asks for; nil for the
// server's defaults.
func batchResources(b store.Batch) *api.Resources {
	if b.Resources == nil {
		return nil
	}
	var r api.Resources
	if json.Unmarshal(b.Resources, &r) != nil {
		return nil
	}
	return &r
}

// itemOptions are the create options of each sandbox of b (its check's
// and its items'): its template and resources, its id in the metadata,
// and a lifetime beyond an item's timeout (the check's too: an account
// that may not keep a sandbox so long is refused before any item runs).
func (s *Server) itemOptions(b store.Batch, check bool) (sandbox.CreateOptions, error) {
	md := map[string]string{"batch": b.ID}
	if check {
		md["batch_check"] = "1"
	}
	// An item's sandbox outlives the item's timeout by the engine's
	// default lifetime: a worker's takes items while it has an item's
	// timeout left, so for at least that long.
	life := (itemBudget(b) + s.engine.DefaultTimeout()).Seconds()
	req := api.CreateSandbox{Template: b.Template, Resources: batchResources(b), Metadata: md, Timeout: &life}
	opt, _, err := s.createOptions(req)
	return opt, err
}

func batchNotFound(id string) error {
	return apierr.New(apierr.NotFound, "no batch %q", id)
}

func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) error {
	if s.batches == nil {
		return apierr.New(apierr.NotSupported, "this server runs no batches")
	}
	var req api.BatchRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Template == "" {
		req.Template = "python"
	}
	if req.Language == "" {
		req.Language = lang.Python
	}
	if req.Language != lang.Python {
		return apierr.New(apierr.UnsupportedLanguage, "batches run python handlers only, not %q", req.Language)
	}
	if req.Code == "" {
		return apierr.New(apierr.BadRequest, "code is required: it defines handler(item)")
	}
	if req.InputsFile != nil {
		if len(req.Inputs) > 0 {
			return apierr.New(apierr.BadRequest, "inputs and inputs_file are exclusive: give one")
		}
		in, err := s.readInputsFile(r.Context(), owner(r), *req.InputsFile)
		if err != nil {
			return err
		}
		req.Inputs = in
	}
	if len(req.Inputs) == 0 || len(req.Inputs) > maxBatchInputs {
		return apierr.New(apierr.BadRequest, "inputs must hold between 1 and %d items, not %d", maxBatchInputs, len(req.Inputs))
	}
	if req.Reuse != reuseNone && req.Reuse != reuseWorker {
		return apierr.New(apierr.BadRequest, "reuse must be empty (a fresh sandbox per item) or %q, not %q", reuseWorker, req.Reuse)
	}
	if req.Concurrency == 0 {
		req.Concurrency = 1
	}
	if req.Concurrency < 1 || req.Concurrency > maxBatchConcurrency {
		return apierr.New(apierr.BadRequest, "concurrency must be between 1 and %d", maxBatchConcurrency)
	}
	if req.Retries < 0 || req.Retries > maxBatchRetries {
		return apierr.New(apierr.BadRequest, "retries must be between 0 and %d", maxBatchRetries)
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > maxBatchTimeoutMS {
		return apierr.New(apierr.BadRequest, "timeout_ms must be from 0 (the engine's default) to %d", maxBatchTimeoutMS)
	}
	for i, in := range req.Inputs {
		if !json.Valid(in) {
			return apierr.New(apierr.BadRequest, "inputs[%d] is not JSON", i)
		}
	}
	b := store.Batch{ID: newID("bat_"), Owner: owner(r), Status: store.BatchRunning, Template: req.Template, Language: req.Language,
		Code: req.Code, Concurrency: req.Concurrency, TimeoutMS: req.TimeoutMS, Retries: req.Retries, CreatedAt: time.Now(),
		Total: len(req.Inputs), Reuse: req.Reuse}
	if req.Resources != nil {
		b.Resources, _ = json.Marshal(req.Resources)
	}
	used, err := s.checkHandler(r.Context(), b)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	if err := s.store.CreateBatch(ctx, b, req.Inputs); err != nil {
		return fmt.Errorf("record batch: %w", err)
	}
	if err := s.store.AddBatchUsage(ctx, b.ID, used); err != nil {
		s.log.Warn("batch: record its check's usage", "batch", b.ID, "err", err)
	}
	b.Usage = used
	s.batches.Start(b)
	writeJSON(w, http.StatusCreated, s.batchOf(b))
	return nil
}

// readInputsFile reads a batch's inputs from a JSON Lines file in one of
// owner's volumes: one JSON value a line, blank lines skipped, at most
// Config.MaxBatchInputsFileBytes and maxBatchInputs lines.
func (s *Server) readInputsFile(ctx context.Context, owner string, in api.BatchInputsFile) ([]json.RawMessage, error) {
	if in.Volume == "" || in.Path == "" {
		return nil, apierr.New(apierr.BadRequest, "inputs_file needs a volume and a path")
	}
	p := in.Path
	if strings.ContainsRune(p, 0) {
		return nil, apierr.New(apierr.BadRequest, "inputs_file.path must not contain NUL")
	}
	v, err := s.volume(ctx, owner, in.Volume)
	if err != nil {
		return nil, err
	}
	fsys, err := s.engine.OpenVolume(ctx, v.ID, v.SizeBytes)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	f, e, err := fsys.Open(p)
	if err != nil {
		return nil, volumeFileErr("inputs_file "+p, err)
	}
	defer f.Close()
	limit := s.cfg.MaxBatchInputsFileBytes
	if e.Size > limit {
		return nil, apierr.New(apierr.FileTooLarge, "inputs_file %s is %d bytes, above the limit of %d", p, e.Size, limit)
	}
	var out []json.RawMessage
	sc := bufio.NewScanner(io.LimitReader(f, limit+1))
	sc.Buffer(make([]byte, 0, 64<<10), int(limit)+1)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if len(out) == maxBatchInputs {
			return nil, apierr.New(apierr.BadRequest, "inputs_file %s holds more than %d inputs", p, maxBatchInputs)
		}
		if !json.Valid(line) {
			return nil, apierr.New(apierr.BadRequest, "inputs_file %s, line %d: not a JSON value", p, n)
		}
		out = append(out, json.RawMessage(bytes.Clone(line)))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, apierr.New(apierr.FileTooLarge, "inputs_file %s grew above the limit of %d bytes", p, limit)
		}
		return nil, fmt.Errorf("read inputs_file: %w", err)
	}
	return out, nil
}

func (s *Server) hostCheck() batch.HostCheck {
	return batch.HostCheck{Python: s.cfg.BatchCheckPython}
}

// invalidHandler is the refusal of code whose check said why.
func invalidHandler(res batch.CheckResult) error {
	msg := fmt.Sprintf("%s: %s", res.Name, res.Value)
	if res.Line > 0 {
		msg = fmt.Sprintf("%s: %s (line %d)", res.Name, res.Value, res.Line)
	}
	return apierr.New(apierr.InvalidHandler, "%s", msg)
}

// checkHandler checks a batch's code before any item runs, running none
// of it: a syntax error or no handler is ERR_INVALID_HANDLER. What the
// sandbox's create would refuse of every item (the account's ceiling,
// devices it could never hold) is refused first. The code is parsed by
// the host's Python in its confinement (batch.HostCheck), no sandbox
// used, where that Python is of the template's version; otherwise in
// one sandbox of its owner (created and charged like any), and it
// returns what that sandbox used.
func (s *Server) checkHandler(ctx context.Context, b store.Batch) (used store.BatchUsage, err error) {
	opt, err := s.itemOptions(b, true)
	if err != nil {
		return used, err
	}
	if ok, err := s.checkOnHost(ctx, b, opt); ok || err != nil {
		return used, err
	}
	sb, err := s.create(ctx, b.Owner, opt, 0, nil)
	if err != nil {
		return used, err
	}
	defer func() { used = s.killBatchSandbox(ctx, sb) }()
	mark := "\x1e" + newID("sfcheck_") + ":"
	ex, err := sb.Execute(ctx, sandbox.ExecuteRequest{ID: newID("exe_"), Code: batch.CheckScript(b.Code, mark), Language: lang.Python,
		Timeout: 30 * time.Second}, nil)
	if err != nil {
		return used, err
	}
	out, ok := batch.Marked(ex.Stdout, mark)
	var res batch.CheckResult
	if !ok || json.Unmarshal(out, &res) != nil {
		return used, fmt.Errorf("check batch handler: no verdict (status %s, error %+v)", ex.Status, ex.Error)
	}
	if !res.OK {
		return used, invalidHandler(res)
	}
	return used, nil
}

// checkOnHost checks b's code with the host's Python (batch.HostCheck)
// when it is of the version of b's template's; ok is false when it
// could not (check in a sandbox). Before, what every item's create
// would refuse is refused (opt: an item's create options): the account's
// ceiling, exhausted credits, a monthly quota reached, devices it could
// never hold. The concurrent cap is not: the items wait for a slot.
func (s *Server) checkOnHost(ctx context.Context, b store.Batch, opt sandbox.CreateOptions) (ok bool, err error) {
	host, err := s.hostPython()
	if err != nil {
		return false, nil
	}
	rootfs, err := s.engine.TemplateRootFS(b.Template)
	if err != nil {
		return false, nil // the sandbox's create says why
	}
	if v, known := batch.TemplatePython(rootfs); !known || v != host {
		return false, nil
	}
	a, err := s.grant(ctx, b.Owner, &opt)
	if err != nil {
		return false, err
	}
	if a != nil {
		if err := a.CheckStart(); err != nil { // credits, monthly quotas
			return false, err
		}
	}
	if err := s.engine.CheckDevices(opt); err != nil {
		return false, err
	}
	select {
	case s.hostChecks <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	res, err := s.hostCheck().Check(ctx, b.Code)
	<-s.hostChecks
	var failed *batch.CheckFailure
	switch {
	case errors.As(err, &failed):
		return false, apierr.Wrap(err, apierr.InvalidHandler, "%s", failed.Error())
	case errors.Is(err, batch.ErrCheckUnavailable):
		s.log.Warn("batch: the host check could not run; the code is checked in a sandbox", "batch", b.ID, "err", err)
		return false, nil
	case err != nil:
		return false, err
	case !res.OK:
		return false, invalidHandler(res)
	}
	return true, nil
}

// killBatchSandbox ends a sandbox a batch made, as a DELETE would, and
// returns what it used (to its last sample, taken just before the kill;
// nothing when its usage is the shared store's: replicas meter it).
func (s *Server) killBatchSandbox(ctx context.Context, sb *sandbox.Sandbox) store.BatchUsage {
	ctx = context.WithoutCancel(ctx)
	var used store.BatchUsage
	if d, ok := s.meter.Live(sb.ID); ok {
		used = store.BatchUsage{Sandboxes: 1, WallNanos: d.WallNanos, CPUNanos: d.CPUNanos, GBSecondsReserved: d.GBSecondsReserved,
			GBSecondsUsed: d.GBSecondsUsed, Executions: d.Executions}
	}
	s.mu.Lock()
	b := s.boxes[sb.ID]
	s.mu.Unlock()
	if err := s.recordKill(ctx, sb.ID); err != nil {
		s.log.Warn("batch: record a sandbox's kill", "sandbox", sb.ID, "err", err)
	}
	if err := s.engine.Kill(ctx, sb.ID); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		s.log.Warn("batch: kill a sandbox", "sandbox", sb.ID, "err", err)
	}
	if b != nil {
		s.forget(ctx, b)
	}
	return used
}

// batchRunner runs a batch's items through the server's create and
// execute paths (batch.Runner).
type batchRunner struct{ s *Server }

// Worker implements batch.Runner.
func (br batchRunner) Worker(b store.Batch) batch.Worker {
	return &batchWorker{s: br.s, b: b}
}

// batchWorker runs items of one batch, one after another: each in a fresh
// sandbox of the batch's owner (from the warm pool when it can), killed
// after it; or, with reuse "worker", all in one sandbox, made at the
// first item (the batch's code run once in it) and kept until the worker
// ends, or until a run fails other than by the handler's exception (a
// timeout, a killed kernel, a cut output: the next item gets a fresh
// one; and a kernel that restarted runs the code again before its next
// item). Every sandbox's usage is added to the batch's as it is killed.
type batchWorker struct {
	s *Server
	b store.Batch
	// sb is the worker's sandbox (reuse "worker" only); nil between.
	sb *sandbox.Sandbox
}

// Close implements batch.Worker.
func (w *batchWorker) Close() { w.drop(context.Background()) }

// drop kills the worker's sandbox, if any, and adds its usage to the
// batch's.
func (w *batchWorker) drop(ctx context.Context) {
	if w.sb == nil {
		return
	}
	sb := w.sb
	w.sb = nil
	w.s.endBatchSandbox(ctx, w.b.ID, sb)
}

// endBatchSandbox kills a batch's sandbox and adds what it used to the
// batch's usage.
func (s *Server) endBatchSandbox(ctx context.Context, batchID string, sb *sandbox.Sandbox) {
	used := s.killBatchSandbox(ctx, sb)
	if used == (store.BatchUsage{}) {
		return
	}
	if err := s.store.AddBatchUsage(context.WithoutCancel(ctx), batchID, used); err != nil {
		s.log.Warn("batch: record a sandbox's usage", "batch", batchID, "sandbox", sb.ID, "err", err)
	}
}

// execute runs code in sb as one recorded execution of the batch's
// owner; a non-nil Outcome is how the run failed.
func (w *batchWorker) execute(ctx context.Context, sb *sandbox.Sandbox, code string) (*sandbox.Execution, *batch.Outcome) {
	s, b := w.s, w.b
	req := sandbox.ExecuteRequest{ID: newID("exe_"), Code: code, Language: lang.Python,
		Timeout: time.Duration(b.TimeoutMS) * time.Millisecond}
	rec := s.recordExecution(ctx, sb.ID, b.Owner, req.ID, lang.Python, code)
	ex, err := sb.Execute(ctx, req, nil)
	rec.EndWritten(ex, err) // before the item's result: a crash between them repeats the item, never loses its run
	if err != nil {
		ae := apierr.From(err)
		if ae.Code == apierr.RateLimited || ae.Code == apierr.SessionQuotaExceeded {
			out := batch.Classify(err) // the account's executions: wait, or fail the batch
			return ex, &out
		}
		return ex, &batch.Outcome{Err: &batch.ItemError{Name: string(ae.Code), Value: ae.Message, Code: string(ae.Code)}}
	}
	if ex.Error != nil {
		return ex, &batch.Outcome{Err: &batch.ItemError{Name: ex.Error.Name, Value: ex.Error.Value, Traceback: ex.Error.Traceback,
			Code: string(ex.ErrorCode)}}
	}
	if ex.ErrorCode != "" {
		return ex, &batch.Outcome{Err: &batch.ItemError{Name: string(ex.ErrorCode), Value: "the run ended with " + ex.Status,
			Code: string(ex.ErrorCode)}}
	}
	return ex, nil
}

// itemBudget is the time a kept sandbox must have left to take an item:
// the item's timeout (a minute when the engine's default).
func itemBudget(b store.Batch) time.Duration {
	d := time.Duration(b.TimeoutMS) * time.Millisecond
	if d <= 0 {
		d = time.Minute
	}
	return d
}

// RunItem implements batch.Worker.
func (w *batchWorker) RunItem(ctx context.Context, input json.RawMessage) batch.Outcome {
	s, b := w.s, w.b
	reuse := b.Reuse == reuseWorker
	if w.sb != nil && time.Until(w.sb.Deadline()) < itemBudget(b) {
		// The worker's sandbox would end (its lifetime) before the
		// item could: a fresh one takes it.
		w.drop(ctx)
	}
	sb := w.sb
	kept := sb != nil
	if sb == nil {
		opt, err := s.itemOptions(b, false)
		if err != nil {
			return batch.Outcome{Refused: err}
		}
		if sb, err = s.create(ctx, b.Owner, opt, 0, nil); err != nil {
			return batch.Classify(err)
		}
		if reuse {
			w.sb = sb
		} else {
			defer s.endBatchSandbox(ctx, b.ID, sb)
		}
	}
	mark := "\x1e" + newID("sfitem_") + ":"
	code := batch.Script(b.Code, input, mark)
	if reuse {
		code = batch.WorkerScript(b.Code, input, mark)
	}
	ex, out := w.execute(ctx, sb, code)
	if out != nil && kept && out.Err != nil && (out.Err.Code == string(apierr.SandboxNotFound) || out.Err.Code == string(apierr.SandboxState)) {
		// The kept sandbox ended between items (killed, or its
		// lifetime): not the item's doing; it runs in a fresh one.
		w.drop(ctx)
		return w.RunItem(ctx, input)
	}
	if out != nil {
		if reuse && out.Err != nil && out.Err.Code != "" {
			// Not the handler's own exception: the kernel may be gone
			// or cut midway; the next item starts afresh.
			w.drop(ctx)
		}
		return *out
	}
	res, ok := batch.Marked(ex.Stdout, mark)
	if !ok {
		if reuse {
			w.drop(ctx)
		}
		return batch.Outcome{Err: &batch.ItemError{Name: "ResultMissing",
			Value: "the handler's result is not in the run's output (was the output cut at its limit?)"}}
	}
	return batch.Outcome{Result: res}
}

// A batch's progress stream (GET /v1/batches/{id} as SSE, or NDJSON
// with ?stream=1) holds a stream of its key and account while it runs.
func init() {
	streamRoutes["GET /v1/batches/{id}"] = func(r *http.Request) bool { return wantStream(r, streamNone) != streamNone }
}

// batchStreamInterval is how often a progress stream reads its batch.
const batchStreamInterval = 250 * time.Millisecond

func (s *Server) getBatch(w http.ResponseWriter, r *http.Request) error {
	b, err := s.store.GetBatch(r.Context(), owner(r), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return batchNotFound(r.PathValue("id"))
	}
	if err != nil {
		return err
	}
	if mode := wantStream(r, streamNone); mode != streamNone {
		s.streamBatch(w, r, mode, b)
		return nil
	}
	writeJSON(w, http.StatusOK, s.batchOf(b))
	return nil
}

// streamBatch sends a "progress" event (the batch) at once and whenever
// its counts change, then a last "done" event once it is no longer
// running; a "failure" event if it cannot go on (the server drains).
func (s *Server) streamBatch(w http.ResponseWriter, r *http.Request, mode streamMode, b store.Batch) {
	st := newStreamer(w, mode)
	t := time.NewTicker(batchStreamInterval)
	defer t.Stop()
	var sent *api.Batch
	for {
		out := s.batchOf(b)
		if out.Status != store.BatchRunning {
			s.end(st, w, r, nil, "done", out, map[string]any{"type": "done", "batch": out})
			return
		}
		if sent == nil || sent.Done != out.Done || sent.Failed != out.Failed {
			st.send("progress", out, map[string]any{"type": "progress", "batch": out})
			sent = &out
		}
		if st.err() != nil {
			st.finish()
			return
		}
		select {
		case <-t.C:
		case <-r.Context().Done():
			st.finish()
			return
		case <-s.streamsDone:
			s.end(st, w, r, apierr.New(apierr.ShuttingDown, "the server is shutting down; ask again"), "", nil, nil)
			return
		}
		var err error
		if b, err = s.store.GetBatch(r.Context(), b.Owner, b.ID); err != nil {
			s.end(st, w, r, err, "", nil, nil)
			return
		}
	}
}

func (s *Server) listBatches(w http.ResponseWriter, r *http.Request) error {
	limit, err := pageLimit(r)
	if err != nil {
		return err
	}
	bs, err := s.store.ListBatches(r.Context(), owner(r), limit)
	if err != nil {
		return err
	}
	out := make([]api.Batch, len(bs))
	for i, b := range bs {
		out[i] = s.batchOf(b)
	}
	writeJSON(w, http.StatusOK, map[string]any{"batches": out})
	return nil
}

func (s *Server) cancelBatch(w http.ResponseWriter, r *http.Request) error {
	if s.batches == nil {
		return batchNotFound(r.PathValue("id"))
	}
	b, err := s.batches.Cancel(context.WithoutCancel(r.Context()), owner(r), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return batchNotFound(r.PathValue("id"))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.batchOf(b))
	return nil
}

// batchResults writes a page of a batch's ended items as JSON Lines, by
// index; ?after=N starts after index N, and Sheepfold-Next-After, set
// when the page is full, is the after of the next page.
func (s *Server) batchResults(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := s.store.GetBatch(r.Context(), owner(r), id); errors.Is(err, store.ErrNotFound) {
		return batchNotFound(id)
	} else if err != nil {
		return err
	}
	limit, err := pageLimit(r)
	if err != nil {
		return err
	}
	after := -1
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := bound.ParseInt("after", v, -1, maxBatchInputs)
		if err != nil {
			return err
		}
		after = int(n)
	}
	items, err := s.store.PageBatchItems(r.Context(), id, after, limit)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	if len(items) == limit {
		w.Header().Set("Sheepfold-Next-After", strconv.Itoa(items[len(items)-1].Index))
	}
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, it := range items {
		line := api.BatchResult{Index: it.Index, Status: it.Status, Attempts: it.Attempts, Result: it.Result, EndedAt: it.EndedAt}
		if it.Error != nil {
			line.Error = &api.BatchItemError{}
			_ = json.Unmarshal(it.Error, line.Error)
		}
		if err := enc.Encode(line); err != nil {
			return nil // the client went away
		}
	}
	return nil
}
