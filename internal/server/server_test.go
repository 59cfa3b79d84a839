package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	tests := []struct {
		name string
		hdr  []string
	}{
		{"none", nil},
		{"bad", []string{"Authorization", "Bearer sf_" + strings.Repeat("0", 40)}},
		{"malformed", []string{"Authorization", "Bearer hunter2"}},
		{"revoked", []string{"X-API-Key", e.revoked}},
		{"basic scheme", []string{"Authorization", "Basic " + e.keyA}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("GET", "/v1/sandboxes", "", nil, tt.hdr...)
			want(t, r, http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
		})
	}
	want(t, e.do("GET", "/v1/sandboxes", "", nil, "X-API-Key", e.keyA), http.StatusOK, "")
	want(t, e.do("GET", "/v1/sandboxes", e.keyA, nil), http.StatusOK, "")
	// No auth on health, readiness and the document.
	for _, p := range []string{"/healthz", "/readyz", "/v1/openapi.json"} {
		want(t, e.do("GET", p, "", nil), http.StatusOK, "")
	}
	want(t, e.do("GET", "/v1/version", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	v := e.do("GET", "/v1/version", e.keyA, nil).json(t)
	if v["api"] != "v1" || v["version"] != "test" {
		t.Fatalf("version %v", v)
	}
}

func TestRequestIDAndUnknownRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	r := e.do("GET", "/v1/nothing", e.keyA, nil, "X-Request-Id", "abc-123")
	want(t, r, http.StatusNotFound, "ERR_NOT_FOUND")
	if r.header.Get("X-Request-Id") != "abc-123" {
		t.Fatalf("request id %q", r.header.Get("X-Request-Id"))
	}
	r = e.do("GET", "/v1/nothing", e.keyA, nil, "X-Request-Id", "bad id with spaces")
	if id := r.header.Get("X-Request-Id"); !strings.HasPrefix(id, "req_") {
		t.Fatalf("generated request id %q", id)
	}
}

