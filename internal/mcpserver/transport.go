package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
)

// errCut is what the body of a response the handler cut short (or
// panicked in) fails with: a broken transfer, as over a network.
var errCut = errors.New("the server cut the response short")

// Transport is an http.RoundTripper that serves each request with h in
// the same process: the server's /mcp endpoint gives its tools a client
// whose requests go through the server's own handler (authentication,
// limits, metering and all) without a network hop or a known address.
// Response bodies stream: the handler's writes reach the body's reader as
// they are flushed or written.
//
// The handler runs on a goroutine of the transport's, which no net/http
// server recovers: a panic there is recovered, logged and ends that
// response alone (as a broken body, or an error before the headers),
// never raised again. Requests go to the handler without the
// http.ServerContextKey of the request that carried the MCP message, so
// that nothing below takes this goroutine for a net/http server's; the
// response writer cuts its response itself (Abort, for
// internal/abort).
type Transport struct {
	Handler http.Handler
	// Logger logs what a handler's panic was [slog.Default()].
	Logger *slog.Logger
}

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := context.WithValue(req.Context(), http.ServerContextKey, nil)
	r := req.Clone(ctx)
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = r.URL.RequestURI()
	if r.RemoteAddr == "" {
		r.RemoteAddr = "in-process"
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, started: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				log := t.Logger
				if log == nil {
					log = slog.Default()
				}
				if p != http.ErrAbortHandler {
					log.Error("panic in an in-process request", "method", r.Method, "path", r.URL.Path,
						"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				}
				w.Abort()
			}
		}()
		t.Handler.ServeHTTP(w, r)
		w.start(http.StatusOK)
		pw.Close()
	}()
	select {
	case <-w.started:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	if w.cut {
		return nil, errCut
	}
	return &http.Response{Status: http.StatusText(w.code), StatusCode: w.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req}, nil
}

// pipeWriter is the handler's side of an in-process response.
type pipeWriter struct {
	header  http.Header
	pw      *io.PipeWriter
	once    sync.Once
	started chan struct{} // closed at the first write, WriteHeader, the end or a cut
	// Set once, before started is closed.
	code int
	sent http.Header // the header as of the start
	cut  bool        // cut before the start: no response at all
}

func (w *pipeWriter) start(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return // informational: not part of the response here
	}
	w.start(code)
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.start(http.StatusOK)
	return w.pw.Write(b)
}

// Flush implements http.Flusher: writes are unbuffered already.
func (w *pipeWriter) Flush() { w.start(http.StatusOK) }

// Abort cuts the response short (internal/abort's Aborter): before its
// start, the round trip fails; after, its body's reader gets errCut.
func (w *pipeWriter) Abort() {
	w.once.Do(func() {
		w.cut = true
		close(w.started)
	})
	w.pw.CloseWithError(errCut)
}
