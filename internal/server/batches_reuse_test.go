package server_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// codeRuns counts the files named code-* in dir: one per run of a
// batch's code (reuseCode).
func codeRuns(t *testing.T, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "code-*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// reuseCode leaves a file in dir each time it runs, counts the handler's
// calls in a global, raises for "boom" and hangs for "hang".
func reuseCode(dir string) string {
	return fmt.Sprintf(`import os, time, uuid
open(os.path.join(%q, "code-" + uuid.uuid4().hex), "w").close()
calls = 0
def handler(item):
    global calls
    calls += 1
    if item == "boom":
        raise ValueError(item)
    if item == "hang":
        time.sleep(60)
    return [len(item), calls]
`, dir)
}

// TestBatchWorkerReuse: with reuse "worker" each worker runs the code
// once in its sandbox and its items' calls after it in the same process
// (a global counts them); an item that raises does not stop its worker's
// later items; an item that times out gets its worker a fresh sandbox
// (the code runs once more), whose items go on. The control, without
// reuse, runs the code once per item and each call is its process's
// first.
func TestBatchWorkerReuse(t *testing.T) {
	inputs := lenInputs(12)
	inputs = append(inputs[:3], append([]string{"boom"}, inputs[3:]...)...)
	inputs = append(inputs[:7], append([]string{"hang"}, inputs[7:]...)...)
	run := func(t *testing.T, reuse string) (map[string]any, []map[string]any, int) {
		e := newEnv(t, server.Config{})
		dir := t.TempDir()
		r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": reuseCode(dir), "inputs": inputs, "concurrency": 2,
			"reuse": reuse, "timeout_ms": 1500})
		want(t, r, http.StatusCreated, "")
		if got := r.json(t)["reuse"]; got != reuse {
			t.Fatalf("reuse %v, want %q", got, reuse)
		}
		id := r.json(t)["id"].(string)
		b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
		waitEngineEmpty(t, e)
		return b, e.batchResults(t, e.keyA, id, 100), codeRuns(t, dir)
	}
	check := func(t *testing.T, b map[string]any, res []map[string]any) (most int) {
		t.Helper()
		if b["status"] != "done" || b["done"] != float64(12) || b["failed"] != float64(2) {
			t.Fatalf("ended %v", b)
		}
		for i, m := range res {
			switch inputs[i] {
			case "boom":
				if e, _ := m["error"].(map[string]any); m["status"] != "failed" || e["name"] != "ValueError" {
					t.Fatalf("item %d: %v", i, m)
				}
			case "hang":
				if e, _ := m["error"].(map[string]any); m["status"] != "failed" || e["code"] != "ERR_SANDBOX_TIMEOUT" {
					t.Fatalf("item %d: %v", i, m)
				}
			default:
				got, _ := m["result"].([]any)
				if m["status"] != "done" || len(got) != 2 || got[0] != float64(len(inputs[i])) {
					t.Fatalf("item %d: %v", i, m)
				}
				most = max(most, int(got[1].(float64)))
			}
		}
		return most
	}
	t.Run("worker", func(t *testing.T) {
		b, res, runs := run(t, "worker")
		most := check(t, b, res)
		// Two workers, one of them given a fresh sandbox after the
		// timeout: the code ran 2 or 3 times (a worker that never got
		// an item runs it not at all).
		if runs < 1 || runs > 3 {
			t.Fatalf("the code ran %d times for 2 workers and one timeout", runs)
		}
		if most < 2 {
			t.Fatalf("at most %d calls in one process: the workers kept no sandbox", most)
		}
		// The usage: at most 3 workers' sandboxes (the code was checked
		// on the host, no sandbox taken).
		if u := b["usage"].(map[string]any); u["sandboxes"].(float64) < 1 || u["sandboxes"].(float64) > 3 {
			t.Fatalf("usage %v", u)
		}
	})
	t.Run("control", func(t *testing.T) {
		b, res, runs := run(t, "")
		if most := check(t, b, res); most != 1 {
			t.Fatalf("%d calls in one process without reuse", most)
		}
		if runs != len(inputs) {
			t.Fatalf("the code ran %d times for %d items without reuse", runs, len(inputs))
		}
		if u := b["usage"].(map[string]any); u["sandboxes"] != float64(len(inputs)) {
			t.Fatalf("usage %v", u)
		}
	})
}

