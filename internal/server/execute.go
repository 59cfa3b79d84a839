package server

import (
	"context"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

func (s *Server) executeRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/execute", true, s.execute)
}

type executeRequest struct {
	Code      string            `json:"code"`
	Language  string            `json:"language"`
	ContextID string            `json:"context_id"`
	TimeoutMS *int64            `json:"timeout_ms"`
	Env       map[string]string `json:"env"`
}

// executionJSON is an Execution as the contract shows it: error (null
// when none) and truncated are always present.
type executionJSON struct {
	*sandbox.Execution
	Error     *agentproto.ExecError `json:"error"`
	Truncated bool                  `json:"truncated"`
}

func executionOf(ex *sandbox.Execution) *executionJSON {
	if ex == nil {
		return nil
	}
	return &executionJSON{Execution: ex, Error: ex.Error, Truncated: ex.Truncated}
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
	var req executeRequest
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
	started := time.Now()

	mode := wantStream(r, streamNone)
	if mode == streamNone {
		ex, err := b.sb.Execute(r.Context(), ereq, nil)
		if err != nil {
			return err
		}
		s.recordExecution(r, b, ereq.ID, req, ex, started)
		writeJSON(w, http.StatusOK, executionOf(ex))
		return nil
	}
	// The events are streamed as they come and not repeated: the done
	// event's execution has no stdout, stderr or results of its own.
	st := newStreamer(w, mode)
	texts := textStreams{}
	ex, err := b.sb.Execute(r.Context(), ereq, func(ev agentproto.Event) error {
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
	if err == nil {
		s.recordExecution(r, b, ereq.ID, req, ex, started)
	}
	view := executionOf(ex)
	s.end(st, w, r, err, "done", view, map[string]any{"type": "done", "execution": view})
	return nil
}

func (s *Server) recordExecution(r *http.Request, b *box, id string, req executeRequest, ex *sandbox.Execution, started time.Time) {
	lang := req.Language
	if lang == "" && req.ContextID == "" {
		lang = "python"
	}
	rec := store.Execution{ID: id, SandboxID: b.sb.ID, Owner: b.owner, Language: lang,
		Status: ex.Status, ErrorCode: string(ex.ErrorCode), ExecutionTimeMS: ex.ExecutionTimeMS,
		CPUTimeMS: ex.CPUTimeMS, PeakMemoryBytes: ex.PeakMemoryBytes, CreatedAt: started}
	if err := s.store.AddExecution(context.WithoutCancel(r.Context()), rec); err != nil {
		s.log.Error("record execution", "sandbox", b.sb.ID, "request_id", requestIDFrom(r.Context()), "err", err)
	}
}
