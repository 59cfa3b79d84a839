package server_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/mcpserver"
	"github.com/sheepfold/sheepfold/internal/server"
)

// keyTransport adds an API key to every request.
type keyTransport struct{ key string }

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect opens an MCP session with the server's /mcp under key.
func (e *env) mcpConnect(key string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	return c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: e.url + "/mcp",
		HTTPClient: &http.Client{Transport: keyTransport{key}}, MaxRetries: -1}, nil)
}

// call calls a tool and returns its result's text (the first content)
// and structured output.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text string
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			text = tc.Text
		}
	}
	out, _ := res.StructuredContent.(map[string]any)
	return res, text, out
}

// TestMCPTools drives every tool through /mcp with the MCP SDK's client:
// each acts under the caller's key, limits and policy.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	if _, err := e.mcpConnect("sk-wrong"); err == nil {
		t.Fatal("a wrong key opened an MCP session")
	}
	cs, err := e.mcpConnect(e.keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tl, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tl.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if got := strings.Join(names, " "); got != "create_sandbox kill_sandbox list_files read_file run_code run_command write_file" {
		t.Fatalf("tools: %s", got)
	}

	_, _, sb := call(t, cs, "create_sandbox", map[string]any{
		"security_policy": map[string]any{"access_control": map[string]any{"blocked_modules": []string{"socket"}}}})
	id, _ := sb["sandbox_id"].(string)
	if id == "" || sb["state"] != "running" {
		t.Fatalf("create_sandbox: %v", sb)
	}

	// State persists; results, output and images come back.
	call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x = 21"})
	res, text, out := call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": `
class Pic:
    def _repr_png_(self): return b"\x89PNG\r\n\x1a\nfake"
print("hello")
display(Pic())
x * 2`})
	if res.IsError || !strings.Contains(text, "hello") || !strings.Contains(text, "result:\n42") || out["status"] != "success" {
		t.Fatalf("run_code: error %v, text %q, out %v", res.IsError, text, out)
	}
	var png []byte
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok && img.MIMEType == "image/png" {
			png = img.Data
		}
	}
	if string(png) != "\x89PNG\r\n\x1a\nfake" {
		t.Fatalf("the PNG result: %q", png)
	}
	// An exception is a tool error with the traceback; the policy holds.
	res, text, _ = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "1/0"})
	if !res.IsError || !strings.Contains(text, "ZeroDivisionError") {
		t.Fatalf("1/0: error %v, text %q", res.IsError, text)
	}
	res, text, out = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import socket"})
	if !res.IsError || !strings.Contains(text, "ERR_MODULE_BLOCKED") || out["error_code"] != "ERR_MODULE_BLOCKED" {
		t.Fatalf("a blocked import: error %v, text %q, out %v", res.IsError, text, out)
	}

	res, text, out = call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo hi; echo oops >&2; exit 3"})
	if !res.IsError || out["exit_code"] != 3.0 || out["stdout"] != "hi\n" || !strings.Contains(text, "oops") {
		t.Fatalf("run_command: error %v, text %q, out %v", res.IsError, text, out)
	}

	// Files, as text and as base64.
	if res, _, out := call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "content": "héllo"}); res.IsError || out["size"] != 6.0 {
		t.Fatalf("write_file: %v %v", res.IsError, out)
	}
	if _, text, _ := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt"}); text != "héllo" {
		t.Fatalf("read_file: %q", text)
	}
	bin := []byte{0, 0xff, 0xfe, 1}
	call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	if res, text, _ := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "b.bin"}); !res.IsError || !strings.Contains(text, "base64") {
		t.Fatalf("read_file of binary as text: %v %q", res.IsError, text)
	}
	if _, text, _ := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "b.bin", "encoding": "base64"}); text != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read_file base64: %q", text)
	}
	if res, text, _ := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "missing.txt"}); !res.IsError || !strings.HasPrefix(text, "ERR_NOT_FOUND") {
		t.Fatalf("read_file of a missing file: %v %q", res.IsError, text)
	}
	if res, text, _ := call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "c", "content": "x", "encoding": "rot13"}); !res.IsError || !strings.HasPrefix(text, "ERR_BAD_REQUEST") {
		t.Fatalf("write_file with a bad encoding: %v %q", res.IsError, text)
	}
	_, _, out = call(t, cs, "list_files", map[string]any{"sandbox_id": id, "depth": 2})
	var paths []string
	for _, en := range out["entries"].([]any) {
		paths = append(paths, en.(map[string]any)["path"].(string))
	}
	if !slices.Contains(paths, "/home/user/notes/a.txt") || !slices.Contains(paths, "/home/user/b.bin") {
		t.Fatalf("list_files: %v", paths)
	}

	// Another account cannot reach the sandbox, nor a missing argument pass.
	other, err := e.mcpConnect(e.keyB)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if res, text, _ := call(t, other, "run_code", map[string]any{"sandbox_id": id, "code": "x"}); !res.IsError || !strings.HasPrefix(text, "ERR_SANDBOX_NOT_FOUND") {
		t.Fatalf("another account's run_code: %v %q", res.IsError, text)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"sandbox_id": id, "code": 5}}); err == nil && !res.IsError {
		t.Fatal("run_code with a number for code was accepted")
	}

	if _, _, out := call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}); out["killed"] != true {
		t.Fatalf("kill_sandbox: %v", out)
	}
	if res, text, _ := call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x"}); !res.IsError || !strings.HasPrefix(text, "ERR_SANDBOX") {
		t.Fatalf("run_code after kill: %v %q", res.IsError, text)
	}
}

// TestMCPOverNetworkClient runs the same tools with a client of the server
// over HTTP (what `sheepfold mcp` does over stdio).
func TestMCPOverNetworkClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := mcpserver.New(client.New(e.url, e.keyA), "test").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	_, _, sb := call(t, cs, "create_sandbox", nil)
	id, _ := sb["sandbox_id"].(string)
	if res, text, _ := call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "print(6*7)"}); res.IsError || !strings.Contains(text, "42") {
		t.Fatalf("run_code: %v %q", res.IsError, text)
	}
	call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id})
}
