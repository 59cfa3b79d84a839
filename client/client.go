// Package client is the Go SDK of the Sheepfold REST API (/v1). It imports
// nothing of Sheepfold's internals: only the standard library and api,
// whose wire types it takes as its own through type aliases
// (client.Sandbox is api.Sandbox), so that the SDK and the server speak
// one vocabulary.
//
//	c := client.New("http://127.0.0.1:8080", os.Getenv("SHEEPFOLD_API_KEY"))
//	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 5 * time.Minute})
//	if err != nil {
//		return err
//	}
//	defer c.Kill(ctx, sb.ID)
//
//	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "print(6*7)"})
//	fmt.Print(ex.Stdout) // 42
//
//	// Streaming: output as it comes.
//	_, err = c.ExecuteStream(ctx, sb.ID, client.ExecuteRequest{Code: "for i in range(3): print(i)"},
//		client.ExecuteHandlers{OnStdout: func(s string) { fmt.Print(s) }})
//
//	_, err = c.WriteFile(ctx, sb.ID, "data.csv", strings.NewReader("a,b\n1,2\n"))
//	res, err := c.RunCommand(ctx, sb.ID, client.CommandRequest{Cmd: "wc", Args: []string{"-l", "data.csv"}})
//
// Every API failure is an *Error with the API's code, which matches its
// typed error (errors.go: one client.ErrXxx per code) with errors.Is:
//
//	if errors.Is(err, client.ErrSandboxNotFound) { ... }
//	var apiErr *client.Error
//	if errors.As(err, &apiErr) { log.Print(apiErr.Code, apiErr.Message, apiErr.RequestID) }
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// Client talks to one Sheepfold server with one API key. It is safe for
// concurrent use.
type Client struct {
	base  string
	key   string
	hc    *http.Client
	agent string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (timeouts, transport). Streaming
// calls last as long as the code runs: prefer contexts to a Timeout.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.agent = ua } }

// New returns a client for the server at baseURL (e.g.
// "http://127.0.0.1:8080") using apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: apiKey, hc: http.DefaultClient, agent: "sheepfold-go"}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Error is a failure reported by the API.
type Error struct {
	Code      string // e.g. "ERR_SANDBOX_NOT_FOUND"
	Message   string
	Status    int // HTTP status; 0 when reported inside a stream
	RequestID string
	// RetryAfter is the server's Retry-After (rate limits, capacity).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := fmt.Sprintf("sheepfold: %s: %s", e.Code, e.Message)
	if e.RequestID != "" {
		s += " (request " + e.RequestID + ")"
	}
	return s
}

// apiError is the *Error of an error body of the API.
func apiError(b api.Error, status int) *Error {
	return &Error{Code: b.Error.Code, Message: b.Error.Message, Status: status, RequestID: b.Error.RequestID}
}

// request is one API call.
type request struct {
	method, path string
	query        url.Values
	json         any       // JSON body
	body         io.Reader // raw body
	contentType  string
	accept       string
}

// do sends r and returns the response if its status is 2xx; otherwise it
// returns the API's *Error.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	body := r.body
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, err
		}
		body, r.contentType = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("User-Agent", c.agent)
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return res, nil
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	var eb api.Error
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
		return nil, &Error{Code: "ERR_HTTP", Message: fmt.Sprintf("%s: %s", res.Status, strings.TrimSpace(string(b))),
			Status: res.StatusCode, RequestID: res.Header.Get("X-Request-Id")}
	}
	e := apiError(eb, res.StatusCode)
	if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && ra >= 0 {
		e.RetryAfter = time.Duration(ra) * time.Second
	}
	return nil, e
}

// call sends r and decodes a JSON answer into out (which may be nil).
func (c *Client) call(ctx context.Context, r request, out any) error {
	res, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, res.Body)
		return err
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("sheepfold: decode %s %s: %w", r.method, r.path, err)
	}
	return nil
}

// maxLine bounds one NDJSON line (a result may carry a large image).
const maxLine = 64 << 20

// stream sends r asking for NDJSON and calls on for each line until the
// body ends. A "failure" line becomes an *Error.
func (c *Client) stream(ctx context.Context, r request, on func(typ string, line []byte) error) error {
	r.accept = "application/x-ndjson"
	res, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return fmt.Errorf("sheepfold: bad stream line: %w", err)
		}
		if head.Type == "failure" {
			var eb api.Error
			if err := json.Unmarshal(line, &eb); err != nil {
				return fmt.Errorf("sheepfold: bad failure line: %w", err)
			}
			return apiError(eb, 0)
		}
		if err := on(head.Type, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return nil
}

// errNoDone reports a stream that ended without its final event.
var errNoDone = errors.New("sheepfold: the stream ended before its done event")

func sandboxPath(id string, parts ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, s := range parts {
		p += "/" + s
	}
	return p
}
