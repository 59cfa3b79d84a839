package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

func (s *Server) executeRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/execute", true, s.execute)
}

// executionOf is an execution as the contract shows it: the engine's
// api.Execution, without what the engine keeps for itself.
func executionOf(ex *sandbox.Execution) *api.Execution {
	if ex == nil {
		return nil
	}
	return &ex.Execution
}

type textJSON struct {
	Text string `json:"text"`
}

// execTimeout is an execution's timeout: the request's, else the sandbox's
// max_execution_time, else the engine's default; never more than the
// sandbox's max_execution_time.
func (b *box) execTimeoutFor(ms *int64) (time.Duration, error) {
	var d time.Duration
	if ms != nil {
		if *ms <= 0 || *ms > 24*3600*1000 {
			return 0, apierr.New(apierr.BadRequest, "timeout_ms must be between 1 and 86400000")
		}
		d = time.Duration(*ms) * time.Millisecond
	}
	if b.execTimeout > 0 && (d == 0 || d > b.execTimeout) {
		d = b.execTimeout
	}
	return d, nil
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) error {
	entered := time.Now()
	var req api.ExecuteRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	timeout, err := b.execTimeoutFor(req.TimeoutMS)
	if err != nil {
		return err
	}
	ereq := sandbox.ExecuteRequest{ID: newID("exe_"), Code: req.Code, Language: req.Language, ContextID: req.ContextID,
		Env: req.Env, Timeout: timeout}
	rec := s.beginExecution(r, b, ereq.ID, req)

	mode := wantStream(r, streamNone)
	if mode == streamNone {
		ctx := r.Context()
		var tr *sandbox.ExecTrace
		if s.traceExec {
			tr = &sandbox.ExecTrace{}
			ctx = sandbox.WithExecTrace(ctx, tr)
			defer s.logTrace(r, entered, tr, time.Now)()
		}
		ex, err := b.sb.Execute(ctx, ereq, nil)
		rec.End(ex, err)
		if tr != nil {
			tr.Recorded = time.Now()
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, executionOf(ex))
		return nil
	}
	// A language no kernel speaks is a plain 400 however long the host
	// takes to find it: the stream's headers go after commitDelay.
	if req.ContextID == "" {
		if _, err := lang.Canonical(req.Language); err != nil {
			err := apierr.New(apierr.UnsupportedLanguage, "unsupported language %q", req.Language)
			rec.End(nil, err)
			return err
		}
	}
	// The events are streamed as they come and not repeated: the done
	// event's execution has no stdout, stderr or results of its own.
	st := newStreamer(w, mode)
	texts := textStreams{}
	ex, err := b.sb.Execute(r.Context(), ereq, func(ev agentproto.Event) error {
		rec.Event(ev)
		switch ev.Type {
		case agentproto.EventStdout, agentproto.EventStderr:
			if text := texts.text(ev.Type, ev.Data); text != "" {
				st.send(ev.Type, textJSON{text}, map[string]any{"type": ev.Type, "text": text})
			}
		case agentproto.EventResult:
			if ev.Result != nil {
				st.send("result", ev.Result, map[string]any{"type": "result", "result": ev.Result})
			}
		case agentproto.EventError:
			if ev.Error != nil {
				st.send("error", ev.Error, map[string]any{"type": "error", "error": ev.Error})
			}
		}
		return st.err()
	})
	rec.End(ex, err)
	view := executionOf(ex)
	s.end(st, w, r, err, "done", view, map[string]any{"type": "done", "execution": view})
	return nil
}

