package mcpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/abort"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// get sends GET / through t and returns the body it read and the error
// of the round trip or of the body.
func get(t *testing.T, tr http.RoundTripper) (string, error) {
	t.Helper()
	// The request an MCP message came in on carries a net/http server's
	// context: nothing below may take the transport's goroutine for one.
	ctx := context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})
	req, err := http.NewRequestWithContext(ctx, "GET", "http://in-process/", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), err
}

// TestTransportSurvivesHandlers: whatever a handler does on the
// transport's goroutine (panic before or after its headers, raise
// http.ErrAbortHandler, cut its response), that response alone breaks,
// and the process lives on to serve the next.
func TestTransportSurvivesHandlers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		h       http.HandlerFunc
		body    string
		errText string
	}{
		{"panic before the headers", func(w http.ResponseWriter, r *http.Request) { panic("boom") }, "", errCut.Error()},
		{"panic mid-body", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "part")
			panic(errors.New("boom"))
		}, "part", errCut.Error()},
		{"http.ErrAbortHandler", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "part")
			panic(http.ErrAbortHandler)
		}, "part", errCut.Error()},
		{"abort.Response mid-body", func(w http.ResponseWriter, r *http.Request) {
			if r.Context().Value(http.ServerContextKey) != nil {
				io.WriteString(w, "taken for a net/http server's goroutine")
				return
			}
			io.WriteString(w, "part")
			abort.Response(r.Context())
			io.WriteString(w, "never")
		}, "part", errCut.Error()},
		{"abort.Response before the headers", func(w http.ResponseWriter, r *http.Request) {
			abort.Response(r.Context())
			w.WriteHeader(http.StatusTeapot)
		}, "", errCut.Error()},
		{"a whole response", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "whole") }, "whole", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, err := get(t, Transport{Handler: abort.Handler(c.h), Logger: quiet})
			if body != c.body || (err == nil) != (c.errText == "") || err != nil && !strings.Contains(err.Error(), c.errText) {
				t.Fatalf("read %q, %v; want %q and an error %q", body, err, c.body, c.errText)
			}
		})
	}
}

// panicTransport is a client's transport that panics, as a bug below a
// tool would.
type panicTransport struct{}

func (panicTransport) RoundTrip(*http.Request) (*http.Response, error) { panic("a bug below the tool") }

// TestToolPanicIsAnError: a tool whose call panics (on the MCP SDK's own
// goroutine, where nothing else would recover it) fails that call with
// ERR_INTERNAL; the server answers the next.
func TestToolPanicIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := New(client.New("http://nowhere", "sf_x", client.WithHTTPClient(&http.Client{Transport: panicTransport{}})), "test")
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"sandbox_id": "sbx", "path": "a"}})
		if err != nil {
			t.Fatal(err)
		}
		text := ""
		if len(res.Content) > 0 {
			text = res.Content[0].(*mcp.TextContent).Text
		}
		if !res.IsError || !strings.HasPrefix(text, "ERR_INTERNAL") {
			t.Fatalf("a tool that panicked answered %v %q", res.IsError, text)
		}
	}
}
