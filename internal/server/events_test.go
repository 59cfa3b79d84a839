package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// sseEvent is one event of a text/event-stream response.
type sseEvent struct {
	ID   string
	Type string
	Data map[string]any
}

// sseStream reads an event stream until it ends or ctx is done.
type sseStream struct {
	res    *http.Response
	sc     *bufio.Scanner
	cancel context.CancelFunc
}

func (e *env) openSSE(path, key, lastID string) *sseStream {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		e.t.Fatalf("stream %s: status %d, %s", path, res.StatusCode, res.Header.Get("Content-Type"))
	}
	s := &sseStream{res: res, sc: bufio.NewScanner(res.Body), cancel: cancel}
	e.t.Cleanup(s.close)
	return s
}

func (s *sseStream) close() { s.cancel(); s.res.Body.Close() }

// next returns the next event; ok is false when the stream ended.
func (s *sseStream) next(t *testing.T) (ev sseEvent, ok bool) {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, s.cancel) // a stuck stream fails the test, not the suite
	defer timer.Stop()
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if ev.Type != "" {
				return ev, true
			}
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.Data); err != nil {
				t.Fatalf("data %q: %v", line, err)
			}
		}
	}
	return ev, false
}

// all reads events until the stream ends.
func (s *sseStream) all(t *testing.T) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, ok := s.next(t)
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

func types(evs []sseEvent) string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return strings.Join(out, " ")
}

func listTypes(t *testing.T, r resp) (string, []map[string]any) {
	t.Helper()
	var body struct {
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("%s: %v", r.body, err)
	}
	var out []string
	for _, e := range body.Events {
		out = append(out, e["type"].(string))
	}
	return strings.Join(out, " "), body.Events
}

func TestSandboxEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	path := "/v1/sandboxes/" + id
	want(t, e.do("POST", path+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	want(t, e.do("POST", path+"/execute", e.keyA, map[string]any{"code": "import time\ntime.sleep(5)", "timeout_ms": 300}), http.StatusOK, "")
	want(t, e.do("DELETE", path, e.keyA, nil), http.StatusNoContent, "")

	// The sandbox's stream replays its history and ends after its stop.
	evs := e.openSSE(path+"/events", e.keyA, "").all(t)
	wantTypes := "sandbox.created execution.started execution.finished execution.started execution.finished resource_exceeded sandbox.stopped"
	if got := types(evs); got != wantTypes {
		t.Fatalf("stream: %s\nwant:   %s", got, wantTypes)
	}
	fin, exceeded, stop := evs[2].Data, evs[5].Data, evs[6].Data
	if d, _ := fin["details"].(map[string]any); d["status"] != "success" || d["duration_ms"] == nil || d["cpu_time_ms"] == nil ||
		fin["execution_id"] == "" || fin["execution_id"] != evs[1].Data["execution_id"] || fin["sandbox_id"] != id {
		t.Fatalf("execution.finished %v (started %v)", fin, evs[1].Data)
	}
	if d, _ := exceeded["details"].(map[string]any); d["resource"] != "wall_time" || d["limit"] != 300.0 {
		t.Fatalf("resource_exceeded %v", exceeded)
	}
	if d, _ := stop["details"].(map[string]any); d["reason"] != "killed" {
		t.Fatalf("sandbox.stopped %v", stop)
	}
	for i, ev := range evs {
		if ev.ID != fmt.Sprint(ev.Data["id"]) || ev.Data["timestamp"] == nil {
			t.Fatalf("event %d: id %q, data %v", i, ev.ID, ev.Data)
		}
	}
	e.srv.SyncRecords(context.Background())
	execs, _ := e.store.ListExecutions(context.Background(), id)
	if len(execs) != 2 || execs[0].ID != fin["execution_id"] {
		t.Fatalf("the execution record's id %v is not the events' %v", execs, fin["execution_id"])
	}

	// The same, as JSON, with filters and pages.
	r := e.do("GET", path+"/events", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if got, _ := listTypes(t, r); got != wantTypes {
		t.Fatalf("list: %s", got)
	}
	r = e.do("GET", path+"/events?type=execution.finished,resource_exceeded", e.keyA, nil)
	if got, _ := listTypes(t, r); got != "execution.finished execution.finished resource_exceeded" {
		t.Fatalf("type filter: %s", got)
	}
	r = e.do("GET", path+"/events?type=execution.started&type=sandbox.stopped", e.keyA, nil)
	if got, _ := listTypes(t, r); got != "execution.started execution.started sandbox.stopped" {
		t.Fatalf("repeated type filter: %s", got)
	}
	var pages []string
	cursor := ""
	for i := 0; i < 10; i++ {
		r = e.do("GET", path+"/events?limit=3&cursor="+cursor, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		got, _ := listTypes(t, r)
		pages = append(pages, got)
		next, _ := r.json(t)["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
	}
	if strings.Join(pages, " ") != wantTypes || len(pages) != 3 {
		t.Fatalf("pages %q", pages)
	}
	future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	if got, _ := listTypes(t, e.do("GET", path+"/events?since="+future, e.keyA, nil)); got != "" {
		t.Fatalf("since the future: %s", got)
	}
	past := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
	if got, _ := listTypes(t, e.do("GET", path+"/events?since="+past, e.keyA, nil)); got != wantTypes {
		t.Fatalf("since an hour ago: %s", got)
	}

	// The account-wide listing has them too, and filters by sandbox.
	other := e.create(e.keyA, nil)
	r = e.do("GET", "/v1/events?sandbox="+id+"&type=sandbox.stopped", e.keyA, nil)
	if got, _ := listTypes(t, r); got != "sandbox.stopped" {
		t.Fatalf("account listing for %s: %s", id, got)
	}
	r = e.do("GET", "/v1/events?sandbox="+other, e.keyA, nil)
	if got, _ := listTypes(t, r); got != "sandbox.created" {
		t.Fatalf("account listing for %s: %s", other, got)
	}

	// Another owner sees none of it.
	want(t, e.do("GET", path+"/events", e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	if got, _ := listTypes(t, e.do("GET", "/v1/events", e.keyB, nil)); got != "" {
		t.Fatalf("owner B sees %s", got)
	}
	if got, _ := listTypes(t, e.do("GET", "/v1/events?sandbox="+id, e.keyB, nil)); got != "" {
		t.Fatalf("owner B sees %s", got)
	}

	// Bad queries.
	for _, q := range []string{"type=nope", "since=yesterday", "limit=0", "limit=1001", "cursor=x", "cursor=-1"} {
		want(t, e.do("GET", path+"/events?"+q, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	want(t, e.do("GET", path+"/events?sandbox="+id, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", "/v1/events", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
}

// An account stream sees new events live; reconnecting with Last-Event-ID
// replays what came meanwhile, exactly once.
func TestEventStreamResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	s := e.openSSE("/v1/events", e.keyA, "")
	id := e.create(e.keyA, nil)
	first, ok := s.next(t)
	if !ok || first.Type != "sandbox.created" || first.Data["sandbox_id"] != id || first.ID == "" {
		t.Fatalf("first live event %+v", first)
	}
	s.close()

	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	// The sandbox's own stream ends at the stop: once it has, every event
	// is stored.
	e.openSSE("/v1/sandboxes/"+id+"/events", e.keyA, "").all(t)

	s = e.openSSE("/v1/events", e.keyA, first.ID)
	var got []sseEvent
	for len(got) < 3 {
		ev, ok := s.next(t)
		if !ok {
			t.Fatalf("stream ended after %s", types(got))
		}
		got = append(got, ev)
	}
	if types(got) != "execution.started execution.finished sandbox.stopped" {
		t.Fatalf("resumed stream: %s", types(got))
	}
	// Still live after the replay, and nothing repeated.
	id2 := e.create(e.keyA, nil)
	ev, _ := s.next(t)
	if ev.Type != "sandbox.created" || ev.Data["sandbox_id"] != id2 {
		t.Fatalf("live after replay: %+v", ev)
	}

	// A sandbox stream resumed past some events gives only the rest.
	evs := e.openSSE("/v1/sandboxes/"+id+"/events", e.keyA, got[0].ID).all(t)
	if types(evs) != "execution.finished sandbox.stopped" {
		t.Fatalf("resumed sandbox stream: %s", types(evs))
	}
}
