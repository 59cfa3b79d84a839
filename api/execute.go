package api

import "time"

// ExecuteRequest is the body of POST /v1/sandboxes/{id}/execute (schema
// ExecuteRequest).
type ExecuteRequest struct {
	Code      string            `json:"code"`
	Language  string            `json:"language,omitempty"`
	ContextID string            `json:"context_id,omitempty"`
	TimeoutMS *int64            `json:"timeout_ms,omitempty"` // nil: the sandbox's default
	Env       map[string]string `json:"env,omitempty"`
}

// Result is one rich value produced by the code: its MIME renderings
// (schema Result).
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

// ExecError is an exception raised by the code (schema ExecError).
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

// Execution is what one execution did (schema Execution). Code that
// raises, times out or runs out of memory is reported here (Status,
// Error, ErrorCode), not as an API error.
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

// Dropped counts the results an execution produced but did not deliver:
// too large, past the execution's bounds, or more than the server could
// hold at once (schema Execution.dropped).
type Dropped struct {
	Results int    `json:"results"`
	Bytes   int64  `json:"bytes"`
	Reason  string `json:"reason"` // why the first one was dropped
}

// Context is a long-lived interpreter whose state carries over between
// executions (schema Context).
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ContextRequest describes a new context (schema ContextRequest).
type ContextRequest struct {
	Language string            `json:"language,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// CommandRequest is the body of POST /v1/sandboxes/{id}/commands
// (schema CommandRequest).
type CommandRequest struct {
	Cmd        string            `json:"cmd"`
	Args       []string          `json:"args,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	TimeoutMS  *int64            `json:"timeout_ms,omitempty"` // nil: 60 s in the foreground, none in the background
	Background bool              `json:"background,omitempty"`
	Stdin      bool              `json:"stdin,omitempty"` // keep stdin open for input
	Tag        string            `json:"tag,omitempty"`
}

// Command is how a command ended (schema Command).
type Command struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal"`
	Status    string `json:"status"` // exited, signaled, timeout, output_limit
	Stdout    string `json:"stdout"` // empty when streamed
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

// Process is a running process of a sandbox (schema Process).
type Process struct {
	PID     int       `json:"pid"`
	Cmd     string    `json:"cmd"`
	Args    []string  `json:"args"`
	Cwd     string    `json:"cwd"`
	Tag     string    `json:"tag"`
	Started time.Time `json:"started"`
}
