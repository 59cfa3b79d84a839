package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// volatile fields are replaced by "<name>" before comparing shapes.
var volatile = map[string]bool{
	"id": true, "created_at": true, "expires_at": true, "request_id": true, "mod_time": true,
	"execution_time_ms": true, "cpu_time_ms": true, "peak_memory_bytes": true, "pid": true,
	"owner": true, "group": true, "message": true, "traceback": true,
}

func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if volatile[k] {
				x[k] = "<" + k + ">"
			} else {
				x[k] = normalize(val)
			}
		}
	case []any:
		for i := range x {
			x[i] = normalize(x[i])
		}
	}
	return v
}

// golden compares a JSON response, with volatile fields normalized, to
// testdata/<name>.json.
// Top-level keys in drop are left out (their text depends on the kernel).
func golden(t *testing.T, name string, body []byte, drop ...string) {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, body)
	}
	if m, ok := v.(map[string]any); ok {
		for _, k := range drop {
			delete(m, k)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(normalize(v)); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	path := filepath.Join("testdata", name+".json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s:\n%s", name, path, got)
	}
}

func TestGoldenShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"metadata": map[string]string{"k": "v"}})
	golden(t, "sandbox", r.body)
	id := r.json(t)["id"].(string)
	golden(t, "error_not_found", e.do("GET", "/v1/sandboxes/nope", e.keyA, nil).body)
	golden(t, "execution", e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "print('hi')"}).body)
	golden(t, "execution_error", e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA,
		map[string]any{"code": "raise ValueError('x')"}).body, "stderr")
	golden(t, "file_info", e.do("PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/a.txt", e.keyA, "abc").body)
	golden(t, "command", e.do("POST", "/v1/sandboxes/"+id+"/commands", e.keyA,
		map[string]any{"cmd": "echo", "args": []string{"x"}, "cwd": "/home/user"}).body)
}

// TestServeAndShutdown runs the server on a real listener and checks that
// Shutdown lets a request in flight finish.
func TestServeAndShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()

	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/sandboxes/"+id+"/execute",
			strings.NewReader(`{"code":"import time\nopen('started', 'w').close()\ntime.sleep(1)\nprint('finished')"}`))
		req.Header.Set("Authorization", "Bearer "+e.keyA)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			inflight <- result{err: err}
			return
		}
		defer res.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(res.Body)
		inflight <- result{status: res.StatusCode, body: b.String()}
	}()
	// The execution is running once it made its file.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(e.home(id), "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution never started")
		}
		time.Sleep(10 * time.Millisecond) // polling the real condition
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	r := <-inflight
	if r.err != nil || r.status != 200 || !strings.Contains(r.body, "finished") {
		t.Fatalf("in-flight request: %+v", r)
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Fatal("the server still accepts connections after Shutdown")
	}
	// The handler itself reports not ready once draining.
	if r := e.do("GET", "/readyz", "", nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz while draining: %d", r.status)
	}
}