// TestBatchUsage: a batch reports what its sandboxes used (the items';
// its code was checked on the host, no sandbox used), at the operator's prices, and the account is charged
// at least as much (its usage report holds the same executions).
func TestBatchUsage(t *testing.T) {
	prices := metering.Prices{Execution: 1_000_000, CPUSecond: 1000}
	for _, reuse := range []string{"", "worker"} {
		t.Run("reuse="+reuse, func(t *testing.T) {
			e := newEnv(t, server.Config{
				Metering: metering.Config{SampleInterval: 10 * time.Millisecond, FlushInterval: 20 * time.Millisecond, Prices: &prices},
			})
			e.rt.SetUsed(runtime.Usage{CPUNanos: 1e9, MemoryBytes: 30 << 20}) // each sandbox's CPU counter
			code := "def handler(item):\n    n = 0\n    for i in range(200000):\n        n += i\n    return len(item)\n"
			r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code, "inputs": lenInputs(6), "concurrency": 2, "reuse": reuse})
			want(t, r, http.StatusCreated, "")
			made := r.json(t)
			if u := made["usage"].(map[string]any); u["sandboxes"] != float64(0) || u["executions"] != float64(0) {
				t.Fatalf("at its creation, the usage: %v", u)
			}
			id := made["id"].(string)
			b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
			if b["done"] != float64(6) {
				t.Fatalf("ended %v", b)
			}
			u := b["usage"].(map[string]any)
			sandboxes := 6.0
			if reuse == "worker" {
				sandboxes = 2
			}
			if u["sandboxes"] != sandboxes || u["executions"] != float64(6) || u["cpu_seconds"].(float64) <= 0 ||
				u["sandbox_seconds"].(float64) <= 0 || u["gb_seconds_reserved"].(float64) <= 0 ||
				u["cost_micros"].(float64) < 6_000_000 || !strings.HasPrefix(u["cost"].(string), "6.") {
				t.Fatalf("usage %v", u)
			}
			waitEngineEmpty(t, e)
			deadline := time.Now().Add(30 * time.Second)
			for {
				tot := e.do("GET", "/v1/account/usage", e.keyA, nil).json(t)["total"].(map[string]any)
				if tot["executions"] == float64(6) && tot["cost_micros"].(float64) >= u["cost_micros"].(float64) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the account's usage %v; the batch's %v", tot, u)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestBatchInputsFile: a batch's inputs from a JSON Lines file in one of
// its account's volumes; another account's volume of the same name is
// not found (the attack; the owner's call is the control), a line not
// JSON and a file above the bound are refused before any sandbox.
func TestBatchInputsFile(t *testing.T) {
	e := newEnv(t, server.Config{MaxBatchInputsFileBytes: 1000})
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 16}), http.StatusCreated, "")
	var lines strings.Builder
	for _, in := range lenInputs(10) {
		fmt.Fprintf(&lines, "%q\n\n", in)
	}
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/in/items.jsonl", e.keyA, lines.String()), http.StatusCreated, "")
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/bad.jsonl", e.keyA, "1\n{\n3\n"), http.StatusCreated, "")
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/big.jsonl", e.keyA, strings.Repeat("1\n", 501)), http.StatusCreated, "")
	body := func(path string) map[string]any {
		return map[string]any{"code": "handler = len\n", "inputs_file": map[string]any{"volume": "data", "path": path}, "concurrency": 3}
	}
	wantMsg(t, e.do("POST", "/v1/batches", e.keyA, body("/bad.jsonl")), http.StatusBadRequest, "ERR_BAD_REQUEST", "line 2")
	wantMsg(t, e.do("POST", "/v1/batches", e.keyA, body("/big.jsonl")), http.StatusRequestEntityTooLarge, "ERR_FILE_TOO_LARGE", "limit of 1000")
	want(t, e.do("POST", "/v1/batches", e.keyA, body("/none.jsonl")), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", "/v1/batches", e.keyB, body("/in/items.jsonl")), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	both := body("/in/items.jsonl")
	both["inputs"] = []int{1}
	wantMsg(t, e.do("POST", "/v1/batches", e.keyA, both), http.StatusBadRequest, "ERR_BAD_REQUEST", "exclusive")
	if n := len(e.engine.List()); n != 0 {
		t.Fatalf("%d sandboxes made for refused batches", n)
	}
	r := e.do("POST", "/v1/batches", e.keyA, body("/in/items.jsonl"))
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	if b["done"] != float64(10) || b["total"] != float64(10) {
		t.Fatalf("ended %v", b)
	}
	for i, m := range e.batchResults(t, e.keyA, id, 100) {
		if m["index"] != float64(i) || m["result"] != float64(i) {
			t.Fatalf("result %d: %v", i, m)
		}
	}
}

// TestBatchWorkerLifetime: a worker's sandbox lives its lifetime (4 s
// here) like any; the items of a batch that outlasts it still end, in
// the fresh sandboxes that take over (none fails for the sandbox's end).
func TestBatchWorkerLifetime(t *testing.T) {
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) { c.DefaultTimeout = 4 * time.Second })
	code := "import time\ndef handler(item):\n    time.sleep(0.1)\n    return len(item)\n"
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code, "inputs": lenInputs(60), "concurrency": 1,
		"reuse": "worker", "timeout_ms": 2000})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	if b["status"] != "done" || b["done"] != float64(60) || b["failed"] != float64(0) {
		t.Fatalf("ended %v (%v)", b, e.batchResults(t, e.keyA, id, 100))
	}
	if u := b["usage"].(map[string]any); u["sandboxes"].(float64) < 2 {
		t.Fatalf("usage %v: the worker's sandbox outlived its lifetime", u)
	}
}

