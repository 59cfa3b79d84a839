package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// lenInputs are n strings of lengths 0 to n-1.
func lenInputs(n int) []string {
	in := make([]string, n)
	for i := range in {
		in[i] = strings.Repeat("x", i)
	}
	return in
}

// waitBatch polls a batch until done reports true of it.
func waitBatch(t *testing.T, get func() resp, done func(b map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := get()
		want(t, r, http.StatusOK, "")
		b := r.json(t)
		if done(b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch never reached the state: %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ended(b map[string]any) bool { return b["status"] != "running" }

// results reads every page of a batch's results, limit lines a page.
func (e *env) batchResults(t *testing.T, key, id string, limit int) []map[string]any {
	t.Helper()
	var out []map[string]any
	after := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("results never end")
		}
		path := fmt.Sprintf("/v1/batches/%s/results?limit=%d", id, limit)
		if after != "" {
			path += "&after=" + after
		}
		r := e.do("GET", path, key, nil)
		want(t, r, http.StatusOK, "")
		if ct := r.header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Fatalf("content type %q", ct)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.body))
		n := 0
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			out = append(out, m)
			n++
		}
		after = r.header.Get("Sheepfold-Next-After")
		if after == "" {
			if n == limit {
				t.Fatalf("a full page of %d without Sheepfold-Next-After", n)
			}
			return out
		}
	}
}

// TestBatchRuns: 20 items at concurrency 4, each in a fresh sandbox; the
// handler returns len(item), one item raises and is retried, the others
// are not stopped by it; results page as JSON Lines by index.
func TestBatchRuns(t *testing.T) {
	e := newEnv(t, server.Config{})
	code := "def handler(item):\n    if item == 'boom':\n        raise ValueError('bad item ' + item)\n    return len(item)\n"
	inputs := append(lenInputs(20), "boom")
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code, "inputs": inputs, "concurrency": 4, "retries": 1})
	want(t, r, http.StatusCreated, "")
	b := r.json(t)
	id := b["id"].(string)
	if b["total"] != float64(21) || b["status"] != "running" {
		t.Fatalf("created %s", r.body)
	}
	b = waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	if b["status"] != "done" || b["done"] != float64(20) || b["failed"] != float64(1) || b["pending"] != float64(0) || b["ended_at"] == nil {
		t.Fatalf("ended %v", b)
	}
	res := e.batchResults(t, e.keyA, id, 7)
	if len(res) != 21 {
		t.Fatalf("%d results, want 21", len(res))
	}
	for i, m := range res[:20] {
		if m["index"] != float64(i) || m["status"] != "done" || m["result"] != float64(i) || m["attempts"] != float64(1) {
			t.Fatalf("result %d: %v", i, m)
		}
	}
	bad := res[20]
	errObj, _ := bad["error"].(map[string]any)
	if bad["status"] != "failed" || bad["attempts"] != float64(2) || errObj["name"] != "ValueError" ||
		errObj["value"] != "bad item boom" || !strings.Contains(errObj["traceback"].(string), "handler") {
		t.Fatalf("failed item: %v", bad)
	}
	// Each item ran in a sandbox of its own, killed after it.
	waitEngineEmpty(t, e)
	list := e.do("GET", "/v1/batches", e.keyA, nil)
	want(t, list, http.StatusOK, "")
	if bs := list.json(t)["batches"].([]any); len(bs) != 1 || bs[0].(map[string]any)["id"] != id {
		t.Fatalf("list %s", list.body)
	}
}

