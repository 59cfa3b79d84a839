package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// ExecuteRequest is code to run.
type ExecuteRequest struct {
	Code      string
	Language  string // python (default), javascript, typescript, bash, r or java, or an alias (py, js, node, ts, sh...); ignored with ContextID
	ContextID string
	Timeout   time.Duration // 0: the sandbox's default
	Env       map[string]string
}

func (r ExecuteRequest) body() api.ExecuteRequest {
	return api.ExecuteRequest{Code: r.Code, Language: r.Language, ContextID: r.ContextID, TimeoutMS: millis(r.Timeout), Env: r.Env}
}

// millis is d in milliseconds, nil for 0 (the server's default).
func millis(d time.Duration) *int64 {
	if ms := d.Milliseconds(); ms != 0 {
		return &ms
	}
	return nil
}

// Result is one rich value produced by the code (MIME renderings).
type Result = api.Result

// ExecError is an exception raised by the code.
type ExecError = api.ExecError

// Execution statuses.
const (
	StatusSuccess = api.StatusSuccess
	StatusError   = api.StatusError
	StatusTimeout = api.StatusTimeout
)

// Execution is what one execution did. Code that raises, times out or runs
// out of memory is reported here (Status, Error, ErrorCode), not as an error.
type Execution = api.Execution

// Dropped counts the results an execution produced but did not deliver
// (too large, past the execution's bounds, or more than the server could
// hold at once).
type Dropped = api.Dropped

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
type Context = api.Context

// ContextRequest describes a new context.
type ContextRequest = api.ContextRequest

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
