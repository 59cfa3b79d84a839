package mcpserver

import (
	"io"
	"net/http"
	"sync"
)

// Transport is an http.RoundTripper that serves each request with h in
// the same process: the server's /mcp endpoint gives its tools a client
// whose requests go through the server's own handler (authentication,
// limits, metering and all) without a network hop or a known address.
// Response bodies stream: the handler's writes reach the body's reader as
// they are flushed or written.
type Transport struct{ Handler http.Handler }

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
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
				w.start(http.StatusInternalServerError)
				pw.CloseWithError(io.ErrUnexpectedEOF)
				panic(p)
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
	return &http.Response{Status: http.StatusText(w.code), StatusCode: w.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req}, nil
}

// pipeWriter is the handler's side of an in-process response.
type pipeWriter struct {
	header  http.Header
	pw      *io.PipeWriter
	once    sync.Once
	started chan struct{} // closed at the first write, WriteHeader or the end
	code    int
	sent    http.Header // the header as of the start
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