func TestSandboxLifecycleAndOwnership(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"timeout": 60, "metadata": map[string]string{"ticket": "42"},
		"resources": map[string]any{"memory_mb": 256, "cpus": 1}})
	want(t, r, http.StatusCreated, "")
	sb := r.json(t)
	id := sb["id"].(string)
	if sb["state"] != "running" || sb["template"] != "python" || sb["metadata"].(map[string]any)["ticket"] != "42" ||
		sb["resources"].(map[string]any)["memory_mb"] != 256.0 {
		t.Fatalf("sandbox %s", r.body)
	}
	created, _ := time.Parse(time.RFC3339Nano, sb["created_at"].(string))
	expires, _ := time.Parse(time.RFC3339Nano, sb["expires_at"].(string))
	if d := expires.Sub(created); d < 59*time.Second || d > 61*time.Second {
		t.Fatalf("lifetime %s", d)
	}

	// Another owner sees nothing of it.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/" + id}, {"DELETE", "/v1/sandboxes/" + id},
		{"POST", "/v1/sandboxes/" + id + "/execute"}, {"GET", "/v1/sandboxes/" + id + "/files?path=/etc"},
		{"GET", "/v1/sandboxes/" + id + "/commands"}, {"GET", "/v1/sandboxes/" + id + "/contexts"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"code": "print(1)"}
		}
		want(t, e.do(c.method, c.path, e.keyB, body), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	}
	if l := e.do("GET", "/v1/sandboxes", e.keyB, nil).json(t)["sandboxes"].([]any); len(l) != 0 {
		t.Fatalf("B lists %v", l)
	}
	if l := e.do("GET", "/v1/sandboxes", e.keyA, nil).json(t)["sandboxes"].([]any); len(l) != 1 {
		t.Fatalf("A lists %v", l)
	}
	want(t, e.do("GET", "/v1/sandboxes/nope", e.keyA, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	// Keep-alive.
	r = e.do("POST", "/v1/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": 600})
	want(t, r, http.StatusOK, "")
	exp2, _ := time.Parse(time.RFC3339Nano, r.json(t)["expires_at"].(string))
	if d := time.Until(exp2); d < 590*time.Second || d > 601*time.Second {
		t.Fatalf("after keep-alive expires in %s", d)
	}
	rec, err := e.store.GetSandbox(context.Background(), id)
	if err != nil || !rec.ExpiresAt.Equal(exp2) {
		t.Fatalf("store expires %v, want %v (%v)", rec.ExpiresAt, exp2, err)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": -1}), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// Delete: gone from the list, 409 with the reason afterwards, still
	// visible as stopped.
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1"}), http.StatusConflict, "ERR_SANDBOX_STATE")
	r = e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["state"] != "stopped" || m["stop_reason"] != "killed" {
		t.Fatalf("after delete: %s", r.body)
	}
	if l := e.do("GET", "/v1/sandboxes", e.keyA, nil).json(t)["sandboxes"].([]any); len(l) != 0 {
		t.Fatalf("running after delete: %v", l)
	}
	if l := e.do("GET", "/v1/sandboxes?state=all", e.keyA, nil).json(t)["sandboxes"].([]any); len(l) != 1 {
		t.Fatalf("all after delete: %v", l)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/sandboxes/"+id, e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	if ids, _ := e.rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("runtime still holds %v", ids)
	}
}

func TestExpiredSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{SweepInterval: 50 * time.Millisecond})
	id := e.create(e.keyA, map[string]any{"timeout": 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, _ := e.store.GetSandbox(context.Background(), id)
		if rec.State == store.SandboxStopped {
			if rec.StopReason != "timed out" {
				t.Fatalf("stop reason %q", rec.StopReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never recorded the timeout")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1"})
	want(t, r, http.StatusConflict, "ERR_SANDBOX_STATE")
	if !strings.Contains(string(r.body), "timed out") {
		t.Fatalf("no reason in %s", r.body)
	}
}

func TestCreateValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	tests := []struct {
		name, body string
		status     int
		code       string
	}{
		{"malformed", `{"timeout":`, 400, "ERR_BAD_REQUEST"},
		{"not json", `hello`, 400, "ERR_BAD_REQUEST"},
		{"unknown field", `{"tmplate":"python"}`, 400, "ERR_BAD_REQUEST"},
		{"wrong type", `{"timeout":"long"}`, 400, "ERR_BAD_REQUEST"},
		{"array", `[]`, 400, "ERR_BAD_REQUEST"},
		{"trailing", `{} {}`, 400, "ERR_BAD_REQUEST"},
		{"negative timeout", `{"timeout":-5}`, 400, "ERR_BAD_REQUEST"},
		{"huge timeout", `{"timeout":1e12}`, 400, "ERR_BAD_REQUEST"},
		{"tiny memory", `{"resources":{"memory_mb":1}}`, 400, "ERR_BAD_REQUEST"},
		{"unknown template", `{"template":"cobol"}`, 404, "ERR_TEMPLATE_NOT_FOUND"},
		{"network", `{"sandbox_config":{"network_restricted":"no"}}`, 400, "ERR_INVALID_POLICY"},
		{"bad env", `{"env":{"A=B":"c"}}`, 400, "ERR_BAD_REQUEST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want(t, e.do("POST", "/v1/sandboxes", e.keyA, tt.body), tt.status, tt.code)
		})
	}
	r := e.do("POST", "/v1/sandboxes", e.keyA, `{"timeout":"long"}`)
	if msg := string(r.body); !strings.Contains(msg, `\"timeout\"`) && !strings.Contains(msg, "timeout") {
		t.Fatalf("message does not name the field: %s", msg)
	}
	if l, _ := e.rt.List(context.Background()); len(l) != 0 {
		t.Fatalf("refused creates left sandboxes %v", l)
	}
}

func TestMaxSandboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxSandboxes: 1})
	e.create(e.keyA, nil)
	r := e.do("POST", "/v1/sandboxes", e.keyB, nil)
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
	if r.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
}

