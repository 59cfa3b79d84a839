package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestBatchRun: `sheepfold batch run` sends the handler file and the
// JSON Lines inputs, follows the batch to its end with a progress line on
// stderr, and prints the results as JSON Lines on stdout.
func TestBatchRun(t *testing.T) {
	var sent map[string]any
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/batches":
			b, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(b, &sent); err != nil {
				t.Errorf("body %q: %v", b, err)
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"bat_1","status":"running","total":2,"done":0,"failed":0,"pending":2}`)
		case "GET /v1/batches/bat_1":
			if gets.Add(1) == 1 {
				io.WriteString(w, `{"id":"bat_1","status":"running","total":2,"done":1,"failed":0,"pending":1}`)
				return
			}
			io.WriteString(w, `{"id":"bat_1","status":"done","total":2,"done":2,"failed":0,"pending":0,"usage":{"sandboxes":3,"cost":"0.01"}}`)
		case "GET /v1/batches/bat_1/results":
			if r.URL.Query().Get("after") != "-1" {
				t.Errorf("results asked after %q", r.URL.Query().Get("after"))
			}
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"index":0,"status":"done","attempts":1,"result":1,"ended_at":null}`+"\n"+
				`{"index":1,"status":"done","attempts":1,"result":"a","ended_at":null}`+"\n")
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	handler := filepath.Join(dir, "handler.py")
	os.WriteFile(handler, []byte("def handler(item):\n    return item\n"), 0o644)
	items := filepath.Join(dir, "items.jsonl")
	os.WriteFile(items, []byte("1\n\n\"a\"\n"), 0o644)
	run := func(args ...string) (string, string, error) {
		cmd := batchCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"run", "--url", srv.URL, "--api-key", "k", "--poll", "1ms"}, args...))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), errOut.String(), err
	}
	out, progress, err := run(handler, "--inputs", items, "--concurrency", "3", "--reuse", "worker")
	if err != nil {
		t.Fatal(err)
	}
	if sent["code"] != "def handler(item):\n    return item\n" || sent["concurrency"] != 3.0 || sent["reuse"] != "worker" {
		t.Fatalf("sent %v", sent)
	}
	if in, _ := sent["inputs"].([]any); len(in) != 2 || in[0] != 1.0 || in[1] != "a" {
		t.Fatalf("inputs sent %v", sent["inputs"])
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"result":1`) || !strings.Contains(lines[1], `"result":"a"`) {
		t.Fatalf("stdout %q", out)
	}
	if !strings.Contains(progress, "[##########..........] bat_1: 1/2 done") || !strings.Contains(progress, "[####################] bat_1: 2/2 done, 0 failed") ||
		!strings.Contains(progress, "bat_1 done: 3 sandboxes") {
		t.Fatalf("progress %q", progress)
	}
	os.WriteFile(items, []byte("1\n{bad\n"), 0o644)
	if _, _, err := run(handler, "--inputs", items); err == nil || !strings.Contains(err.Error(), ":2: not a JSON value") {
		t.Fatalf("a bad line: %v", err)
	}
}
