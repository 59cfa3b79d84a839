package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/url"

	"github.com/sheepfold/sheepfold/api"
)

// Sessions: a model bound to a sandbox (its id is the sandbox's, so the
// sandbox calls — SetPolicy, StreamEvents, files — take it too).
//
//	s, err := c.CreateSession(ctx, client.SessionRequest{Model: "deepseek-chat",
//		SandboxConfig: map[string]any{"allowed_modules": []string{"pandas"}}})
//	ex, err := c.SessionExecute(ctx, s.ID, client.SessionExecuteRequest{Code: "print(1)"})
//	ans, err := c.Ask(ctx, s.ID, client.AskRequest{Prompt: "Total revenue per country?",
//		Files: []client.AskFile{client.TextFile("orders.csv", csv)}})
//	fmt.Println(ans.Text, ans.Tokens.TotalTokens, ans.Cost)

// SessionRequest creates a session.
type SessionRequest struct {
	Model          string            `json:"model"`
	Template       string            `json:"template,omitempty"`
	SandboxConfig  any               `json:"sandbox_config,omitempty"`  // the seeds' shorthand
	SecurityPolicy any               `json:"security_policy,omitempty"` // the full policy
	Timeout        float64           `json:"timeout,omitempty"`         // the sandbox's lifetime, seconds
	Metadata       map[string]string `json:"metadata,omitempty"`
	Resources      *Resources        `json:"resources,omitempty"`
}

// Session is a model bound to a sandbox.
type Session = api.Session

func sessionPath(id string, parts ...string) string {
	p := "/v1/sessions/" + url.PathEscape(id)
	for _, s := range parts {
		p += "/" + s
	}
	return p
}

// CreateSession creates a session.
func (c *Client) CreateSession(ctx context.Context, req SessionRequest) (*Session, error) {
	var s Session
	return &s, c.call(ctx, request{method: "POST", path: "/v1/sessions", json: req}, &s)
}

// GetSession returns a session, running or stopped.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	return &s, c.call(ctx, request{method: "GET", path: sessionPath(id)}, &s)
}

// DeleteSession ends a session and its sandbox (ending one that has
// stopped succeeds too).
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.call(ctx, request{method: "DELETE", path: sessionPath(id)}, nil)
}

// SessionExecuteRequest runs code in a session's sandbox.
type SessionExecuteRequest struct {
	Code      string `json:"code"`
	Language  string `json:"language,omitempty"`   // as ExecuteRequest.Language
	TimeoutMS int64  `json:"timeout_ms,omitempty"` // default and cap: the session's max_execution_time
}

// ExecutionError is why an execution failed: Code is set when Sheepfold
// stopped it (ERR_SANDBOX_TIMEOUT, ERR_MODULE_BLOCKED,
// ERR_NETWORK_RESTRICTED...), empty for the code's own exception (Name).
type ExecutionError = api.SessionExecError

// Chart is an image an execution produced.
type Chart = api.Chart

// SessionExecution is an execution in the seeds' shape.
type SessionExecution = api.SessionExecution

// SessionExecute runs code in a session's sandbox under its policy. A
// failure of the code (timeout, blocked module...) is in the result's
// Status and Error, not in the returned error.
func (c *Client) SessionExecute(ctx context.Context, id string, req SessionExecuteRequest) (*SessionExecution, error) {
	var ex SessionExecution
	return &ex, c.call(ctx, request{method: "POST", path: sessionPath(id, "execute"), json: req}, &ex)
}

// AskFile is a file given to an ask, put under /home/user.
type AskFile = api.AskFile

// TextFile is a text file for an ask.
func TextFile(path, content string) AskFile { return AskFile{Path: path, Content: content} }

// BinaryFile is a file of any bytes for an ask.
func BinaryFile(path string, data []byte) AskFile {
	return AskFile{Path: path, Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64"}
}

// AskRequest asks a session's model.
type AskRequest = api.AskRequest

// Tokens counts model tokens.
type Tokens = api.Tokens

// Answer is what an ask ends with.
type Answer = api.Answer

// AskStep is one step of an ask, as it happens: a model reply or an
// execution.
type AskStep = api.AskStep

// Ask runs the session's model loop until it answers.
func (c *Client) Ask(ctx context.Context, id string, req AskRequest) (*Answer, error) {
	var a Answer
	return &a, c.call(ctx, request{method: "POST", path: sessionPath(id, "ask"), json: req}, &a)
}

// AskStream is Ask with each step passed to onStep as it happens.
func (c *Client) AskStream(ctx context.Context, id string, req AskRequest, onStep func(AskStep)) (*Answer, error) {
	var ans *Answer
	err := c.stream(ctx, request{method: "POST", path: sessionPath(id, "ask"), json: req}, func(typ string, line []byte) error {
		switch typ {
		case "step":
			var v struct {
				Step AskStep `json:"step"`
			}
			if err := json.Unmarshal(line, &v); err != nil {
				return err
			}
			if onStep != nil {
				onStep(v.Step)
			}
		case "done":
			var v struct {
				Answer Answer `json:"answer"`
			}
			if err := json.Unmarshal(line, &v); err != nil {
				return err
			}
			ans = &v.Answer
		}
		return nil
	})
	if err == nil && ans == nil {
		err = errNoDone
	}
	return ans, err
}

// Model is one model the server's providers serve.
type Model = api.Model

// Models lists the models the server serves.
func (c *Client) Models(ctx context.Context) ([]Model, error) {
	var body struct {
		Data []Model `json:"data"`
	}
	return body.Data, c.call(ctx, request{method: "GET", path: "/v1/models"}, &body)
}