func TestExecute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id + "/execute"

	r := e.do("POST", path, e.keyA, map[string]any{"code": "import sys\nprint('hi')\nprint('oops', file=sys.stderr)", "language": "python"})
	want(t, r, http.StatusOK, "")
	ex := r.json(t)
	if ex["status"] != "success" || ex["stdout"] != "hi\n" || ex["stderr"] != "oops\n" || ex["error"] != nil {
		t.Fatalf("execution %s", r.body)
	}
	if _, ok := ex["results"].([]any); !ok {
		t.Fatalf("results is not an array: %s", r.body)
	}
	for _, k := range []string{"execution_time_ms", "cpu_time_ms", "peak_memory_bytes"} {
		if _, ok := ex[k].(float64); !ok {
			t.Fatalf("%s missing: %s", k, r.body)
		}
	}

	r = e.do("POST", path, e.keyA, map[string]any{"code": "raise ValueError('bad')"})
	want(t, r, http.StatusOK, "")
	ex = r.json(t)
	if errObj, _ := ex["error"].(map[string]any); ex["status"] != "error" || errObj["name"] != "ValueError" || errObj["value"] != "bad" {
		t.Fatalf("error execution %s", r.body)
	}

	r = e.do("POST", path, e.keyA, map[string]any{"code": "import time\ntime.sleep(5)", "timeout_ms": 300})
	want(t, r, http.StatusOK, "")
	if ex = r.json(t); ex["status"] != "timeout" || ex["error_code"] != "ERR_SANDBOX_TIMEOUT" {
		t.Fatalf("timeout execution %s", r.body)
	}

	r = e.do("POST", path, e.keyA, map[string]any{"code": "echo $((6*7))", "language": "bash"})
	if ex = r.json(t); ex["stdout"] != "42\n" {
		t.Fatalf("bash %s", r.body)
	}
	r = e.do("POST", path, e.keyA, map[string]any{"code": "console.log(6*7)", "language": "javascript"})
	if ex = r.json(t); ex["stdout"] != "42\n" {
		t.Fatalf("javascript %s", r.body)
	}

	want(t, e.do("POST", path, e.keyA, map[string]any{"code": "1", "language": "cobol"}), http.StatusBadRequest, "ERR_UNSUPPORTED_LANGUAGE")
	want(t, e.do("POST", path, e.keyA, `{"code":1}`), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", path, e.keyA, `{"code":"1","langauge":"python"}`), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", path, e.keyA, `{"code":"1","timeout_ms":0}`), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", path, e.keyA, ``), http.StatusBadRequest, "ERR_BAD_REQUEST")

	e.srv.SyncRecords(context.Background())
	execs, err := e.store.ListExecutions(context.Background(), id)
	// The refused one too: every execution that reached the engine is
	// recorded with how it ended (bad JSON never reached it).
	if err != nil || len(execs) != 6 {
		t.Fatalf("recorded executions %d (%v), want 6", len(execs), err)
	}
	if execs[0].Status != "success" || execs[0].Language != "python" || execs[1].Status != "error" ||
		execs[2].ErrorCode != "ERR_SANDBOX_TIMEOUT" || execs[3].Language != "bash" ||
		execs[5].Status != "error" || execs[5].ErrorCode != "ERR_UNSUPPORTED_LANGUAGE" || execs[5].Error == "" {
		t.Fatalf("records %+v", execs)
	}
}

func TestMaxExecutionTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, map[string]any{"sandbox_config": map[string]any{"max_execution_time": 0.5, "network_restricted": true}})
	start := time.Now()
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "import time\ntime.sleep(10)", "timeout_ms": 60000})
	if ex := r.json(t); ex["status"] != "timeout" || time.Since(start) > 8*time.Second {
		t.Fatalf("after %s: %s", time.Since(start), r.body)
	}
}

type event struct {
	name string
	data map[string]any
}