// An executionRecord is an execution's record in the store: written as
// it ends, and, for an execution still running runningRecordAfter after
// it started, also then with status running, so that an execution a crash
// cuts leaves a record (which the next start ends with "server
// restarted", or with replicas the others' collector: shared.go). An
// execution that ends sooner (a warm 1+1 takes about a millisecond) is
// written once. Both writes run off the caller's path: the reply does not
// wait for the store (recordWrites), and every read of an account's
// executions waits for that account's writes under way. So a crash in the
// first runningRecordAfter of an execution, or between its reply and its
// record's write (a fraction of a millisecond; more on a loaded store),
// leaves no record of it; what it is billed for is counted apart
// (internal/metering), not from this record.
type executionRecord struct {
	s        *Server
	ctx      context.Context // the request's values, never canceled
	rec      store.Execution
	running  *time.Timer     // writes the running record; stopped by an End that comes first
	started  chan struct{}   // closed once the running record is written (or will not be)
	streamed *outputRecorder // a streamed execution's output as it came; nil when not streamed
	texts    textStreams     // Event's decoding of streamed text
}

func (s *Server) beginExecution(r *http.Request, b *box, id string, req api.ExecuteRequest) *executionRecord {
	language := req.Language
	if language == "" && req.ContextID == "" {
		language = lang.Python
	}
	return s.recordExecution(r.Context(), b.sb.ID, b.owner, id, language, req.Code)
}

// runningRecordAfter is how long an execution runs before its record is
// written with status running (a variable for tests).
var runningRecordAfter = 50 * time.Millisecond

// recordExecution starts the record of an execution in the store.
func (s *Server) recordExecution(ctx context.Context, sandboxID, owner, id, lang, code string) *executionRecord {
	er := &executionRecord{s: s, ctx: context.WithoutCancel(ctx), started: make(chan struct{}), texts: textStreams{},
		rec: store.Execution{ID: id, SandboxID: sandboxID, Owner: owner, Language: lang,
			Status: store.ExecutionRunning, CreatedAt: time.Now(), Code: cutUTF8(code, maxRecordedCode), Replica: s.replica}}
	er.running = time.AfterFunc(runningRecordAfter, func() {
		defer close(er.started)
		er.write(er.rec)
	})
	return er
}

// ID is the execution's id (e2b.RecordedExecution).
func (er *executionRecord) ID() string { return er.rec.ID }

// Event records a streamed event's output (e2b.RecordedExecution): the
// record of a streamed execution is its output as it came.
func (er *executionRecord) Event(ev agentproto.Event) {
	if er.streamed == nil {
		er.streamed = &outputRecorder{}
	}
	switch ev.Type {
	case agentproto.EventStdout, agentproto.EventStderr:
		if text := er.texts.text(ev.Type, ev.Data); text != "" {
			er.streamed.text(ev.Type, text)
		}
	case agentproto.EventResult:
		if ev.Result != nil {
			er.streamed.result(*ev.Result)
		}
	}
}

// End records how the execution ended: its outcome, or the error that
// ended it without one (e2b.RecordedExecution). The write runs beside
// the reply.
func (er *executionRecord) End(ex *sandbox.Execution, err error) { er.end(ex, err, false) }

// EndWritten is End that returns once the record is written: for a
// caller that stores what the execution made next (a batch item's
// result), which must never stand without the execution's record.
func (er *executionRecord) EndWritten(ex *sandbox.Execution, err error) { er.end(ex, err, true) }

func (er *executionRecord) end(ex *sandbox.Execution, err error, wait bool) {
	rec := er.rec
	switch {
	case err != nil:
		ae := apierr.From(err)
		rec.Status, rec.ErrorCode, rec.Error = store.ExecutionError, string(ae.Code), ae.Message
	case ex != nil:
		rec.Status, rec.ErrorCode, rec.ExecutionTimeMS = ex.Status, string(ex.ErrorCode), ex.ExecutionTimeMS
		rec.CPUTimeMS, rec.PeakMemoryBytes = ex.CPUTimeMS, ex.PeakMemoryBytes
		rec.Output = recordOutput(ex, er.streamed)
	}
	running := !er.running.Stop() // the running record is being written: the end replaces it
	end := func() {
		if running {
			<-er.started
		}
		er.write(rec)
	}
	if wait {
		end()
		return
	}
	pw := er.s.records.begin(rec.Owner)
	if pw == nil {
		end() // too many of the account's writes under way: this one waits
		return
	}
	go func() {
		defer er.s.records.done(rec.Owner, pw)
		end()
	}()
}

