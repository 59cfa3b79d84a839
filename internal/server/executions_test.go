package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// TestExecutionHistory: executions run through the API, plain and
// streamed, are listed newest first with their code and output, in
// pages; another account's sandbox is not found; a bad limit is refused.
func TestExecutionHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id + "/execute"
	want(t, e.do("POST", path, e.keyA, map[string]any{"code": "print('first')"}), http.StatusOK, "")
	want(t, e.do("POST", path, e.keyA, map[string]any{"code": "raise ValueError('second')"}), http.StatusOK, "")
	r := e.do("POST", path+"?stream=1", e.keyA, map[string]any{"code": "print('third')\n6*7"})
	want(t, r, http.StatusOK, "")

	hist := "/v1/sandboxes/" + id + "/executions"
	r = e.do("GET", hist+"?limit=2", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	page := r.json(t)
	l := page["executions"].([]any)
	if len(l) != 2 || page["next"] == nil {
		t.Fatalf("first page: %s", r.body)
	}
	third, second := l[0].(map[string]any), l[1].(map[string]any)
	out3, _ := third["output"].(map[string]any)
	if third["code"] != "print('third')\n6*7" || third["status"] != "success" || out3 == nil || out3["stdout"] != "third\n" {
		t.Fatalf("streamed execution: %v", third)
	}
	if res, _ := out3["results"].([]any); len(res) != 1 || res[0].(map[string]any)["text"] != "42" {
		t.Fatalf("streamed execution's results: %v", out3)
	}
	out2, _ := second["output"].(map[string]any)
	if errObj, _ := out2["error"].(map[string]any); second["status"] != "error" || errObj["name"] != "ValueError" {
		t.Fatalf("failed execution: %v", second)
	}
	r = e.do("GET", hist+"?limit=2&cursor="+page["next"].(string), e.keyA, nil)
	page = r.json(t)
	l = page["executions"].([]any)
	if len(l) != 1 || page["next"] != nil || l[0].(map[string]any)["output"].(map[string]any)["stdout"] != "first\n" {
		t.Fatalf("second page: %s", r.body)
	}

	want(t, e.do("GET", hist, e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("GET", "/v1/sandboxes/nope/executions", e.keyA, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("GET", hist+"?limit=51", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// The history stays after the sandbox stopped.
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	if l := e.do("GET", hist, e.keyA, nil).json(t)["executions"].([]any); len(l) != 3 {
		t.Fatalf("after stop: %d executions", len(l))
	}
}

// TestExecutionHistoryBounds: a record keeps at most 64 KiB of code and
// of each stream, and says it was cut.
func TestExecutionHistoryBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	code := "print('x' * 200000)\n#" + strings.Repeat("y", 70<<10)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": code}), http.StatusOK, "")
	r := e.do("GET", "/v1/sandboxes/"+id+"/executions", e.keyA, nil)
	x := r.json(t)["executions"].([]any)[0].(map[string]any)
	out := x["output"].(map[string]any)
	if len(x["code"].(string)) != 64<<10 || x["code_truncated"] != true || len(out["stdout"].(string)) != 64<<10 || out["truncated"] != true {
		t.Fatalf("code %d bytes, stdout %d bytes, %v %v", len(x["code"].(string)), len(out["stdout"].(string)), x["code_truncated"], out["truncated"])
	}
}

// TestMetricsSummary: GET /v1/metrics shows an account its own figures
// and the server's latencies; the server-wide counters only to admins.
func TestMetricsSummary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	_, admin, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	want(t, e.do("GET", "/v1/metrics", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	id := e.create(e.keyA, nil)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "raise ValueError()"}), http.StatusOK, "")

	var m map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for {
		m = e.do("GET", "/v1/metrics", e.keyA, nil).json(t)
		ex := m["account"].(map[string]any)["executions"].(map[string]any)
		if ex["success"] == 1.0 && ex["error"] == 1.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("account's executions never counted: %v", m)
		}
		time.Sleep(20 * time.Millisecond) // the bus counts on its own goroutine
	}
	if m["account"].(map[string]any)["sandboxes"].(map[string]any)["running"] != 1.0 {
		t.Fatalf("account's sandboxes: %v", m["account"])
	}
	if p, _ := m["server"].(map[string]any)["execution_seconds"].(map[string]any)["python"].(map[string]any); p == nil || p["p50"].(float64) <= 0 {
		t.Fatalf("server latencies: %v", m["server"])
	}
	if _, ok := m["admin"]; ok {
		t.Fatal("an account's key sees the admin figures")
	}
	b := e.do("GET", "/v1/metrics", e.keyB, nil).json(t)
	if len(b["account"].(map[string]any)["executions"].(map[string]any)) != 0 || len(b["account"].(map[string]any)["sandboxes"].(map[string]any)) != 0 {
		t.Fatalf("B sees A's figures: %v", b["account"])
	}
	a := e.do("GET", "/v1/metrics", admin, nil).json(t)["admin"].(map[string]any)
	if a == nil || a["sandboxes"].(map[string]any)["running"] != 1.0 || a["goroutines"].(float64) == 0 || a["heap_bytes"].(float64) == 0 ||
		a["executions"].(map[string]any)["success"].(float64) < 1 {
		t.Fatalf("admin figures: %v", a)
	}
}

