package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// A sandbox's execution history: each execution run through the API
// (POST /v1/sandboxes/{id}/execute, streamed or not, and a session's
// executions) is recorded with its code and its output, so that the
// dashboard's sandbox page shows what was run from anywhere, not only
// from the page. The E2B surface's executions are not recorded (they
// never were, in the executions table either).
//
// Bounds: the code is kept up to maxRecordedCode bytes; the output
// (stdout, stderr, results, error) up to maxRecordedOutput bytes of
// JSON, each stream up to maxRecordedText, results past the budget left
// out and counted; only a sandbox's newest store.KeptOutputs executions
// keep their output. GET /v1/sandboxes/{id}/executions pages the
// history newest first, at most maxExecutionPage a page.
const (
	maxRecordedCode   = 64 << 10
	maxRecordedText   = 64 << 10
	maxRecordedOutput = 1 << 20
	maxExecutionPage  = 50
)

// recordedOutput is an execution's output as its history shows it.
type recordedOutput struct {
	Stdout    string                `json:"stdout"`
	Stderr    string                `json:"stderr"`
	Results   []agentproto.Result   `json:"results"`
	Error     *agentproto.ExecError `json:"error"`
	Truncated bool                  `json:"truncated"`
	// Omitted counts the results left out of the history for its bound
	// (the execution's caller received them).
	Omitted int `json:"omitted_results,omitempty"`
}

// outputRecorder gathers a streamed execution's output for its record.
type outputRecorder struct {
	out  recordedOutput
	size int
}

func (o *outputRecorder) text(typ, s string) {
	p := &o.out.Stdout
	if typ == agentproto.EventStderr {
		p = &o.out.Stderr
	}
	if room := maxRecordedText - len(*p); room < len(s) {
		s, o.out.Truncated = cutUTF8(s, max(room, 0)), true
	}
	*p += s
}

func (o *outputRecorder) result(r agentproto.Result) {
	b, err := json.Marshal(r)
	if err != nil || o.size+len(b) > maxRecordedOutput-2*maxRecordedText-4096 {
		o.out.Omitted++
		return
	}
	o.size += len(b)
	o.out.Results = append(o.out.Results, r)
}

// cutUTF8 is s cut to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// recordOutput is the JSON of an execution's output for its record:
// what the recorder gathered while it streamed, else the execution's own.
func recordOutput(ex *sandbox.Execution, streamed *outputRecorder) json.RawMessage {
	var o *outputRecorder
	if streamed != nil {
		o = streamed
	} else {
		o = &outputRecorder{}
		o.text(agentproto.EventStdout, ex.Stdout)
		o.text(agentproto.EventStderr, ex.Stderr)
		for _, r := range ex.Results {
			o.result(r)
		}
	}
	o.out.Error = ex.Error
	o.out.Truncated = o.out.Truncated || ex.Truncated || o.out.Omitted > 0
	if o.out.Results == nil {
		o.out.Results = []agentproto.Result{}
	}
	b, err := json.Marshal(o.out)
	if err != nil || len(b) > maxRecordedOutput {
		// Only an enormous traceback gets here.
		o.out.Error = nil
		b, _ = json.Marshal(o.out)
	}
	return b
}

// executionHistoryJSON is one execution of GET /v1/sandboxes/{id}/executions.
type executionHistoryJSON struct {
	ID              string          `json:"id"`
	Language        string          `json:"language"`
	Status          string          `json:"status"`
	ErrorCode       string          `json:"error_code,omitempty"`
	Message         string          `json:"message,omitempty"`
	Code            string          `json:"code"`
	CodeTruncated   bool            `json:"code_truncated,omitempty"`
	Output          json.RawMessage `json:"output"` // null while running, or once out of the kept window
	ExecutionTimeMS float64         `json:"execution_time_ms"`
	CPUTimeMS       float64         `json:"cpu_time_ms"`
	PeakMemoryBytes int64           `json:"peak_memory_bytes"`
	CreatedAt       time.Time       `json:"created_at"`
}

func (s *Server) executionHistoryRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/executions", true, s.listExecutions)
}

func (s *Server) listExecutions(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	setSandbox(r, id)
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := bound.ParseInt("limit", v, 1, maxExecutionPage)
		if err != nil {
			return err
		}
		limit = int(n)
	}
	// The caller's sandboxes, running or stopped (while their records are kept).
	rec, err := s.store.GetSandbox(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != owner(r) {
		return notFound(id)
	}
	if err != nil {
		return err
	}
	// Every execution already answered is in the history.
	if err := s.records.wait(r.Context(), rec.Owner); err != nil {
		return err
	}
	cursor := r.URL.Query().Get("cursor")
	recs, err := s.store.PageExecutions(r.Context(), store.ExecutionFilter{SandboxID: id, Before: cursor, Limit: limit + 1})
	if err != nil {
		return err
	}
	if cursor != "" && len(recs) == 0 {
		// A next cursor always has an older execution after it: an empty
		// page after one is a cursor of no execution of this sandbox
		// (unless its record went since), refused rather than answered
		// as the end of the list.
		if ok, err := s.hasExecution(r, id, cursor); err != nil {
			return err
		} else if !ok {
			return bound.Error("cursor", "must be the next of a previous page of this sandbox's executions")
		}
	}
	next := ""
	if len(recs) > limit {
		recs = recs[:limit]
		next = recs[limit-1].ID
	}
	out := make([]executionHistoryJSON, 0, len(recs))
	for _, e := range recs {
		out = append(out, executionHistoryJSON{ID: e.ID, Language: e.Language, Status: e.Status, ErrorCode: e.ErrorCode,
			Message: e.Error, Code: e.Code, CodeTruncated: len(e.Code) >= maxRecordedCode, Output: e.Output,
			ExecutionTimeMS: e.ExecutionTimeMS, CPUTimeMS: e.CPUTimeMS, PeakMemoryBytes: e.PeakMemoryBytes, CreatedAt: e.CreatedAt})
	}
	page := map[string]any{"executions": out}
	if next != "" {
		page["next"] = next
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// hasExecution reports whether sandbox id has an execution of that id.
func (s *Server) hasExecution(r *http.Request, id, exec string) (bool, error) {
	all, err := s.store.ListExecutions(r.Context(), id)
	if err != nil {
		return false, err
	}
	for _, e := range all {
		if e.ID == exec {
			return true, nil
		}
	}
	return false, nil
}