// TestBatchItemLifetime: an item's sandbox lives the item's timeout and
// the engine's default lifetime (5 minutes): 15 minutes for items of 10,
// so a long item is not cut by its sandbox's end (and a worker's sandbox
// serves items for 5 minutes at least); 6 for the default item timeout
// (a minute).
func TestBatchItemLifetime(t *testing.T) {
	e := newEnv(t, server.Config{})
	for _, c := range []struct {
		timeoutMS   int
		least, most time.Duration
	}{{600_000, 14 * time.Minute, 15 * time.Minute}, {0, 5 * time.Minute, 6 * time.Minute}} {
		dir := t.TempDir()
		r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": batchGate(dir, 0), "inputs": lenInputs(2), "concurrency": 2,
			"timeout_ms": c.timeoutMS})
		want(t, r, http.StatusCreated, "")
		id := r.json(t)["id"].(string)
		waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, func(map[string]any) bool { return len(runs(t, dir)) == 2 })
		items := 0
		for _, s := range e.do("GET", "/v1/sandboxes", e.keyA, nil).json(t)["sandboxes"].([]any) {
			sb := s.(map[string]any)
			if md, _ := sb["metadata"].(map[string]any); md["batch"] != id {
				continue
			}
			items++
			exp, err := time.Parse(time.RFC3339Nano, sb["expires_at"].(string))
			if left := time.Until(exp); err != nil || left < c.least || left > c.most {
				t.Fatalf("timeout_ms %d: an item's sandbox has %v left (%v), want %v to %v", c.timeoutMS, left, err, c.least, c.most)
			}
		}
		if items != 2 {
			t.Fatalf("%d item sandboxes running", items)
		}
		if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	}
}
