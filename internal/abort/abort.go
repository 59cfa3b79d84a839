// Package abort cuts HTTP responses short without a panic in handler
// code: a download whose source fails mid-body, a stream whose sandbox
// died, a response its client stopped reading. The client must see a
// broken transfer, never a complete-looking one, and nothing else may
// break with it.
//
// net/http's way is panic(http.ErrAbortHandler), which its server
// recovers on its own goroutine only: raised anywhere else (a goroutine
// a handler started, a transport that calls handlers in process, as the
// server's /mcp does) it stops the whole process, every tenant's
// sandboxes with it. So handlers call Response instead, which marks the
// response cut and makes its later writes fail; the handler returns as it
// would on any write error. Handler, outermost around them, then ends the
// response: through the writer's own Abort method when it has one (an
// in-process transport), else with the one panic(http.ErrAbortHandler)
// of the code base, only when the request came through a net/http
// server, whose goroutine this is. A test (TestNoRepanic) refuses any
// other such panic, and any re-panic of a recovered value, in the
// server's code.
//
// Imports: the standard library only.
package abort

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
)

// ErrAborted is what writes to a response fail with once it is cut.
var ErrAborted = errors.New("the response was cut short")

// Aborter is a ResponseWriter that can cut its response short itself
// (an in-process transport: its reader then sees a broken body).
type Aborter interface {
	Abort()
}

type ctxKey struct{}

// state is one request's abort flag.
type state struct{ cut atomic.Bool }

// Response cuts short the response of the request ctx belongs to: the
// client sees its connection (or stream) broken, and every later write
// fails with ErrAborted. The caller returns once it has called it. It is
// safe from any goroutine, and does nothing outside a Handler.
func Response(ctx context.Context) {
	if st, ok := ctx.Value(ctxKey{}).(*state); ok {
		st.cut.Store(true)
	}
}

// Aborted reports whether the response of ctx's request was cut short.
func Aborted(ctx context.Context) bool {
	st, ok := ctx.Value(ctxKey{}).(*state)
	return ok && st.cut.Load()
}

// Handler gives next's requests the means to be cut short (Response),
// and cuts the response once next has returned. A Handler inside another
// (its ResponseWriter is, or wraps, the other's) leaves it to the outer
// one. A request served in process for another (the context of which it
// inherits) is a response of its own, cut on its own.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if inside(w) {
			next.ServeHTTP(w, r)
			return
		}
		st := &state{}
		next.ServeHTTP(&writer{ResponseWriter: w, st: st}, r.WithContext(context.WithValue(r.Context(), ctxKey{}, st)))
		if !st.cut.Load() {
			return
		}
		for rw := w; rw != nil; {
			if a, ok := rw.(Aborter); ok {
				a.Abort()
				return
			}
			u, ok := rw.(interface{ Unwrap() http.ResponseWriter })
			if !ok {
				break
			}
			rw = u.Unwrap()
		}
		if r.Context().Value(http.ServerContextKey) != nil {
			// This goroutine is the net/http server's own, which
			// recovers this panic and breaks the connection (or resets
			// the HTTP/2 stream). The one place it is raised.
			panic(http.ErrAbortHandler)
		}
		// No server to break a connection (a test's recorder): the
		// response ends where it was cut.
	})
}

// inside reports whether w is, or wraps, a Handler's writer.
func inside(w http.ResponseWriter) bool {
	for w != nil {
		if _, ok := w.(*writer); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// writer refuses writes once its response is cut.
type writer struct {
	http.ResponseWriter
	st *state
}

func (w *writer) WriteHeader(code int) {
	if !w.st.cut.Load() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	if w.st.cut.Load() {
		return 0, ErrAborted
	}
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher.
func (w *writer) Flush() {
	if !w.st.cut.Load() {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// FlushError implements the ResponseController's flush with an error.
func (w *writer) FlushError() error {
	if w.st.cut.Load() {
		return ErrAborted
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// hijacking).
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