// maxRecordWrites bounds the execution records of one account written
// beside the replies at once; past it, an execution's reply waits for its
// record (the store sets the pace, as it did before the writes left the
// reply's path).
const maxRecordWrites = 64

// recordWrites holds the execution records being written after their
// replies, per account, so that reads of an account's executions (its
// history, its storage) see every execution already answered.
type recordWrites struct {
	// mu guards by: each account's writes under way.
	mu sync.Mutex
	by map[string]map[*recordWrite]struct{}
}

// A recordWrite is one write under way; done is closed when it is over.
type recordWrite struct{ done chan struct{} }

// begin adds a write of owner's; nil when owner has maxRecordWrites
// under way (the caller then writes in its own time).
func (w *recordWrites) begin(owner string) *recordWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[string]map[*recordWrite]struct{}{}
	}
	set := w.by[owner]
	if set == nil {
		set = map[*recordWrite]struct{}{}
		w.by[owner] = set
	}
	if len(set) >= maxRecordWrites {
		return nil
	}
	pw := &recordWrite{done: make(chan struct{})}
	set[pw] = struct{}{}
	return pw
}

// done ends a write begun with begin.
func (w *recordWrites) done(owner string, pw *recordWrite) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.by[owner], pw)
	if len(w.by[owner]) == 0 {
		delete(w.by, owner)
	}
	close(pw.done)
}

// wait waits until the writes of owner's under way when it is called are
// over (owner "" : everyone's), or until ctx ends.
func (w *recordWrites) wait(ctx context.Context, owner string) error {
	w.mu.Lock()
	var pending []*recordWrite
	for o, set := range w.by {
		if owner == "" || o == owner {
			for pw := range set {
				pending = append(pending, pw)
			}
		}
	}
	w.mu.Unlock()
	for _, pw := range pending {
		select {
		case <-pw.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (er *executionRecord) write(rec store.Execution) {
	if err := er.s.store.AddExecution(er.ctx, rec); err != nil {
		er.s.log.Error("record execution", "sandbox", rec.SandboxID, "request_id", requestIDFrom(er.ctx), "err", err)
	}
}

// logTrace returns what logs the hops of a traced execution once its
// reply is written: the HTTP middleware (the key's check, the account's
// pace, the route), the handler up to the engine (the body's decoding,
// the sandbox's lookup, the record begun), the engine up to the agent's
// connection, the agent's first frame, the kernel driver's own time, the
// rest of the agent's round trip (its frames, the connection), the
// engine and the record after it, and the reply's encoding.
func (s *Server) logTrace(r *http.Request, entered time.Time, tr *sandbox.ExecTrace, now func() time.Time) func() {
	return func() {
		if tr.Done.IsZero() || tr.Recorded.IsZero() {
			return // it failed before the agent answered
		}
		li := logInfoFrom(r.Context())
		if li == nil {
			return
		}
		us := func(a, b time.Time) int64 { return b.Sub(a).Microseconds() }
		agent := us(tr.Dialed, tr.Done)
		s.log.Info("execution trace", "request_id", requestIDFrom(r.Context()),
			"middleware_us", us(li.start, entered), "handler_us", us(entered, tr.Start),
			"engine_us", us(tr.Start, tr.Dialed), "first_frame_us", us(tr.Dialed, tr.First),
			"kernel_us", int64(tr.KernelMS*1000), "agent_rest_us", agent-int64(tr.KernelMS*1000),
			"after_us", us(tr.Done, tr.Recorded), "reply_us", us(tr.Recorded, now()),
			"total_us", us(li.start, now()))
	}
}
