package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// CommandRequest is a command to run in a sandbox.
type CommandRequest struct {
	Cmd     string
	Args    []string
	Env     map[string]string
	Cwd     string
	Timeout time.Duration // kills it after this long; 0: 60 s in the foreground, none in the background
	Stdin   bool          // keep stdin open for SendInput
	Tag     string
}

func (r CommandRequest) body(background bool) api.CommandRequest {
	return api.CommandRequest{Cmd: r.Cmd, Args: r.Args, Env: r.Env, Cwd: r.Cwd, TimeoutMS: millis(r.Timeout),
		Background: background, Stdin: r.Stdin, Tag: r.Tag}
}

// CommandResult is how a command ended.
type CommandResult = api.Command

// CommandHandlers receive a streamed command's events; any may be nil.
type CommandHandlers struct {
	OnStart  func(pid int)
	OnStdout func(text string)
	OnStderr func(text string)
}

// RunCommand runs a command in the foreground and returns its output.
func (c *Client) RunCommand(ctx context.Context, sandboxID string, req CommandRequest) (*CommandResult, error) {
	var out CommandResult
	return &out, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "commands"), json: req.body(false)}, &out)
}

// RunCommandStream runs a command, passing its output to h as it comes.
func (c *Client) RunCommandStream(ctx context.Context, sandboxID string, req CommandRequest, h CommandHandlers) (*CommandResult, error) {
	return c.commandStream(ctx, request{method: "POST", path: sandboxPath(sandboxID, "commands"), json: req.body(false),
		query: url.Values{"stream": {"1"}}}, h)
}

// StartCommand starts a command in the background and returns its pid;
// it outlives the call.
func (c *Client) StartCommand(ctx context.Context, sandboxID string, req CommandRequest) (int, error) {
	var out struct {
		PID int `json:"pid"`
	}
	return out.PID, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "commands"), json: req.body(true)}, &out)
}

// ConnectCommand streams a running process's output from now until it ends.
func (c *Client) ConnectCommand(ctx context.Context, sandboxID string, pid int, h CommandHandlers) (*CommandResult, error) {
	return c.commandStream(ctx, request{method: "GET", path: sandboxPath(sandboxID, "commands", strconv.Itoa(pid), "stream")}, h)
}

func (c *Client) commandStream(ctx context.Context, r request, h CommandHandlers) (*CommandResult, error) {
	var done *CommandResult
	err := c.stream(ctx, r, func(typ string, line []byte) error {
		var ev struct {
			PID     int            `json:"pid"`
			Text    string         `json:"text"`
			Command *CommandResult `json:"command"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			return err
		}
		switch typ {
		case "start":
			if h.OnStart != nil {
				h.OnStart(ev.PID)
			}
		case "stdout":
			if h.OnStdout != nil {
				h.OnStdout(ev.Text)
			}
		case "stderr":
			if h.OnStderr != nil {
				h.OnStderr(ev.Text)
			}
		case "done":
			done = ev.Command
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if done == nil {
		return nil, errNoDone
	}
	return done, nil
}

// Process is a running process of a sandbox.
type Process = api.Process

// ListCommands lists the processes still running.
func (c *Client) ListCommands(ctx context.Context, sandboxID string) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	return out.Processes, c.call(ctx, request{method: "GET", path: sandboxPath(sandboxID, "commands")}, &out)
}

// SendInput writes data to a process's stdin (started with Stdin); eof
// closes it afterwards.
func (c *Client) SendInput(ctx context.Context, sandboxID string, pid int, data []byte, eof bool) error {
	b64 := base64.StdEncoding.EncodeToString(data)
	body := api.Input{DataBase64: &b64, EOF: eof}
	return c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "commands", strconv.Itoa(pid), "input"), json: body}, nil)
}

// Signal sends a signal ("SIGTERM", "KILL", "9") to a process's group.
func (c *Client) Signal(ctx context.Context, sandboxID string, pid int, signal string) error {
	sig, err := json.Marshal(signal)
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "commands", strconv.Itoa(pid), "signal"),
		json: api.Signal{Signal: sig}}, nil)
}
