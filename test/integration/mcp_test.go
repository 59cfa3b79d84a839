package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPStdio: a desktop agent's view. `sheepfold mcp` over stdio, driven
// by the MCP SDK's client, runs code against a real server: a matplotlib
// chart comes back as a PNG image.
func TestMCPStdio(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.Command(s.bin, "mcp")
	cmd.Env = append(os.Environ(), "SHEEPFOLD_URL="+s.url, "SHEEPFOLD_API_KEY="+s.key)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_sandbox", Arguments: map[string]any{"timeout_seconds": 120}})
	if err != nil || res.IsError {
		t.Fatalf("create_sandbox: %v %v", err, res)
	}
	id, _ := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	defer cs.CallTool(ctx, &mcp.CallToolParams{Name: "kill_sandbox", Arguments: map[string]any{"sandbox_id": id}})
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"sandbox_id": id, "code": `
import matplotlib.pyplot as plt
plt.plot([1, 3, 2])
plt.title("stock")
plt.show()
print("plotted")`}})
	if err != nil || res.IsError {
		t.Fatalf("run_code: %v %+v", err, res)
	}
	var text string
	var png []byte
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			text += c.Text
		case *mcp.ImageContent:
			if c.MIMEType == "image/png" {
				png = c.Data
			}
		}
	}
	if !strings.Contains(text, "plotted") || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 1000 {
		t.Fatalf("run_code: text %q, png %d bytes", text, len(png))
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox_id": id, "command": "id -un"}})
	if err != nil || res.IsError || res.StructuredContent.(map[string]any)["stdout"] != "user\n" {
		t.Fatalf("run_command: %v %+v", err, res)
	}
}

// TestMCPStdioBadKey: a wrong key is reported by the first tool call, as
// the server's ERR_AUTHENTICATION_FAILED.
func TestMCPStdioBadKey(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.Command(s.bin, "mcp")
	cmd.Env = append(os.Environ(), "SHEEPFOLD_URL="+s.url, "SHEEPFOLD_API_KEY=sf_wrong")
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_sandbox"})
	if err != nil || !res.IsError || !strings.HasPrefix(res.Content[0].(*mcp.TextContent).Text, "ERR_AUTHENTICATION_FAILED") {
		t.Fatalf("create_sandbox with a wrong key: %v %+v", err, res)
	}
}
