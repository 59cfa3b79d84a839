package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// TestAdmission: with disks kept in memory (a runtime without disks of
// their own), the sum of sandboxes' memory and disk limits is held to the
// host's memory times the overcommit; /readyz says so.
func TestAdmission(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{HostMemoryBytes: 1 << 30, Overcommit: 1})
	e.rt.DiskMemory.Store(true)
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
	first := e.create(e.keyA, nil) // 512 MiB memory + 256 MiB disk
	want(t, e.do("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "ERR_CAPACITY")
	r := e.do("POST", "/v1/sandboxes", e.keyB, nil)
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 768, "disk_mb": 64}}),
		http.StatusServiceUnavailable, "ERR_CAPACITY")
	// One sandbox larger than the host could ever hold is the request's
	// mistake (TestHostCeiling), not a wait.
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 1024, "disk_mb": 64}}),
		http.StatusBadRequest, "ERR_BAD_REQUEST")
	small := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 128, "disk_mb": 64}})
	want(t, e.do("DELETE", "/v1/sandboxes/"+first, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+small, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
	e.create(e.keyB, nil)
}

// TestAdmissionDiskNotMemory: where each sandbox's disk is its own (on
// the data dir, reserved by the runtime), admission holds the sum of the
// memory limits alone to the host's memory: a disk larger than the memory
// takes none of it. Before, a disk counted as memory and two default
// sandboxes (512 MiB memory, 256 MiB disk) did not fit in 1 GiB.
func TestAdmissionDiskNotMemory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{HostMemoryBytes: 1 << 30, Overcommit: 1})
	first := e.create(e.keyA, nil) // 512 MiB memory + 256 MiB disk
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
	second := e.create(e.keyB, map[string]any{"resources": map[string]any{"memory_mb": 512, "disk_mb": 4096}})
	want(t, e.do("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "ERR_CAPACITY")
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 32, "disk_mb": 1}})
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
	if msg := errMessage(t, r); !strings.Contains(msg, "32 MiB of memory: 1024 of 1024 MiB are committed") {
		t.Fatalf("refusal %q", msg)
	}
	// One sandbox's memory over the host is the request's mistake.
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 1025}}),
		http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("DELETE", "/v1/sandboxes/"+first, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+second, e.keyB, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
}

// TestReadyzDataDirFull: a data dir with less free space than the minimum
// is not ready.
func TestReadyzDataDirFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{DataDir: t.TempDir(), MinFreeDiskBytes: 1 << 60})
	want(t, e.do("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "ERR_CAPACITY")
	e = newEnv(t, server.Config{DataDir: t.TempDir()})
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
}

// openNDJSON sends a request that streams NDJSON and returns once a line
// satisfies until (or the stream ends); the response's header and the
// rest of its lines come on the channel when the stream ends.
func (e *env) openNDJSON(method, path string, body any, until func(map[string]any) bool) <-chan ndjsonRest {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	req.Header.Set("Accept", "application/x-ndjson")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	var seen []map[string]any
	for sc.Scan() {
		var m map[string]any
		json.Unmarshal(sc.Bytes(), &m)
		seen = append(seen, m)
		if until(m) {
			break
		}
	}
	rest := make(chan ndjsonRest, 1)
	go func() {
		defer res.Body.Close()
		out := ndjsonRest{status: res.StatusCode, header: res.Header, lines: seen}
		for sc.Scan() {
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m)
			out.lines = append(out.lines, m)
		}
		rest <- out
	}()
	return rest
}

type ndjsonRest struct {
	status int
	header http.Header
	lines  []map[string]any // every line, those before until's included
}

// stdoutHas is an until for openNDJSON: a stdout line containing s.
func stdoutHas(s string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		text, _ := m["text"].(string)
		return m["type"] == "stdout" && strings.Contains(text, s)
	}
}

// TestDrain: once draining, /readyz is 503 at once and new sandboxes are
// refused; a request cut off by the shutdown says the server is shutting
// down.
func TestDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	rest := e.openNDJSON("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"},
		stdoutHas("started"))
	e.srv.Drain()
	want(t, e.do("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "ERR_SHUTTING_DOWN")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, nil), http.StatusServiceUnavailable, "ERR_SHUTTING_DOWN")
	// The drain timeout passed: the engine stops every sandbox.
	if err := e.engine.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	select {
	case r := <-rest:
		lines = r.lines
	case <-time.After(15 * time.Second):
		t.Fatal("the stream did not end when the engine closed")
	}
	if len(lines) == 0 {
		t.Fatal("the stream ended with no last event")
	}
	last := lines[len(lines)-1]
	if errObj, _ := last["error"].(map[string]any); last["type"] != "failure" || errObj["code"] != "ERR_SHUTTING_DOWN" {
		t.Fatalf("the cut-off stream ended with %v", last)
	}
}
