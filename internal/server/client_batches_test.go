package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKBatches drives /v1/batches through the Go SDK.
func TestGoSDKBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	c, other := client.New(e.url, e.keyA), client.New(e.url, e.keyB)
	if _, err := c.CreateBatch(ctx, client.BatchRequest{Code: "def handler(x)\n", Inputs: []json.RawMessage{json.RawMessage(`1`)}}); !errors.Is(err, client.ErrInvalidHandler) {
		t.Fatalf("a bad handler: %v", err)
	}
	var inputs []json.RawMessage
	for _, s := range lenInputs(20) {
		j, _ := json.Marshal(s)
		inputs = append(inputs, j)
	}
	b, err := c.CreateBatch(ctx, client.BatchRequest{Code: "def handler(item):\n    return len(item)\n", Inputs: inputs, Concurrency: 4})
	if err != nil || b.Total != 20 || b.Status != "running" {
		t.Fatalf("create: %+v, %v", b, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if b, err = c.WaitBatch(wctx, b.ID, 20*time.Millisecond); err != nil || b.Status != "done" || b.Done != 20 || b.Pending != 0 {
		t.Fatalf("wait: %+v, %v", b, err)
	}
	var all []client.BatchResult
	for after := -1; after != -1 || all == nil; {
		page, next, err := c.BatchResults(ctx, b.ID, after, 6)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		after = next
	}
	if len(all) != 20 {
		t.Fatalf("%d results", len(all))
	}
	for i, r := range all {
		if r.Index != i || string(r.Result) != jsonInt(i) || r.Error != nil {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if b.Usage.Sandboxes != 20 || b.Usage.Executions != 20 { // the code checked on the host
		t.Fatalf("usage: %+v", b.Usage)
	}
	if l, err := c.ListBatches(ctx); err != nil || len(l) != 1 || l[0].ID != b.ID {
		t.Fatalf("list: %+v, %v", l, err)
	}
	// Inputs from a file in a volume, items in workers' sandboxes.
	if _, err := c.CreateVolume(ctx, "in", 16); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteVolumeFile(ctx, "in", "/items.jsonl", strings.NewReader("\"a\"\n\"bb\"\n")); err != nil {
		t.Fatal(err)
	}
	fb, err := c.CreateBatch(ctx, client.BatchRequest{Code: "handler = len\n", InputsFile: &client.BatchInputsFile{Volume: "in", Path: "/items.jsonl"},
		Reuse: "worker", Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if fb, err = c.WaitBatch(wctx, fb.ID, 20*time.Millisecond); err != nil || fb.Done != 2 || fb.Reuse != "worker" {
		t.Fatalf("from a file: %+v, %v", fb, err)
	}

	if _, err := other.GetBatch(ctx, b.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("another account's batch: %v", err)
	}
	if b, err := c.CancelBatch(ctx, b.ID); err != nil || b.Status != "done" {
		t.Fatalf("cancel of an ended batch: %+v, %v", b, err)
	}
}

func jsonInt(i int) string { j, _ := json.Marshal(i); return string(j) }

// TestPythonSDKBatches runs sdk/python/tests/test_batches.py against a
// server.
func TestPythonSDKBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_batches")
	cmd.Dir = "../../sdk/python/tests"
	cmd.Env = append(os.Environ(), "SHEEPFOLD_BATCHES_URL="+e.url, "SHEEPFOLD_BATCHES_KEY="+e.keyA, "SHEEPFOLD_BATCHES_OTHER_KEY="+e.keyB)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python batches client: %v\n%s", err, out)
	}
}

// TestPythonSDKFunctions runs sdk/python/tests/test_functions.py
// (sheepfold.function's .remote and .map) against a server.
func TestPythonSDKFunctions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_functions")
	cmd.Dir = "../../sdk/python/tests"
	cmd.Env = append(os.Environ(), "SHEEPFOLD_FUNCTIONS_URL="+e.url, "SHEEPFOLD_FUNCTIONS_KEY="+e.keyA)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python functions: %v\n%s", err, out)
	}
}