func waitEngineEmpty(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(e.engine.List()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes left: %v", e.engine.List())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBatchOtherAccount: another account's batch is not found, whatever
// it asks of it (the attack), while its owner sees it (the control).
func TestBatchOtherAccount(t *testing.T) {
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": "def handler(x):\n    return x\n", "inputs": []int{1, 2}})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/batches/" + id}, {"GET", "/v1/batches/" + id + "/results"}, {"POST", "/v1/batches/" + id + "/cancel"},
	} {
		want(t, e.do(c.method, c.path, e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
		want(t, e.do(c.method, c.path, e.keyA, nil), http.StatusOK, "")
	}
	list := e.do("GET", "/v1/batches", e.keyB, nil)
	if bs := list.json(t)["batches"].([]any); len(bs) != 0 {
		t.Fatalf("B lists A's batch: %s", list.body)
	}
}

// TestBatchBadHandler: code that does not parse, or binds no handler, is
// refused at once with ERR_INVALID_HANDLER; no batch is recorded and none
// of its code ran (the check parses it only).
func TestBatchBadHandler(t *testing.T) {
	e := newEnv(t, server.Config{})
	marker := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct{ name, code, errName string }{
		{"syntax", "def handler(item)\n    return 1\n", "SyntaxError"},
		{"missing", fmt.Sprintf("open(%q, 'w').write('x')\ndef other(item):\n    return 1\n", marker), "NameError"},
		{"indent", "def handler(item):\nreturn 1\n", "IndentationError"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": c.code, "inputs": []int{1}})
			want(t, r, http.StatusBadRequest, "ERR_INVALID_HANDLER")
			if msg, _ := r.json(t)["error"].(map[string]any)["message"].(string); !strings.HasPrefix(msg, c.errName+": ") {
				t.Fatalf("message of %s, want %s first", r.body, c.errName)
			}
		})
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the check ran the code: %v", err)
	}
	// The control: good code passes the same check, and a handler
	// bound by an assignment counts.
	want(t, e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": "handler = len\n", "inputs": []string{"ab"}}), http.StatusCreated, "")
	list := e.do("GET", "/v1/batches", e.keyA, nil)
	if bs := list.json(t)["batches"].([]any); len(bs) != 1 {
		t.Fatalf("refused batches were recorded: %s", list.body)
	}
	for _, body := range []map[string]any{
		{"code": "handler = len\n", "inputs": []int{}},
		{"code": "", "inputs": []int{1}},
		{"code": "handler = len\n", "inputs": []int{1}, "concurrency": 65},
		{"code": "handler = len\n", "inputs": []int{1}, "retries": -1},
	} {
		want(t, e.do("POST", "/v1/batches", e.keyA, body), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	want(t, e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": "handler = len\n", "inputs": []int{1}, "language": "node"}),
		http.StatusBadRequest, "ERR_UNSUPPORTED_LANGUAGE")
}

// batchGate is a handler that logs each run of an item to a host file
// (the fake runtime's sandboxes see the host) and holds items of length
// from hold up until the gate file exists; it returns len(item).
func batchGate(dir string, hold int) string {
	return fmt.Sprintf(`import os, time
def handler(item):
    with open(%q, "a") as f:
        f.write("%%d\n" %% len(item))
    if len(item) >= %d:
        while not os.path.exists(%q):
            time.sleep(0.01)
    return len(item)
`, filepath.Join(dir, "log"), hold, filepath.Join(dir, "gate"))
}

// runs counts the runs of each item length in the gate's log.
func runs(t *testing.T, dir string) map[int]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, l := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(l)
		out[n]++
	}
	return out
}

// TestBatchCancel: a canceled batch runs no more items, its running ones
// are stopped and their sandboxes killed.
func TestBatchCancel(t *testing.T) {
	e := newEnv(t, server.Config{})
	dir := t.TempDir()
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": batchGate(dir, 0), "inputs": lenInputs(10), "concurrency": 2})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	deadline := time.Now().Add(30 * time.Second)
	for len(runs(t, dir)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("items never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := e.do("POST", "/v1/batches/"+id+"/cancel", e.keyA, nil)
	want(t, c, http.StatusOK, "")
	if b := c.json(t); b["status"] != "canceled" || b["pending"] != float64(10) {
		t.Fatalf("canceled %s", c.body)
	}
	waitEngineEmpty(t, e)
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if n := len(runs(t, dir)); n != 2 {
		t.Fatalf("%d items ran, want the 2 running at the cancel", n)
	}
	b := e.do("GET", "/v1/batches/"+id, e.keyA, nil).json(t)
	if b["status"] != "canceled" || b["done"] != float64(0) {
		t.Fatalf("after cancel %v", b)
	}
}

// concurrentHandler is a batch handler that counts the items running
// beside it: each holds a file in dir for 0.3 s and returns how many
// files it saw there.
func concurrentHandler(dir string) string {
	return fmt.Sprintf(`import os, time, uuid
def handler(item):
    p = os.path.join(%q, uuid.uuid4().hex)
    open(p, "w").close()
    time.sleep(0.3)
    n = len(os.listdir(%q))
    os.remove(p)
    return n
`, dir, dir)
}

// TestBatchAccountLimit: a batch's items are sandboxes of its account:
// at concurrency 6 under an account cap of 2 sandboxes at once, never
// more than 2 items run together, and the batch still ends (refused
// creates wait for a slot); the same with reuse "worker" (workers that
// hold a sandbox each). The control, without the cap, sees more.
func TestBatchAccountLimit(t *testing.T) {
	code := concurrentHandler
	most := func(t *testing.T, cfg server.Config, reuse string) (int, map[string]any) {
		e := newEnv(t, cfg)
		dir := t.TempDir()
		r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code(dir), "inputs": lenInputs(12), "concurrency": 6, "reuse": reuse})
		want(t, r, http.StatusCreated, "")
		id := r.json(t)["id"].(string)
		b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
		m := 0
		for _, res := range e.batchResults(t, e.keyA, id, 100) {
			if n, ok := res["result"].(float64); ok && int(n) > m {
				m = int(n)
			}
		}
		return m, b
	}
	for _, reuse := range []string{"", "worker"} {
		m, b := most(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxSandboxes: 2}}}, reuse)
		if b["status"] != "done" || b["done"] != float64(12) || m > 2 || m < 1 {
			t.Fatalf("capped (reuse %q): batch %v, most at once %d", reuse, b, m)
		}
	}
	m, _ := most(t, server.Config{}, "worker")
	if m <= 2 {
		t.Fatalf("control: most at once %d without a cap; the measure sees no concurrency", m)
	}
}