func readSSE(t *testing.T, body []byte) []event {
	t.Helper()
	var out []event
	var cur event
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("bad data line %q: %v", line, err)
			}
		case line == "" && cur.name != "":
			out = append(out, cur)
			cur = event{}
		}
	}
	return out
}

func readNDJSON(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("bad line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestExecuteStreaming(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id + "/execute"
	code := map[string]any{"code": "import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)\nraise KeyError('k')"}

	r := e.do("POST", path, e.keyA, code, "Accept", "text/event-stream")
	want(t, r, http.StatusOK, "")
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	evs := readSSE(t, r.body)
	names := map[string]int{}
	for _, ev := range evs {
		names[ev.name]++
	}
	last := evs[len(evs)-1]
	// The done event does not repeat what was streamed.
	if names["stdout"] == 0 || names["stderr"] == 0 || names["error"] != 1 || last.name != "done" || last.data["status"] != "error" ||
		last.data["stdout"] != "" || last.data["stderr"] != "" || len(last.data["results"].([]any)) != 0 {
		t.Fatalf("SSE events %+v", evs)
	}
	for _, ev := range evs {
		if ev.name == "stdout" && ev.data["text"] != "a\n" {
			t.Fatalf("stdout event %+v", ev)
		}
	}

	for _, variant := range [][]string{{"?stream=1"}, {"", "Accept", "application/x-ndjson"}} {
		r = e.do("POST", path+variant[0], e.keyA, code, variant[1:]...)
		want(t, r, http.StatusOK, "")
		if ct := r.header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Fatalf("content type %q", ct)
		}
		lines := readNDJSON(t, r.body)
		types := map[string]int{}
		for _, l := range lines {
			types[l["type"].(string)]++
		}
		lastLine := lines[len(lines)-1]
		exec, _ := lastLine["execution"].(map[string]any)
		if types["stdout"] == 0 || types["error"] != 1 || lastLine["type"] != "done" || exec["status"] != "error" {
			t.Fatalf("NDJSON %s", r.body)
		}
		for _, l := range lines {
			if l["type"] == "error" && l["error"].(map[string]any)["name"] != "KeyError" {
				t.Fatalf("error line %v", l)
			}
		}
	}

	// An error found before anything streamed is a plain error response.
	r = e.do("POST", path+"?stream=1", e.keyA, map[string]any{"code": "1", "language": "cobol"})
	want(t, r, http.StatusBadRequest, "ERR_UNSUPPORTED_LANGUAGE")
}

// TestStreamUnsupportedLanguage: a streamed execution in a language no
// kernel speaks is a plain 400, even when the stream would send its
// headers at once (under a loaded host, finding the error in the engine
// took longer than the streams' commit delay, and the client got a 200
// stream with a failure in it).
func TestStreamUnsupportedLanguage(t *testing.T) {
	// Not parallel: it sets the streams' commit delay.
	defer server.SetCommitDelay(0)()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	for _, variant := range []string{"?stream=1", "?stream=sse"} {
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute"+variant, e.keyA, map[string]any{"code": "1", "language": "cobol"})
		wantMsg(t, r, http.StatusBadRequest, "ERR_UNSUPPORTED_LANGUAGE", `unsupported language "cobol"`)
	}
	// The control: a known language streams.
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute?stream=1", e.keyA, map[string]any{"code": "1", "language": "python"})
	want(t, r, http.StatusOK, "")
}

