package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"time"
)

// ExecuteRequest is code to run.
type ExecuteRequest struct {
	Code      string
	Language  string // python (default), javascript, typescript or bash, or an alias (py, js, node, ts, sh...); ignored with ContextID
	ContextID string
	Timeout   time.Duration // 0: the sandbox's default
	Env       map[string]string
}

type executeJSON struct {
	Code      string            `json:"code"`
	Language  string            `json:"language,omitempty"`
	ContextID string            `json:"context_id,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
}

func (r ExecuteRequest) body() executeJSON {
	return executeJSON{Code: r.Code, Language: r.Language, ContextID: r.ContextID, TimeoutMS: r.Timeout.Milliseconds(), Env: r.Env}
}

// Result is one rich value produced by the code (MIME renderings).
type Result struct {
	Text         string         `json:"text,omitempty"`
	HTML         string         `json:"html,omitempty"`
	Markdown     string         `json:"markdown,omitempty"`
	SVG          string         `json:"svg,omitempty"`
	PNG          string         `json:"png,omitempty"` // base64
	JPEG         string         `json:"jpeg,omitempty"`
	PDF          string         `json:"pdf,omitempty"`
	LaTeX        string         `json:"latex,omitempty"`
	JSON         any            `json:"json,omitempty"`
	JavaScript   string         `json:"javascript,omitempty"`
	Extra        map[string]any `json:"extra,omitempty"`
	IsMainResult bool           `json:"is_main_result,omitempty"`
}

// ExecError is an exception raised by the code.
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Execution statuses.
const (
	StatusSuccess = "success"
	StatusError   = "error"
	StatusTimeout = "timeout"
)

// Execution is what one execution did. Code that raises, times out or runs
// out of memory is reported here (Status, Error, ErrorCode), not as an error.
type Execution struct {
	Status          string     `json:"status"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	Results         []Result   `json:"results"`
	Error           *ExecError `json:"error"`
	ErrorCode       string     `json:"error_code,omitempty"` // ERR_SANDBOX_TIMEOUT, ERR_OUT_OF_MEMORY, ERR_OUTPUT_LIMIT
	Truncated       bool       `json:"truncated"`            // output or results were cut
	Dropped         *Dropped   `json:"dropped,omitempty"`    // results produced but not delivered
	ExecutionTimeMS float64    `json:"execution_time_ms"`
	CPUTimeMS       float64    `json:"cpu_time_ms"`
	PeakMemoryBytes int64      `json:"peak_memory_bytes"`
}

// Dropped counts the results an execution produced but did not deliver
// (too large, past the execution's bounds, or more than the server could
// hold at once).
type Dropped struct {
	Results int    `json:"results"`
	Bytes   int64  `json:"bytes"`
	Reason  string `json:"reason"` // why the first one was dropped
}

// ExecuteHandlers receive a streamed execution's events as they come; any
// may be nil.
type ExecuteHandlers struct {
	OnStdout func(text string)
	OnStderr func(text string)
	OnResult func(Result)
	OnError  func(ExecError)
}

// Execute runs code and returns once it has finished.
func (c *Client) Execute(ctx context.Context, sandboxID string, req ExecuteRequest) (*Execution, error) {
	var ex Execution
	return &ex, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "execute"), json: req.body()}, &ex)
}

// ExecuteStream runs code, passing its output to h as it comes, and
// returns the whole execution at the end (its stdout, stderr and results
// gathered from the stream: the server does not repeat them).
func (c *Client) ExecuteStream(ctx context.Context, sandboxID string, req ExecuteRequest, h ExecuteHandlers) (*Execution, error) {
	var done *Execution
	var stdout, stderr strings.Builder
	results := []Result{}
	err := c.stream(ctx, request{method: "POST", path: sandboxPath(sandboxID, "execute"), json: req.body(),
		query: url.Values{"stream": {"1"}}}, func(typ string, line []byte) error {
		var ev struct {
			Text      string     `json:"text"`
			Result    *Result    `json:"result"`
			Error     *ExecError `json:"error"`
			Execution *Execution `json:"execution"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			return err
		}
		switch typ {
		case "stdout":
			stdout.WriteString(ev.Text)
			if h.OnStdout != nil {
				h.OnStdout(ev.Text)
			}
		case "stderr":
			stderr.WriteString(ev.Text)
			if h.OnStderr != nil {
				h.OnStderr(ev.Text)
			}
		case "result":
			if ev.Result != nil {
				results = append(results, *ev.Result)
			}
			if h.OnResult != nil && ev.Result != nil {
				h.OnResult(*ev.Result)
			}
		case "error":
			if h.OnError != nil && ev.Error != nil {
				h.OnError(*ev.Error)
			}
		case "done":
			done = ev.Execution
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if done == nil {
		return nil, errNoDone
	}
	done.Stdout, done.Stderr, done.Results = stdout.String(), stderr.String(), results
	return done, nil
}

// Context is a long-lived interpreter whose state carries over between
// executions.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ContextRequest describes a new context.
type ContextRequest struct {
	Language string            `json:"language,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// CreateContext starts a code context.
func (c *Client) CreateContext(ctx context.Context, sandboxID string, req ContextRequest) (*Context, error) {
	var out Context
	return &out, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "contexts"), json: req}, &out)
}

// ListContexts lists a sandbox's contexts.
func (c *Client) ListContexts(ctx context.Context, sandboxID string) ([]Context, error) {
	var out struct {
		Contexts []Context `json:"contexts"`
	}
	return out.Contexts, c.call(ctx, request{method: "GET", path: sandboxPath(sandboxID, "contexts")}, &out)
}

// RestartContext restarts a context's interpreter; its state is lost.
func (c *Client) RestartContext(ctx context.Context, sandboxID, contextID string) (*Context, error) {
	var out Context
	return &out, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "contexts", url.PathEscape(contextID), "restart")}, &out)
}

// DeleteContext stops a context.
func (c *Client) DeleteContext(ctx context.Context, sandboxID, contextID string) error {
	return c.call(ctx, request{method: "DELETE", path: sandboxPath(sandboxID, "contexts", url.PathEscape(contextID))}, nil)
}