// batchServer is one server over a store file, to stop and start again.
type batchServer struct {
	url  string
	stop func()
}

func startBatchServer(t *testing.T, dbPath string) *batchServer {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	rt := &fake.Runtime{AgentBin: agentBin, Dir: testutil.ShortTempDir(t)}
	m, err := sandbox.New(ctx, sandbox.Config{Runtime: rt, Logger: log, Events: bus,
		Templates: sandbox.TemplatesFunc(func(name string) (string, error) {
			if name != "python" {
				return "", os.ErrNotExist
			}
			return "/", nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Version: "test", Events: bus, DrainDelay: -1}, st, m, log)
	hs := httptest.NewServer(srv)
	var once sync.Once
	bs := &batchServer{url: hs.URL}
	bs.stop = func() {
		once.Do(func() {
			hs.Close()
			srv.Shutdown(ctx)
			if err := m.Close(ctx); err != nil {
				t.Error(err)
			}
			srv.Close(ctx)
			srv.RecordStopped(ctx)
			bus.Close()
			st.Close()
		})
	}
	t.Cleanup(bs.stop)
	return bs
}

func (bs *batchServer) do(t *testing.T, method, path, key string, body any) resp {
	t.Helper()
	e := &env{t: t, url: bs.url}
	return e.do(method, path, key, body)
}

// TestBatchSurvivesRestart: a server stopped mid-batch leaves its
// unfinished items pending; a new server on the same store runs them,
// and never again those that ended.
func TestBatchSurvivesRestart(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "sheepfold.db")
	first := startBatchServer(t, dbPath)
	st, err := sqlite.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := auth.Create(context.Background(), st, auth.CreateOptions{})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const n, hold = 20, 8
	r := first.do(t, "POST", "/v1/batches", key, map[string]any{"code": batchGate(dir, hold), "inputs": lenInputs(n), "concurrency": 4})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	// Items 0 to 7 end; 8 to 11 are held running when the server stops.
	waitBatch(t, func() resp { return first.do(t, "GET", "/v1/batches/"+id, key, nil) }, func(b map[string]any) bool {
		return b["done"] == float64(hold) && len(runs(t, dir)) == hold+4
	})
	first.stop()
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	second := startBatchServer(t, dbPath)
	b := waitBatch(t, func() resp { return second.do(t, "GET", "/v1/batches/"+id, key, nil) }, ended)
	if b["status"] != "done" || b["done"] != float64(n) || b["failed"] != float64(0) {
		t.Fatalf("after the restart: %v", b)
	}
	got := runs(t, dir)
	for i := 0; i < n; i++ {
		want := 1
		if i >= hold && i < hold+4 {
			want = 2 // cut by the stop, run again
		}
		if got[i] != want {
			t.Fatalf("item %d ran %d times, want %d (runs %v)", i, got[i], want, got)
		}
	}
	e := &env{t: t, url: second.url}
	res := e.batchResults(t, key, id, 1000)
	for i, m := range res {
		if m["index"] != float64(i) || m["result"] != float64(i) || m["attempts"] != float64(1) {
			t.Fatalf("result %d: %v", i, m)
		}
	}
	if len(res) != n {
		t.Fatalf("%d results", len(res))
	}
}

// TestBatchProgressStream: GET /v1/batches/{id} as SSE sends the batch's
// progress as its items end and a last "done" event.
func TestBatchProgressStream(t *testing.T) {
	e := newEnv(t, server.Config{})
	dir := t.TempDir()
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": batchGate(dir, 3), "inputs": lenInputs(6), "concurrency": 6})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	req, _ := http.NewRequest("GET", e.url+"/v1/batches/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	var event string
	var dones []float64
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			event = v
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var b map[string]any
		if err := json.Unmarshal([]byte(data), &b); err != nil {
			t.Fatal(err)
		}
		if event == "done" {
			if b["status"] != "done" || b["done"] != float64(6) {
				t.Fatalf("done event %v", b)
			}
			if !slices.Contains(dones, 3) {
				t.Fatalf("progress %v: never 3 done while 3 were held", dones)
			}
			return
		}
		if event != "progress" {
			t.Fatalf("event %q", event)
		}
		dones = append(dones, b["done"].(float64))
		if b["done"] == float64(3) {
			if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Fatalf("the stream ended without a done event: %v, %v", dones, sc.Err())
}

// TestBatchCredits: a batch is charged like the sandboxes it makes: an
// execution costs a unit, and a batch of 10 items of an account with 4
// units fails with ERR_SESSION_QUOTA_EXCEEDED once they are spent, its
// other items left pending, with reuse "worker" too. The control: with
// 100 units it ends done.
func TestBatchCredits(t *testing.T) {
	prices := metering.Prices{Execution: 1_000_000}
	run := func(t *testing.T, free int64, reuse string) map[string]any {
		e := newEnv(t, server.Config{
			Metering: metering.Config{SampleInterval: 10 * time.Millisecond, FlushInterval: 20 * time.Millisecond, Prices: &prices},
			Accounts: account.Config{EnforceCredits: true, CreditsGrace: time.Minute, FreeCreditsMicros: free},
		})
		admin := e.adminKey()
		want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"}), http.StatusCreated, "")
		key := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team"}).json(t)["key"].(string)
		r := e.do("POST", "/v1/batches", key, map[string]any{"code": "import time\ndef handler(item):\n    time.sleep(0.05)\n    return len(item)\n",
			"inputs": lenInputs(10), "concurrency": 1, "reuse": reuse})
		want(t, r, http.StatusCreated, "")
		id := r.json(t)["id"].(string)
		b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, key, nil) }, ended)
		waitEngineEmpty(t, e)
		return b
	}
	for _, reuse := range []string{"", "worker"} {
		b := run(t, 4_000_000, reuse)
		errObj, _ := b["error"].(map[string]any)
		if b["status"] != "failed" || errObj["code"] != "ERR_SESSION_QUOTA_EXCEEDED" || b["pending"].(float64) == 0 || b["done"].(float64) > 4 {
			t.Fatalf("out of credits (reuse %q): %v", reuse, b)
		}
	}
	if b := run(t, 100_000_000, "worker"); b["status"] != "done" || b["done"] != float64(10) {
		t.Fatalf("control: %v", b)
	}
}