// recordingStore is the store with its execution records' writes noted.
type recordingStore struct {
	*sqlite.DB
	gate    chan struct{}         // when not nil, a write waits for it to close
	endOnly bool                  // the gate holds only the writes of an execution's end
	entered func(store.Execution) // when not nil, told of every write as it begins
	mu      sync.Mutex
	writes  map[string][]string // execution id → the statuses written, in order
}

func (s *recordingStore) AddExecution(ctx context.Context, e store.Execution) error {
	if s.entered != nil {
		s.entered(e)
	}
	if s.gate != nil && !(s.endOnly && e.Status == store.ExecutionRunning) {
		<-s.gate
	}
	s.mu.Lock()
	s.writes[e.ID] = append(s.writes[e.ID], e.Status)
	s.mu.Unlock()
	return s.DB.AddExecution(ctx, e)
}

func (s *recordingStore) written(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes[id])
}

// TestExecutionRecordWrites: an execution that ends before
// runningRecordAfter is written once, as it ended (the warm path's one
// transaction); one that runs longer is written as running while it runs
// (what a crash would leave), then as it ended.
func TestExecutionRecordWrites(t *testing.T) {
	var rs *recordingStore
	e := newEnvStore(t, server.Config{}, testLog(t), func(db *sqlite.DB) store.Store {
		rs = &recordingStore{DB: db, writes: map[string][]string{}}
		return rs
	})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id + "/execute"
	only := func() (string, []string) {
		t.Helper()
		e.srv.SyncRecords(context.Background())
		l, err := e.store.ListExecutions(context.Background(), id)
		if err != nil || len(l) == 0 {
			t.Fatalf("executions: %v, %v", l, err)
		}
		x := l[len(l)-1]
		return x.ID, rs.written(x.ID)
	}

	restore := server.SetRunningRecordAfter(time.Hour)
	want(t, e.do("POST", path, e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	restore()
	if x, w := only(); !slices.Equal(w, []string{sandbox.ExecSuccess}) {
		t.Fatalf("a quick execution %s was written %v; want once, as it ended", x, w)
	}

	defer server.SetRunningRecordAfter(time.Millisecond)()
	rest := e.openNDJSON("POST", path, map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(0.5)"}, stdoutHas("started"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l, err := e.store.ListExecutions(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 2 {
			if l[1].Status != store.ExecutionRunning {
				t.Fatalf("a long execution's record while it runs: %+v", l[1])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record of the running execution: %+v", l)
		}
	}
	<-rest
	if x, w := only(); !slices.Equal(w, []string{store.ExecutionRunning, sandbox.ExecSuccess}) {
		t.Fatalf("a long execution %s was written %v; want running, then success", x, w)
	}
}

// TestExecutionReplyBeforeRecord: the reply of an execution does not wait
// for its record's write (held here), and the history and the account's
// storage, read after the reply, wait for it and show it.
func TestExecutionReplyBeforeRecord(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	e := newEnvStore(t, server.Config{}, testLog(t), func(db *sqlite.DB) store.Store {
		return &recordingStore{DB: db, gate: gate, writes: map[string][]string{}}
	})
	id := e.create(e.keyA, nil)
	replied := make(chan resp, 1)
	go func() { replied <- e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "6*7"}) }()
	select {
	case r := <-replied:
		want(t, r, http.StatusOK, "")
	case <-time.After(20 * time.Second):
		close(gate)
		t.Fatal("the reply waited for the record's write")
	}
	hist := make(chan resp, 1)
	storage := make(chan resp, 1)
	go func() { hist <- e.do("GET", "/v1/sandboxes/"+id+"/executions", e.keyA, nil) }()
	go func() { storage <- e.do("GET", "/v1/account", e.keyA, nil) }()
	select {
	case r := <-hist:
		close(gate)
		t.Fatalf("the history was read before the record was written: %s", r.body)
	case <-time.After(100 * time.Millisecond): // it waits; a wrong answer would have come by now
	}
	close(gate)
	r := <-hist
	want(t, r, http.StatusOK, "")
	if l := r.json(t)["executions"].([]any); len(l) != 1 || l[0].(map[string]any)["status"] != "success" {
		t.Fatalf("history: %s", r.body)
	}
	want(t, <-storage, http.StatusOK, "")
}

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestExecutionTrace: with SHEEPFOLD_TRACE_EXECUTIONS set, a plain
// execution logs its hops, the kernel's own time among them; without it,
// nothing.
func TestExecutionTrace(t *testing.T) {
	for _, on := range []bool{false, true} {
		if on {
			t.Setenv("SHEEPFOLD_TRACE_EXECUTIONS", "1")
		}
		var out lockedBuffer
		e := newEnvLog(t, server.Config{}, slog.New(slog.NewTextHandler(&out, nil)))
		id := e.create(e.keyA, nil)
		want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
		line := ""
		for l := range strings.Lines(out.String()) {
			if strings.Contains(l, `msg="execution trace"`) {
				line = l
			}
		}
		if !on {
			if line != "" {
				t.Fatalf("traced without SHEEPFOLD_TRACE_EXECUTIONS: %s", line)
			}
			continue
		}
		m := regexp.MustCompile(`kernel_us=(\d+) .*total_us=(\d+)`).FindStringSubmatch(line)
		if m == nil || m[1] == "0" || m[2] == "0" {
			t.Fatalf("no execution trace with the kernel's time: %q", line)
		}
	}
}