func TestStreamFlushesEachEvent(t *testing.T) {
	if testutil.Race {
		t.Skip("measures flush latency; the race detector distorts it (make test also runs it without -race)")
	}
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes/"+id+"/execute?stream=1",
		strings.NewReader(`{"code":"import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')"}`))
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("the first event took %s: not flushed", d)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxUploadBytes: 1 << 20})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id + "/files"

	r := e.do("PUT", base+"?path=notes/a.txt", e.keyA, "hello")
	want(t, r, http.StatusCreated, "")
	fi := r.json(t)
	home := strings.TrimSuffix(fi["path"].(string), "/notes/a.txt") // /home/user, as the agent resolves it
	if !strings.HasPrefix(home, "/") || fi["size"] != 5.0 || fi["type"] != "file" {
		t.Fatalf("write %s", r.body)
	}
	r = e.do("GET", base+"?path="+home+"/notes/a.txt", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if string(r.body) != "hello" || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("read %q %q", r.body, r.header.Get("Content-Type"))
	}
	// Empty files read back empty.
	want(t, e.do("PUT", base+"?path=empty", e.keyA, ""), http.StatusCreated, "")
	if r = e.do("GET", base+"?path=empty", e.keyA, nil); r.status != 200 || len(r.body) != 0 {
		t.Fatalf("empty read %d %q", r.status, r.body)
	}

	r = e.do("GET", base+"/stat?path=notes", e.keyA, nil)
	if fi := r.json(t); fi["type"] != "dir" {
		t.Fatalf("stat %s", r.body)
	}
	r = e.do("GET", base+"/list?path=notes", e.keyA, nil)
	if l := r.json(t)["entries"].([]any); len(l) != 1 || l[0].(map[string]any)["name"] != "a.txt" {
		t.Fatalf("list %s", r.body)
	}
	want(t, e.do("POST", base+"/mkdir", e.keyA, map[string]any{"path": "x/y"}), http.StatusCreated, "")
	r = e.do("POST", base+"/move", e.keyA, map[string]any{"from": "notes/a.txt", "to": "x/y/b.txt"})
	want(t, r, http.StatusOK, "")
	if fi := r.json(t); fi["path"] != home+"/x/y/b.txt" {
		t.Fatalf("move %s", r.body)
	}
	want(t, e.do("GET", base+"?path=notes/a.txt", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	r = e.do("GET", base+"/list?path=x&depth=2", e.keyA, nil)
	if l := r.json(t)["entries"].([]any); len(l) != 2 {
		t.Fatalf("depth 2 list %s", r.body)
	}
	want(t, e.do("DELETE", base+"?path=x", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", base+"/stat?path=x", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")

	// Multipart upload.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, content := range map[string]string{"one.txt": "1", "../../two.txt": "22"} {
		fw, _ := mw.CreateFormFile("file", name)
		fw.Write([]byte(content))
	}
	mw.Close()
	r = e.do("POST", base+"?path="+home+"/up", e.keyA, buf.Bytes(), "Content-Type", mw.FormDataContentType())
	want(t, r, http.StatusCreated, "")
	if l := r.json(t)["files"].([]any); len(l) != 2 {
		t.Fatalf("upload %s", r.body)
	}
	if r = e.do("GET", base+"?path=up/two.txt", e.keyA, nil); string(r.body) != "22" {
		t.Fatalf("uploaded file %d %q", r.status, r.body)
	}

	// Bad requests.
	want(t, e.do("GET", base, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", base+"?path=up", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", base+"/list?path=up&depth=x", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", base+"?path=up", e.keyA, "raw", "Content-Type", "text/plain"), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", base+"/mkdir", e.keyA, `{"path":5}`), http.StatusBadRequest, "ERR_BAD_REQUEST")
}

func TestUploadTooLarge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxUploadBytes: 1 << 20})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id + "/files"
	big := bytes.Repeat([]byte("x"), 1<<20+1)

	// With a Content-Length.
	want(t, e.do("PUT", base+"?path=big", e.keyA, big), http.StatusRequestEntityTooLarge, "ERR_FILE_TOO_LARGE")
	// Chunked, so that only the MaxBytesReader can see it.
	req, _ := http.NewRequest("PUT", e.url+base+"?path=big2", struct{ *bytes.Reader }{bytes.NewReader(big)})
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || req.ContentLength != 0 {
		t.Fatalf("chunked upload: %d (content length %d)", res.StatusCode, req.ContentLength)
	}
	// One multipart part too large.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "big")
	fw.Write(big)
	mw.Close()
	want(t, e.do("POST", base+"?path=/tmp", e.keyA, buf.Bytes(), "Content-Type", mw.FormDataContentType()),
		http.StatusRequestEntityTooLarge, "ERR_FILE_TOO_LARGE")
	// Exactly the limit is fine, and the sandbox survived.
	want(t, e.do("PUT", base+"?path=ok", e.keyA, big[:1<<20]), http.StatusCreated, "")
	for _, p := range []string{"big", "big2", "/tmp/big"} {
		want(t, e.do("GET", base+"/stat?path="+p, e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	}
}

func TestPathEscape(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id + "/files"
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil || !bytes.Contains(hostPasswd, []byte("root:")) {
		t.Fatalf("the host's /etc/passwd is needed to prove the escape would work: %v", err)
	}
	for _, p := range []string{"../../etc/passwd", "/../../../../etc/passwd", "/home/user/../../../../../etc/passwd"} {
		r := e.do("GET", base+"?path="+p, e.keyA, nil)
		if bytes.Contains(r.body, []byte("root:")) {
			t.Fatalf("read %s returned the host's passwd", p)
		}
	}
	// A write through .. lands inside the sandbox, not on the host.
	root := filepath.Join(e.rt.Dir, id, "root")
	for _, p := range []string{"../../../../../../../../tmp/sf-escape-" + id, "/../../tmp/sf-escape-" + id} {
		r := e.do("PUT", base+"?path="+p, e.keyA, "x")
		want(t, r, http.StatusCreated, "")
		if _, err := os.Stat(filepath.Join(root, r.json(t)["path"].(string))); err != nil {
			t.Fatalf("write %s landed outside the sandbox root (%s): %v", p, r.body, err)
		}
	}
	if _, err := os.Stat("/tmp/sf-escape-" + id); err == nil {
		os.Remove("/tmp/sf-escape-" + id)
		t.Fatal("a write escaped to the host's /tmp")
	}
	// A symlink made inside the sandbox does not lead out either.
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/commands", e.keyA, map[string]any{"cmd": "ln",
		"args": []string{"-s", "/etc/passwd", "link"}, "cwd": "/home/user"}), http.StatusOK, "")
	if b, err := os.ReadFile(e.home(id) + "/link"); err != nil || !bytes.Equal(b, hostPasswd) {
		t.Fatalf("the link does not lead to the host's passwd outside the agent: %v", err)
	}
	if r := e.do("GET", base+"?path=link", e.keyA, nil); bytes.Contains(r.body, []byte("root:")) {
		t.Fatal("a symlink read the host's passwd")
	}
}

func TestCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id + "/commands"
	home := "/home/user" // a sandbox path; the fake runtime puts it under its root

	r := e.do("POST", base, e.keyA, map[string]any{"cwd": home, "cmd": "sh", "args": []string{"-c", "echo out; echo err >&2; exit 3"}})
	want(t, r, http.StatusOK, "")
	if c := r.json(t); c["stdout"] != "out\n" || c["stderr"] != "err\n" || c["exit_code"] != 3.0 || c["status"] != "exited" || c["pid"].(float64) <= 0 {
		t.Fatalf("foreground %s", r.body)
	}
	r = e.do("POST", base, e.keyA, map[string]any{"cwd": home, "cmd": "sleep", "args": []string{"5"}, "timeout_ms": 200})
	if c := r.json(t); c["status"] != "timeout" {
		t.Fatalf("timeout %s", r.body)
	}
	r = e.do("POST", base, e.keyA, map[string]any{"cwd": home, "cmd": "sh", "args": []string{"-c", "echo one; echo two"}}, "Accept", "text/event-stream")
	evs := readSSE(t, r.body)
	if len(evs) < 3 || evs[0].name != "start" || evs[len(evs)-1].name != "done" || evs[len(evs)-1].data["exit_code"] != 0.0 {
		t.Fatalf("SSE %s", r.body)
	}
	r = e.do("POST", base+"?stream=1", e.keyA, map[string]any{"cwd": home, "cmd": "echo", "args": []string{"x"}})
	lines := readNDJSON(t, r.body)
	if lines[0]["type"] != "start" || lines[len(lines)-1]["type"] != "done" || lines[len(lines)-1]["command"].(map[string]any)["exit_code"] != 0.0 {
		t.Fatalf("NDJSON %s", r.body)
	}

	// Background with stdin: list, input, stream, eof.
	r = e.do("POST", base, e.keyA, map[string]any{"cwd": home, "cmd": "cat", "background": true, "stdin": true, "tag": "cat"})
	want(t, r, http.StatusAccepted, "")
	pid := int(r.json(t)["pid"].(float64))
	r = e.do("GET", base, e.keyA, nil)
	found := false
	for _, p := range r.json(t)["processes"].([]any) {
		if pm := p.(map[string]any); int(pm["pid"].(float64)) == pid && pm["tag"] == "cat" && pm["cmd"] == "cat" {
			found = true
		}
	}
	if !found {
		t.Fatalf("pid %d not listed: %s", pid, r.body)
	}
	// The stream is attached once its start event arrived.
	streamed := e.openNDJSON("GET", fmt.Sprintf("%s/%d/stream", base, pid), nil, func(m map[string]any) bool { return m["type"] == "start" })
	want(t, e.do("POST", fmt.Sprintf("%s/%d/input", base, pid), e.keyA, map[string]any{"data": "hello\n"}), http.StatusNoContent, "")
	want(t, e.do("POST", fmt.Sprintf("%s/%d/input", base, pid), e.keyA, map[string]any{"data_base64": "d29ybGQK", "eof": true}), http.StatusNoContent, "")
	var sr ndjsonRest
	select {
	case sr = <-streamed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end after eof")
	}
	var out strings.Builder
	for _, l := range sr.lines {
		if l["type"] == "stdout" {
			out.WriteString(l["text"].(string))
		}
	}
	if out.String() != "hello\nworld\n" {
		t.Fatalf("streamed %q: %v", out.String(), sr.lines)
	}

	// Signals, by name and number.
	for _, sig := range []any{"SIGTERM", "kill", 9, "9"} {
		r = e.do("POST", base, e.keyA, map[string]any{"cwd": home, "cmd": "sleep", "args": []string{"30"}, "background": true})
		pid = int(r.json(t)["pid"].(float64))
		want(t, e.do("POST", fmt.Sprintf("%s/%d/signal", base, pid), e.keyA, map[string]any{"signal": sig}), http.StatusNoContent, "")
		deadline := time.Now().Add(5 * time.Second)
		for {
			r = e.do("GET", base, e.keyA, nil)
			if !strings.Contains(string(r.body), fmt.Sprintf(`"pid":%d,`, pid)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("signal %v: pid %d still listed", sig, pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want(t, e.do("POST", base+"/1/signal", e.keyA, map[string]any{"signal": "SIGNOPE"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", base+"/abc/signal", e.keyA, map[string]any{"signal": 9}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", base+"/999999/signal", e.keyA, map[string]any{"signal": 9}), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", base+"/1/input", e.keyA, map[string]any{}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", base, e.keyA, map[string]any{"args": []string{"x"}}), http.StatusBadRequest, "ERR_BAD_REQUEST")
}

func TestContexts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	base := "/v1/sandboxes/" + id + "/contexts"
	want(t, e.do("MKDIR", base, e.keyA, nil), http.StatusMethodNotAllowed, "ERR_METHOD_NOT_ALLOWED")
	r := e.do("POST", base, e.keyA, map[string]any{"language": "python", "cwd": "/tmp"})
	want(t, r, http.StatusCreated, "")
	c := r.json(t)
	ctxID, _ := c["id"].(string)
	if ctxID == "" || c["language"] != "python" || c["cwd"] != "/tmp" {
		t.Fatalf("context %s", r.body)
	}
	r = e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "import os\nprint(os.getcwd().endswith('/tmp'))", "context_id": ctxID})
	if ex := r.json(t); ex["stdout"] != "True\n" {
		t.Fatalf("execute in context %s", r.body)
	}
	r = e.do("GET", base, e.keyA, nil)
	if !strings.Contains(string(r.body), ctxID) {
		t.Fatalf("list %s", r.body)
	}
	want(t, e.do("POST", base+"/"+ctxID+"/restart", e.keyA, nil), http.StatusOK, "")
	want(t, e.do("DELETE", base+"/"+ctxID, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", base+"/"+ctxID, e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", base, e.keyA, map[string]any{"language": "cobol"}), http.StatusBadRequest, "ERR_UNSUPPORTED_LANGUAGE")
}

func TestParallelSandboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			key := e.keyA
			if i%2 == 1 {
				key = e.keyB
			}
			r := e.do("POST", "/v1/sandboxes", key, nil)
			if r.status != http.StatusCreated {
				errs <- fmt.Errorf("create %d: %d %s", i, r.status, r.body)
				return
			}
			id := r.json(t)["id"].(string)
			r = e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": fmt.Sprintf("print(%d*2)", i)})
			if got := r.json(t)["stdout"]; got != fmt.Sprintf("%d\n", i*2) {
				errs <- fmt.Errorf("execute %d: %s", i, r.body)
			}
			r = e.do("PUT", "/v1/sandboxes/"+id+"/files?path=n", key, fmt.Sprint(i))
			if r.status != http.StatusCreated {
				errs <- fmt.Errorf("write %d: %s", i, r.body)
			}
			if r = e.do("GET", "/v1/sandboxes/"+id+"/files?path=n", key, nil); string(r.body) != fmt.Sprint(i) {
				errs <- fmt.Errorf("read %d: %q", i, r.body)
			}
			if r = e.do("DELETE", "/v1/sandboxes/"+id, key, nil); r.status != http.StatusNoContent {
				errs <- fmt.Errorf("delete %d: %s", i, r.body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ids, _ := e.rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("left %v", ids)
	}
}