// TestBatchResultAfterItsRecord: a batch item's result is stored only
// once its execution's record is: while the record's write is held, the
// item has ended (its final record is being written) and no result is
// there; a crash then repeats the item rather than leave a result
// without the run that made it (the bug: TestBatchKill9 counted an item
// with a result and no execution). Released, the batch ends done.
func TestBatchResultAfterItsRecord(t *testing.T) {
	gate := make(chan struct{})
	finals := make(chan string, 4)
	e := newEnvStore(t, server.Config{}, testLog(t), func(db *sqlite.DB) store.Store {
		// Only the end's write is held: an item that runs past
		// runningRecordAfter (a cold interpreter does) is also written as
		// running first, and its end waits for that write.
		return &recordingStore{DB: db, gate: gate, endOnly: true, writes: map[string][]string{}, entered: func(ex store.Execution) {
			if ex.Status != store.ExecutionRunning {
				finals <- ex.ID
			}
		}}
	})
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	t.Cleanup(release)
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": "handler = len\n", "inputs": lenInputs(1)})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	select {
	case <-finals:
	case <-time.After(60 * time.Second):
		t.Fatal("the item's execution never ended")
	}
	// The record is held; a result stored without waiting for it would be
	// there at once.
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		res := e.do("GET", "/v1/batches/"+id+"/results", e.keyA, nil)
		want(t, res, http.StatusOK, "")
		if strings.Contains(string(res.body), `"index"`) {
			t.Fatalf("a result was stored before its execution's record: %s", res.body)
		}
	}
	release()
	if b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended); b["status"] != "done" {
		t.Fatalf("after the record: %v", b)
	}
	waitEngineEmpty(t, e)
}

