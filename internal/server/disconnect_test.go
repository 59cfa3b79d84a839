package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// logRecords keeps the records a server logs.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// find returns the records whose message is msg and whose attributes
// include key=value (any value when value is "").
func (l *logRecords) find(msg, key, value string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if r.Message != msg {
			continue
		}
		ok := key == ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key && (value == "" || a.Value.String() == value) {
				ok = true
			}
			return true
		})
		if ok {
			out = append(out, r)
		}
	}
	return out
}

// errors returns the records at level Error.
func (l *logRecords) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level >= slog.LevelError {
			var b strings.Builder
			b.WriteString(r.Message)
			r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
			out = append(out, b.String())
		}
	}
	return out
}

// newLoggedEnv is newEnv with the server's log kept in logs.
func newLoggedEnv(t *testing.T, cfg server.Config, logs *logRecords, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvLog(t, cfg, slog.New(logs), opts...)
}

// TestClientGoneIsNotAnError: a client that hangs up mid-upload, or
// while its execution runs, is logged at debug and counted as 499 (or,
// for a body that broke off, 400), never as a 500 with an error in the
// log. Before, both were logged at ERROR as ERR_INTERNAL and counted as
// HTTP 500.
func TestClientGoneIsNotAnError(t *testing.T) {
	t.Parallel()
	logs := &logRecords{}
	e := newLoggedEnv(t, server.Config{}, logs)
	id := e.create(e.keyA, nil)
	host := strings.TrimPrefix(e.url, "http://")

	// An upload of 1 MiB cut after 64 KiB.
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Request-Id: upload-cut\r\nContent-Length: %d\r\n\r\n", id, e.keyA, 1<<20)
	conn.Write(bytes.Repeat([]byte("x"), 64<<10))
	conn.Close()

	// An execution whose client leaves while it runs.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/sandboxes/"+id+"/execute", strings.NewReader(`{"code":"import time; time.sleep(30)"}`))
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	req.Header.Set("X-Request-Id", "execute-left")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	e.waitRecorded(t, id, "time.sleep(30)", 1)
	cancel()
	<-done

	for deadline := time.Now().Add(10 * time.Second); len(logs.find("request", "request_id", "upload-cut")) == 0 ||
		len(logs.find("request", "request_id", "execute-left")) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the requests were not logged")
		}
	}
	if errs := logs.errors(); len(errs) > 0 {
		t.Fatalf("logged at ERROR: %q", errs)
	}
	status := func(rid string) string {
		var s string
		logs.find("request", "request_id", rid)[0].Attrs(func(a slog.Attr) bool {
			if a.Key == "status" {
				s = a.Value.String()
			}
			return true
		})
		return s
	}
	if s := status("upload-cut"); s != "400" && s != "499" {
		t.Fatalf("the cut upload's status: %s", s)
	}
	if s := status("execute-left"); s != "499" {
		t.Fatalf("the left execution's status: %s", s)
	}
	_, admin, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	fams := e.scrape(admin)
	for _, route := range []string{"PUT /v1/sandboxes/{id}/files", "POST /v1/sandboxes/{id}/execute"} {
		if n := value(fams, "sheepfold_http_requests_total", "route", route, "code", "500"); n != 0 {
			t.Fatalf("%s counted %v HTTP 500s", route, n)
		}
	}
	if n := value(fams, "sheepfold_http_requests_total", "route", "POST /v1/sandboxes/{id}/execute", "code", "499"); n != 1 {
		t.Fatalf("the left execution counted as 499: %v", n)
	}
}
