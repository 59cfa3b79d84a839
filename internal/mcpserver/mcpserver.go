// Package mcpserver offers Sheepfold's sandboxes to agents as Model
// Context Protocol tools: create_sandbox, run_code, run_command,
// read_file, write_file, list_files and kill_sandbox.
//
// Every tool acts through the Go SDK (package client) with the caller's
// own API key, so a tool call is an ordinary API request: the same
// authentication, account limits, quotas, metering and security policy
// apply, and the same error codes come back (as tool errors whose text
// starts with the code). `sheepfold mcp` serves the tools over stdio with
// a client of a running server; the server's `/mcp` endpoint serves them
// over streamable HTTP with a client that calls the server in process
// (Transport).
//
// A tool's numbers are checked (internal/bound) before they become
// durations, so that none wraps on the way to the server.
//
// # The tools and the /mcp transport
//
// `internal/mcpserver` defines the MCP tools (with
// github.com/modelcontextprotocol/go-sdk) over the Go SDK's `client.Client`,
// so a tool is an API call and nothing about authentication, limits,
// metering or policy is implemented twice. `sheepfold mcp` gives the tools a
// client of a running server over HTTP and serves them on stdio. The
// server's `POST /mcp` (stateless streamable HTTP) builds the tool server per
// request with the caller's key and a client whose transport
// (`mcpserver.Transport`) runs each request through the server's own handler
// in process: no network hop, no address to configure, and the request is
// authenticated, limited, logged and metered as if it had come over the
// wire. `read_file` returns at most 1 MiB and `write_file` takes at most
// 8 MiB, since a tool result is one JSON-RPC message. The transport runs
// each request on a goroutine of its own, which no net/http server
// recovers: a response cut short (`read_file` stops reading past its
// bound) or a panic there ends that response alone, and its requests carry
// no `http.ServerContextKey`, so nothing below takes that goroutine for a
// net/http server's; a tool whose handler panics fails that call with
// `ERR_INTERNAL`.
//
// Imports: the Go SDK (client), the MCP SDK
// (github.com/modelcontextprotocol/go-sdk), internal/bound and
// internal/apierr (the ranges of numbers and their errors) and the
// standard library; nothing of the engine.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
)

// MaxReadBytes bounds what read_file returns: tool results travel in one
// JSON-RPC message, and a model cannot use more.
const MaxReadBytes = 1 << 20

// MaxWriteBytes bounds what write_file accepts (decoded; base64 of it fits
// in the server's 16 MiB request bound).
const MaxWriteBytes = 8 << 20

