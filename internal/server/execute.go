package server

import (
	"context"
	"net/http"
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
		ex, err := b.sb.Execute(r.Context(), ereq, nil)
		rec.End(ex, err)
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
// restarted", or with replicas the others' collector: shared.go). That
// first write runs off the caller's path; the last waits for it. An
// execution that ends sooner (a warm 1+1 takes about a millisecond) is
// written once: one transaction instead of two on the warm path. So a
// crash in the first runningRecordAfter of an execution (more on a loaded
// store) leaves no record of it; what it is billed for is counted apart
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
// ended it without one (e2b.RecordedExecution).
func (er *executionRecord) End(ex *sandbox.Execution, err error) {
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
	if !er.running.Stop() {
		<-er.started // the running record is being written: the end replaces it
	}
	er.write(rec)
}

func (er *executionRecord) write(rec store.Execution) {
	if err := er.s.store.AddExecution(er.ctx, rec); err != nil {
		er.s.log.Error("record execution", "sandbox", rec.SandboxID, "request_id", requestIDFrom(er.ctx), "err", err)
	}
}
