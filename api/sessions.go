package api

import (
	"encoding/base64"
	"encoding/json"
	"time"
)

// Code is one of the API's stable error codes ("ERR_MODULE_BLOCKED"). A
// Code is an error too, so that errors.Is matches an error of the API
// (the Go SDK's *client.Error) or an execution's SessionExecError with
// it.
type Code string

func (c Code) Error() string { return string(c) }

// CreateSession is the body of POST /v1/sessions as the server reads it
// (schema CreateSession): a model bound to a new sandbox. The shorthand
// and the policy stay raw: internal/policy parses them strictly.
type CreateSession struct {
	Model          string            `json:"model"`
	Template       string            `json:"template,omitempty"`
	SandboxConfig  json.RawMessage   `json:"sandbox_config,omitempty"`  // the seeds' shorthand
	SecurityPolicy json.RawMessage   `json:"security_policy,omitempty"` // the full policy
	Timeout        *float64          `json:"timeout,omitempty"`         // the sandbox's lifetime, seconds
	Resources      *Resources        `json:"resources,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
}

// Session is a model bound to a sandbox (schema Session).
type Session struct {
	ID         string    `json:"id"`
	Model      string    `json:"model"`
	SandboxID  string    `json:"sandbox_id"`
	Template   string    `json:"template"`
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Resources  Resources `json:"resources"`
	StopReason string    `json:"stop_reason,omitempty"`
}

// SessionExecuteRequest is the body of POST /v1/sessions/{id}/execute
// as the server reads it (schema SessionExecuteRequest).
type SessionExecuteRequest struct {
	Code      string `json:"code"`
	Language  string `json:"language,omitempty"`
	TimeoutMS *int64 `json:"timeout_ms,omitempty"` // nil: the session's max_execution_time
}

// SessionExecError is why a session's execution did not succeed: Code
// is set when Sheepfold stopped it (ERR_SANDBOX_TIMEOUT,
// ERR_MODULE_BLOCKED, ERR_NETWORK_RESTRICTED...), empty for the code's
// own exception (Name) (schema SessionExecError).
type SessionExecError struct {
	Code      string `json:"code,omitempty"`
	Message   string `json:"message"`
	Name      string `json:"name,omitempty"`
	Traceback string `json:"traceback,omitempty"`
}

func (e *SessionExecError) Error() string {
	if e.Code != "" {
		return e.Code + ": " + e.Message
	}
	return e.Name + ": " + e.Message
}

// Is makes errors.Is(ex.Error, ErrXxx) true for an execution stopped
// with that Code.
func (e *SessionExecError) Is(target error) bool {
	c, ok := target.(Code)
	return ok && e.Code != "" && string(c) == e.Code
}

// Chart is an image an execution produced (schema Chart).
type Chart struct {
	Format string `json:"format"` // png, jpeg or svg
	Data   string `json:"data"`   // base64 (svg: the text)
}

// Bytes decodes the chart's image.
func (ch Chart) Bytes() ([]byte, error) {
	if ch.Format == "svg" {
		return []byte(ch.Data), nil
	}
	return base64.StdEncoding.DecodeString(ch.Data)
}

// SessionExecution is an execution in the seeds' shape, with charts
// (schema SessionExecution).
type SessionExecution struct {
	Code            string            `json:"code,omitempty"` // in an answer: the code the model ran
	Language        string            `json:"language,omitempty"`
	Output          string            `json:"output"`
	Status          string            `json:"status"` // success, error or timeout
	ExecutionTimeMS float64           `json:"execution_time_ms"`
	Error           *SessionExecError `json:"error"`
	Charts          []Chart           `json:"charts"`
	Results         []string          `json:"results,omitempty"` // text of the trailing expression and display() calls
}

// Err returns the execution's error as an error (nil on success).
func (e *SessionExecution) Err() error {
	if e.Error == nil {
		return nil
	}
	return e.Error
}

// AskFile is a file an ask puts under /home/user before it starts
// (schema AskFile).
type AskFile struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"` // "" or "utf-8": text; "base64"
}

// AskRequest asks a session's model (POST /v1/sessions/{id}/ask; schema
// AskRequest).
type AskRequest struct {
	Prompt    string    `json:"prompt"`
	Files     []AskFile `json:"files,omitempty"`
	MaxSteps  int       `json:"max_steps,omitempty"`  // model calls at most [8]
	TimeoutMS int64     `json:"timeout_ms,omitempty"` // the ask's time limit [300000]
}

// Tokens counts an ask's model tokens, all steps together (schema
// Answer.tokens).
type Tokens struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// Answer is what an ask ends with (schema Answer).
type Answer struct {
	SessionID  string             `json:"session_id"`
	Model      string             `json:"model"`
	Text       string             `json:"text"`
	StopReason string             `json:"stop_reason"` // answered, max_steps or time_limit
	Steps      int                `json:"steps"`
	Executions []SessionExecution `json:"executions"`
	Tokens     Tokens             `json:"tokens"`
	TimeMS     float64            `json:"time_ms"`
	// ModelTimeMS is the time spent waiting for the model;
	// SheepfoldTimeMS the rest (executions, files, the loop itself).
	ModelTimeMS     float64 `json:"model_time_ms"`
	SheepfoldTimeMS float64 `json:"sheepfold_time_ms"`
	CostMicros      int64   `json:"cost_micros"`
	Cost            string  `json:"cost"`
}

// AskStep is one step of an ask as it happens: a model reply (with the
// model's tool calls as the model relay sent them) or an execution
// (schema AskStep).
type AskStep struct {
	Type      string            `json:"type"` // "model" or "execution"
	Step      int               `json:"step"`
	Content   string            `json:"content,omitempty"`
	ToolCalls []json.RawMessage `json:"tool_calls,omitempty"`
	Execution *SessionExecution `json:"execution,omitempty"`
}

// Model is a model the server serves, as GET /v1/models lists it (the
// OpenAI shape; schema Model).
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`   // "model"
	Created int64  `json:"created"`  // Unix seconds
	OwnedBy string `json:"owned_by"` // the provider
}