// New returns an MCP server whose tools act through c.
func New(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "sheepfold", Title: "Sheepfold sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: "Run untrusted code in isolated Linux sandboxes. Create a sandbox, " +
			"run Python (or JavaScript, TypeScript, Bash) in it with run_code (variables persist between calls), " +
			"run shell commands, and read and write its files. Kill it when done."})
	t := tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox",
		Description: "Create a sandbox and return its id. Network is off unless the security policy allows it.",
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)}}, guard(t.createSandbox))
	mcp.AddTool(s, &mcp.Tool{Name: "run_code",
		Description: "Run code in a sandbox's stateful context (Python by default) and return its output, " +
			"results (charts as images) and error."}, guard(t.runCode))
	mcp.AddTool(s, &mcp.Tool{Name: "run_command",
		Description: "Run a shell command (bash -c) in a sandbox and return its exit code and output."}, guard(t.runCommand))
	mcp.AddTool(s, &mcp.Tool{Name: "read_file",
		Description: fmt.Sprintf("Read a file of a sandbox (at most %d bytes): UTF-8 text, or base64 when asked.", MaxReadBytes),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, guard(t.readFile))
	mcp.AddTool(s, &mcp.Tool{Name: "write_file",
		Description: "Write a file in a sandbox, creating its parent directories."}, guard(t.writeFile))
	mcp.AddTool(s, &mcp.Tool{Name: "list_files",
		Description: "List a directory of a sandbox.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, guard(t.listFiles))
	mcp.AddTool(s, &mcp.Tool{Name: "kill_sandbox",
		Description: "Stop a sandbox and discard its files.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, guard(t.killSandbox))
	return s
}

func ptr[T any](v T) *T { return &v }

// guard recovers a panic of a tool's handler as that call's error
// (ERR_INTERNAL), logged with its stack: the MCP SDK runs handlers on
// goroutines of its own, where a panic would stop the whole server.
func guard[In, Out any](h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (res *mcp.CallToolResult, out Out, err error) {
		defer func() {
			if p := recover(); p != nil {
				name := ""
				if req != nil && req.Params != nil {
					name = req.Params.Name
				}
				slog.Default().Error("panic in an MCP tool", "tool", name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				var zero Out
				res, out, err = nil, zero, errors.New("ERR_INTERNAL: internal error")
			}
		}()
		return h(ctx, req, in)
	}
}

type tools struct{ c *client.Client }

// toolError makes an API error the tool's error text: "CODE: message".
func toolError(err error) error {
	var ae *client.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: %s", ae.Code, ae.Message)
	}
	return err
}

// boundError is a refused number as a tool's error text: "CODE: message".
func boundError(err error) error {
	e := apierr.From(err)
	return fmt.Errorf("%s: %s", e.Code, e.Message)
}

type createIn struct {
	Template       string            `json:"template,omitempty" jsonschema:"the template (default: the server's)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"the sandbox's lifetime in seconds (default: the server's)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables of every process in the sandbox"`
	SecurityPolicy map[string]any    `json:"security_policy,omitempty" jsonschema:"the security policy (README: Policies and network)"`
	Resources      *resourcesIn      `json:"resources,omitempty" jsonschema:"the sandbox's limits (default: the server's), within the account's"`
}

type resourcesIn struct {
	CPUs     float64 `json:"cpus,omitempty" jsonschema:"CPU quota in cores"`
	MemoryMB int64   `json:"memory_mb,omitempty" jsonschema:"memory limit, MiB"`
	DiskMB   int64   `json:"disk_mb,omitempty" jsonschema:"size of the writable disk, MiB"`
	Pids     int64   `json:"pids,omitempty" jsonschema:"most processes and threads"`
}

type sandboxOut struct {
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (t tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, sandboxOut, error) {
	var timeout time.Duration
	if in.TimeoutSeconds != 0 {
		var err error
		if timeout, err = bound.WholeSeconds("timeout_seconds", int64(in.TimeoutSeconds), time.Second, bound.MaxDuration); err != nil {
			return nil, sandboxOut{}, boundError(err)
		}
	}
	req := client.CreateSandboxRequest{Template: in.Template, Timeout: timeout, Env: in.Env}
	if in.SecurityPolicy != nil {
		req.SecurityPolicy = in.SecurityPolicy
	}
	if r := in.Resources; r != nil {
		req.Resources = &client.Resources{CPUs: r.CPUs, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB, Pids: r.Pids}
	}
	sb, err := t.c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, sandboxOut{}, toolError(err)
	}
	return nil, sandboxOut{SandboxID: sb.ID, Template: sb.Template, State: sb.State, ExpiresAt: sb.ExpiresAt}, nil
}

type runCodeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox, from create_sandbox"`
	Code      string `json:"code" jsonschema:"the code to run"`
	Language  string `json:"language,omitempty" jsonschema:"python (default), javascript, typescript, bash, r or java"`
	ContextID string `json:"context_id,omitempty" jsonschema:"a context of the sandbox (default: the language's own)"`
	TimeoutMS int    `json:"timeout_ms,omitempty" jsonschema:"stop the code after this many milliseconds"`
}

// runCodeOut is run_code's structured result; images are in the content.
type runCodeOut struct {
	Status          string            `json:"status"`
	Stdout          string            `json:"stdout"`
	Stderr          string            `json:"stderr"`
	Results         []string          `json:"results"` // each result's text form
	Error           *client.ExecError `json:"error,omitempty"`
	ErrorCode       string            `json:"error_code,omitempty"`
	ExecutionTimeMS float64           `json:"execution_time_ms"`
}

func (t tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, runCodeOut, error) {
	if in.SandboxID == "" {
		return nil, runCodeOut{}, errors.New("ERR_BAD_REQUEST: sandbox_id is required (create one with create_sandbox)")
	}
	timeout, err := bound.Millis("timeout_ms", int64(in.TimeoutMS), 0, bound.MaxDuration)
	if err != nil {
		return nil, runCodeOut{}, boundError(err)
	}
	ex, err := t.c.Execute(ctx, in.SandboxID, client.ExecuteRequest{Code: in.Code, Language: in.Language,
		ContextID: in.ContextID, Timeout: timeout})
	if err != nil {
		return nil, runCodeOut{}, toolError(err)
	}
	out := runCodeOut{Status: ex.Status, Stdout: ex.Stdout, Stderr: ex.Stderr, Results: []string{}, Error: ex.Error,
		ErrorCode: ex.ErrorCode, ExecutionTimeMS: ex.ExecutionTimeMS}
	res := &mcp.CallToolResult{IsError: ex.Status != client.StatusSuccess}
	var text strings.Builder
	fmt.Fprintf(&text, "status: %s (%.1f ms)\n", ex.Status, ex.ExecutionTimeMS)
	section(&text, "stdout", ex.Stdout)
	section(&text, "stderr", ex.Stderr)
	for _, r := range ex.Results {
		out.Results = append(out.Results, r.Text)
		section(&text, "result", r.Text)
		for _, img := range []struct{ b64, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
			if img.b64 == "" {
				continue
			}
			data, err := base64.StdEncoding.DecodeString(img.b64)
			if err != nil {
				return nil, runCodeOut{}, fmt.Errorf("a result's %s is not base64: %w", img.mime, err)
			}
			res.Content = append(res.Content, &mcp.ImageContent{Data: data, MIMEType: img.mime})
		}
	}
	if ex.Error != nil {
		section(&text, "error", fmt.Sprintf("%s: %s\n%s", ex.Error.Name, ex.Error.Value, ex.Error.Traceback))
	}
	if ex.ErrorCode != "" {
		fmt.Fprintf(&text, "error_code: %s\n", ex.ErrorCode)
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: text.String()}}, res.Content...)
	return res, out, nil
}

// section appends a labelled block when s is not empty.
func section(b *strings.Builder, label, s string) {
	if s == "" {
		return
	}
	fmt.Fprintf(b, "%s:\n%s", label, s)
	if !strings.HasSuffix(s, "\n") {
		b.WriteByte('\n')
	}
}

type runCommandIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox, from create_sandbox"`
	Command   string            `json:"command" jsonschema:"a shell command line, run with bash -c"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"the working directory (default: /home/user)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	TimeoutMS int               `json:"timeout_ms,omitempty" jsonschema:"kill the command after this many milliseconds (default 60000)"`
}

type runCommandOut struct {
	ExitCode  int    `json:"exit_code"`
	Status    string `json:"status"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

func (t tools) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in runCommandIn) (*mcp.CallToolResult, runCommandOut, error) {
	if in.SandboxID == "" || in.Command == "" {
		return nil, runCommandOut{}, errors.New("ERR_BAD_REQUEST: sandbox_id and command are required")
	}
	timeout, err := bound.Millis("timeout_ms", int64(in.TimeoutMS), 0, bound.MaxDuration)
	if err != nil {
		return nil, runCommandOut{}, boundError(err)
	}
	r, err := t.c.RunCommand(ctx, in.SandboxID, client.CommandRequest{Cmd: "bash", Args: []string{"-c", in.Command},
		Cwd: in.Cwd, Env: in.Env, Timeout: timeout})
	if err != nil {
		return nil, runCommandOut{}, toolError(err)
	}
	out := runCommandOut{ExitCode: r.ExitCode, Status: r.Status, Stdout: r.Stdout, Stderr: r.Stderr, Truncated: r.Truncated}
	var text strings.Builder
	fmt.Fprintf(&text, "exit code: %d (%s)\n", r.ExitCode, r.Status)
	section(&text, "stdout", r.Stdout)
	section(&text, "stderr", r.Stderr)
	return &mcp.CallToolResult{IsError: r.Status != "exited" || r.ExitCode != 0,
		Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}}, out, nil
}

type readIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Path      string `json:"path" jsonschema:"absolute, or relative to /home/user"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
}

func (t tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in readIn) (*mcp.CallToolResult, any, error) {
	if in.SandboxID == "" || in.Path == "" {
		return nil, nil, errors.New("ERR_BAD_REQUEST: sandbox_id and path are required")
	}
	if in.Encoding != "" && in.Encoding != "utf8" && in.Encoding != "base64" {
		return nil, nil, fmt.Errorf("ERR_BAD_REQUEST: encoding must be utf8 or base64, not %q", in.Encoding)
	}
	rc, err := t.c.OpenFile(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, nil, toolError(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxReadBytes+1))
	if err != nil {
		return nil, nil, toolError(err)
	}
	if len(data) > MaxReadBytes {
		return nil, nil, fmt.Errorf("ERR_BAD_REQUEST: %s is larger than the %d bytes read_file returns; read a part with run_command", in.Path, MaxReadBytes)
	}
	text := string(data)
	if in.Encoding == "base64" {
		text = base64.StdEncoding.EncodeToString(data)
	} else if !utf8.Valid(data) {
		return nil, nil, fmt.Errorf("ERR_BAD_REQUEST: %s is not UTF-8 text; read it with encoding base64", in.Path)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
}

type writeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Path      string `json:"path" jsonschema:"absolute, or relative to /home/user"`
	Content   string `json:"content" jsonschema:"the file's contents"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
}

