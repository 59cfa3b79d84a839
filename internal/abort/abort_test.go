package abort_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/abort"
)

// cutAfter writes a first part of its body, then cuts the response, then
// tries to write the rest.
var cutAfter = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "20")
	io.WriteString(w, "first part")
	http.NewResponseController(w).Flush()
	abort.Response(r.Context())
	if _, err := io.WriteString(w, "the rest!!"); !errors.Is(err, abort.ErrAborted) {
		panic("a write after the cut: " + errString(err))
	}
	if !abort.Aborted(r.Context()) {
		panic("not aborted")
	}
})

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// TestResponseBreaksTheConnection: under a net/http server, a response
// cut after its first bytes reaches the client as a broken body, never as
// a whole one; the server serves the next request.
func TestResponseBreaksTheConnection(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(abort.Handler(abort.Handler(cutAfter))) // nested: the outer one acts
	defer srv.Close()
	for range 2 {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil || string(b) != "first part" {
			t.Fatalf("a cut response read as %q, %v; want its first part and an error", b, err)
		}
	}
}

// aborterWriter is an in-process transport's writer.
type aborterWriter struct {
	*httptest.ResponseRecorder
	aborted bool
}

func (a *aborterWriter) Abort() { a.aborted = true }

// TestResponseWithoutAServer: a writer that cuts its response itself is
// asked to, and without a net/http server (no ServerContextKey) nothing
// panics: the response ends where it was cut.
func TestResponseWithoutAServer(t *testing.T) {
	t.Parallel()
	h := abort.Handler(cutAfter)
	aw := &aborterWriter{ResponseRecorder: httptest.NewRecorder()}
	h.ServeHTTP(aw, httptest.NewRequest("GET", "/", nil))
	if !aw.aborted || aw.Body.String() != "first part" {
		t.Fatalf("aborted %v, body %q", aw.aborted, aw.Body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Body.String() != "first part" {
		t.Fatalf("body %q", rec.Body)
	}
	// Outside a Handler, Response does nothing.
	abort.Response(httptest.NewRequest("GET", "/", nil).Context())
}

// TestResponseBeforeHeaders: a response cut before anything was written
// sends nothing: the client sees the connection close, not a status.
func TestResponseBeforeHeaders(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(abort.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		abort.Response(r.Context())
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "never sent")
	})))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err == nil {
		res.Body.Close()
		t.Fatalf("a response cut before its headers got %s", res.Status)
	}
	if !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("a response cut before its headers: %v, want the connection closed", err)
	}
}

// TestResponseInProcess: a request served in process for another (as
// /mcp's tools call the server), whose context it inherits, is cut on
// its own: the outer response is whole.
func TestResponseInProcess(t *testing.T) {
	t.Parallel()
	inner := abort.Handler(cutAfter)
	srv := httptest.NewServer(abort.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aw := &aborterWriter{ResponseRecorder: httptest.NewRecorder()}
		inner.ServeHTTP(aw, r)
		if !aw.aborted {
			panic("the inner response was not cut")
		}
		io.WriteString(w, "outer whole")
	})))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(b) != "outer whole" {
		t.Fatalf("the outer response read as %q, %v", b, err)
	}
}

// BenchmarkHandler is what abort.Handler adds to every request: a
// writer, a flag and a context value.
func BenchmarkHandler(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	r := httptest.NewRequest("GET", "/", nil)
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare", ok}, {"abort.Handler", abort.Handler(ok)}} {
		b.Run(c.name, func(b *testing.B) {
			w := httptest.NewRecorder()
			for b.Loop() {
				c.h.ServeHTTP(w, r)
			}
		})
	}
}