func TestPanicRecovery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Ready: func(context.Context) error { panic("boom") }})
	r := e.do("GET", "/readyz", "", nil)
	want(t, r, http.StatusInternalServerError, "ERR_INTERNAL")
	if strings.Contains(string(r.body), "boom") {
		t.Fatalf("the cause leaked: %s", r.body)
	}
}

func TestShutdownDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	ctx := context.Background()
	if err := e.engine.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.RecordStopped(ctx)
	rec, _ := e.store.GetSandbox(ctx, id)
	if rec.State != store.SandboxStopped || rec.StopReason != "engine shut down" {
		t.Fatalf("record after engine close %+v", rec)
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, nil), http.StatusServiceUnavailable, "ERR_CAPACITY")
}

// TestStreamFailure: a sandbox that dies while its execution streams ends
// the stream with a failure event, after the 200 status was sent.
func TestStreamFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	done := e.openNDJSON("POST", "/v1/sandboxes/"+id+"/execute?stream=1",
		map[string]any{"code": "import time\nprint('x', flush=True)\ntime.sleep(20)"}, stdoutHas("x"))
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	var r ndjsonRest
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the stream did not end when its sandbox was killed")
	}
	if r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	last := r.lines[len(r.lines)-1]
	errObj, _ := last["error"].(map[string]any)
	if last["type"] != "failure" || errObj["code"] == "" || errObj["request_id"] != r.header.Get("X-Request-Id") {
		t.Fatalf("stream ended with %v", r.lines)
	}
}

// TestRecordedButNotHeld: a sandbox recorded as running that this server
// does not hold (as after a crash) is not found, and not listed.
func TestRecordedButNotHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	rec, err := e.store.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	rec.ID = "ghost"
	if err := e.store.PutSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	want(t, e.do("GET", "/v1/sandboxes/ghost", e.keyA, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	l := e.do("GET", "/v1/sandboxes", e.keyA, nil).json(t)["sandboxes"].([]any)
	if len(l) != 1 || l[0].(map[string]any)["id"] != id {
		t.Fatalf("list %v", l)
	}
}
