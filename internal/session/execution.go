// Package session is what a session does beyond the sandbox it shares
// its id with: the seeds' shape of an execution (Execution, the answer of
// POST /v1/sessions/{id}/execute and the executions of an ask) and the
// ask loop (Ask, POST /v1/sessions/{id}/ask), which lets a model answer a
// prompt by running code in the session's sandbox.
//
// It does not create, find, admit or end sessions, authenticate, decode
// requests or stream: the server (internal/server, sessions.go and
// session_ask.go) does, and hands an ask what it needs as two narrow
// interfaces: a Relay (the model relay with the session's account:
// admitted, metered, quota-checked with the fallback model, and priced
// like any completion) and a Sandbox (the session's sandbox: write a
// file, run code under its policy, the execution recorded).
//
// # The ask loop
//
// Each step is one non-streamed completion through the relay with a
// run_code tool; tool calls, or fenced code in a text reply (the seeds'
// models; its language read with internal/lang's table, limited to
// Python, JavaScript and Bash), run in the sandbox, and their output
// (bounded, ToolOutputLimit) goes back to the model; a text reply without
// code is the answer. The loop is bounded by max_steps and a time limit
// (the context: a model or an execution still running at the limit is
// cut, and the answer says time_limit); provider errors end the ask with
// their code and leave the session as it was. The answer separates the
// model's time from Sheepfold's own.
//
// Imports: api (the wire types of sessions, which this package's
// File, Request, Answer, Step, Execution... alias), internal/sandbox (an
// execution's outcome), internal/apierr
// (codes), internal/llm (the chat shapes and usage), internal/lang (the
// languages), internal/account (how a cost is written).
package session

import (
	"fmt"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// ExecError is why an execution did not succeed: a stable code when
// Sheepfold stopped it (ERR_SANDBOX_TIMEOUT, ERR_MODULE_BLOCKED,
// ERR_NETWORK_RESTRICTED ...), else the code's own exception.
type ExecError = api.SessionExecError

// Chart is an image an execution produced (base64).
type Chart = api.Chart

// Execution is the seeds' execution shape, with charts.
type Execution = api.SessionExecution

// networkRestrictedMessage is seed 002's message for a network call in a
// sandbox without network.
const networkRestrictedMessage = "Network access is restricted in sandbox mode"

// ExecutionOf turns an engine execution, run with timeout, into the
// seeds' shape.
func ExecutionOf(ex *sandbox.Execution, timeout time.Duration) Execution {
	out := Execution{Output: ex.Stdout + ex.Stderr, Status: ex.Status, ExecutionTimeMS: ex.ExecutionTimeMS, Charts: []Chart{}}
	for _, res := range ex.Results {
		switch {
		case res.PNG != "":
			out.Charts = append(out.Charts, Chart{Format: "png", Data: res.PNG})
		case res.JPEG != "":
			out.Charts = append(out.Charts, Chart{Format: "jpeg", Data: res.JPEG})
		case res.SVG != "":
			out.Charts = append(out.Charts, Chart{Format: "svg", Data: res.SVG})
		case res.Text != "":
			out.Results = append(out.Results, res.Text)
		}
	}
	if ex.Status == sandbox.ExecSuccess {
		return out
	}
	e := &ExecError{Code: string(ex.ErrorCode)}
	if ex.Error != nil {
		e.Name, e.Message, e.Traceback = ex.Error.Name, ex.Error.Value, ex.Error.Traceback
	}
	if ex.ErrorCode == string(apierr.SandboxTimeout) || ex.Status == sandbox.ExecTimeout {
		e.Code = string(apierr.SandboxTimeout)
		e.Message = fmt.Sprintf("Sandbox execution timeout after %dms", timeout.Milliseconds())
	}
	if ex.ErrorCode == string(apierr.NetworkRestricted) {
		// The seeds' message, whatever the language's own error said
		// (urllib's URLError, Node's getaddrinfo, curl's).
		e.Message = networkRestrictedMessage
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(ex.Stderr)
	}
	out.Error = e
	return out
}