// TestBatchRefusedWithoutCredits: a batch of an account whose credits
// are exhausted is refused at its create (429 ERR_SESSION_QUOTA_EXCEEDED),
// as its first item's create would be, though the host checks its code
// and no sandbox is made; the control: the same batch with credits runs.
func TestBatchRefusedWithoutCredits(t *testing.T) {
	for _, free := range []int64{0, 100_000_000} {
		e := newEnv(t, server.Config{Accounts: account.Config{EnforceCredits: true, FreeCreditsMicros: free}})
		admin := e.adminKey()
		want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team"}), http.StatusCreated, "")
		key := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team"}).json(t)["key"].(string)
		r := e.do("POST", "/v1/batches", key, map[string]any{"code": "handler = len\n", "inputs": lenInputs(2)})
		if free == 0 {
			wantMsg(t, r, http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "credits exhausted")
			continue
		}
		want(t, r, http.StatusCreated, "")
		id := r.json(t)["id"].(string)
		if b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, key, nil) }, ended); b["status"] != "done" {
			t.Fatalf("control: %v", b)
		}
		waitEngineEmpty(t, e)
	}
}

// TestBatchResources: a batch's resources are asked of every item's
// sandbox within the account's ceiling: above it the batch is refused
// (the check's create, before any item), within it each item's sandbox
// record carries them.
func TestBatchResources(t *testing.T) {
	e := newEnv(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxCPUs: 1, MaxMemoryMB: 256}}})
	body := func(res map[string]any) map[string]any {
		return map[string]any{"code": "handler = len\n", "inputs": lenInputs(3), "resources": res}
	}
	r := e.do("POST", "/v1/batches", e.keyA, body(map[string]any{"memory_mb": 512}))
	wantMsg(t, r, http.StatusBadRequest, "ERR_BAD_REQUEST", "resources.memory_mb")
	r = e.do("POST", "/v1/batches", e.keyA, body(map[string]any{"cpus": 0.5, "memory_mb": 128}))
	want(t, r, http.StatusCreated, "")
	b := r.json(t)
	id := b["id"].(string)
	if res, _ := b["resources"].(map[string]any); res["cpus"] != 0.5 || res["memory_mb"] != float64(128) {
		t.Fatalf("created %s", r.body)
	}
	if b = waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended); b["done"] != float64(3) {
		t.Fatalf("ended %v", b)
	}
	sbs := e.do("GET", "/v1/sandboxes?state=all", e.keyA, nil).json(t)["sandboxes"].([]any)
	items := 0
	for _, s := range sbs {
		sb := s.(map[string]any)
		if md, _ := sb["metadata"].(map[string]any); md["batch"] != id || md["batch_check"] != nil {
			continue
		}
		items++
		if res := sb["resources"].(map[string]any); res["cpus"] != 0.5 || res["memory_mb"] != float64(128) {
			t.Fatalf("an item's sandbox: %v", sb)
		}
	}
	if items != 3 {
		t.Fatalf("%d item sandboxes of the batch in %v", items, sbs)
	}
}