type fileOut struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

func (t tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, fileOut, error) {
	if in.SandboxID == "" || in.Path == "" {
		return nil, fileOut{}, errors.New("ERR_BAD_REQUEST: sandbox_id and path are required")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fileOut{}, fmt.Errorf("ERR_BAD_REQUEST: content is not base64: %v", err)
		}
	default:
		return nil, fileOut{}, fmt.Errorf("ERR_BAD_REQUEST: encoding must be utf8 or base64, not %q", in.Encoding)
	}
	if len(data) > MaxWriteBytes {
		return nil, fileOut{}, fmt.Errorf("ERR_BAD_REQUEST: content is larger than the %d bytes write_file takes", MaxWriteBytes)
	}
	fi, err := t.c.WriteFile(ctx, in.SandboxID, in.Path, bytes.NewReader(data))
	if err != nil {
		return nil, fileOut{}, toolError(err)
	}
	return nil, fileOut{Path: fi.Path, Size: fi.Size}, nil
}

type listIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Path      string `json:"path,omitempty" jsonschema:"the directory (default: /home/user)"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend (default 1)"`
}

type listOut struct {
	Entries []entry `json:"entries"`
}

type entry struct {
	Path string `json:"path"`
	Type string `json:"type"`
	Size int64  `json:"size"`
}

func (t tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, listOut, error) {
	if in.SandboxID == "" {
		return nil, listOut{}, errors.New("ERR_BAD_REQUEST: sandbox_id is required")
	}
	if in.Depth < 0 {
		return nil, listOut{}, errors.New("ERR_BAD_REQUEST: depth must not be negative")
	}
	path := in.Path
	if path == "" {
		path = "/home/user"
	}
	l, err := t.c.ListFiles(ctx, in.SandboxID, path, in.Depth)
	if err != nil {
		return nil, listOut{}, toolError(err)
	}
	out := listOut{Entries: make([]entry, len(l))}
	for i, f := range l {
		out.Entries[i] = entry{Path: f.Path, Type: f.Type, Size: f.Size}
	}
	return nil, out, nil
}

type killIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to stop"`
}

type killOut struct {
	Killed bool `json:"killed"`
}

func (t tools) killSandbox(ctx context.Context, _ *mcp.CallToolRequest, in killIn) (*mcp.CallToolResult, killOut, error) {
	if in.SandboxID == "" {
		return nil, killOut{}, errors.New("ERR_BAD_REQUEST: sandbox_id is required")
	}
	if err := t.c.Kill(ctx, in.SandboxID); err != nil {
		return nil, killOut{}, toolError(err)
	}
	return nil, killOut{Killed: true}, nil
}
