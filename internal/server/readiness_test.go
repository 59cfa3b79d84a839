package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb/processpbconnect"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

// TestReadyzStoreOutage: with its PostgreSQL gone, the server's requests
// fail (503 ERR_STORAGE_UNAVAILABLE) and /readyz says so too, within the
// store check's interval. Before, /readyz stayed 200 through the outage
// while every call was 503.
func TestReadyzStoreOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			pg.Stop()
		}
	}()
	st, err := postgres.Open(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, key, err := auth.Create(ctx, st, auth.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	defer bus.Close()
	srv := server.New(server.Config{Events: bus, ReadyCheckInterval: 100 * time.Millisecond}, st, nil, log)
	hs := httptest.NewServer(srv)
	defer func() { hs.Close(); srv.Shutdown(ctx) }()
	e := &env{t: t, url: hs.URL}

	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
	want(t, e.do("GET", "/v1/sandboxes", key, nil), http.StatusOK, "")
	stopped = true
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	want(t, e.do("GET", "/v1/sandboxes", key, nil), http.StatusServiceUnavailable, "ERR_STORAGE_UNAVAILABLE")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r := e.do("GET", "/readyz", "", nil)
		if r.status == http.StatusServiceUnavailable {
			want(t, r, http.StatusServiceUnavailable, "ERR_STORAGE_UNAVAILABLE")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz answers %d %s with the database gone", r.status, r.body)
		}
	}
	want(t, e.do("GET", "/healthz", "", nil), http.StatusOK, "") // alive, not ready
}

// pingStore is a store whose Ping fails while down, counting pings.
type pingStore struct {
	*sqlite.DB
	down  atomic.Bool
	pings atomic.Int64
}

func (p *pingStore) Ping(ctx context.Context) error {
	p.pings.Add(1)
	if p.down.Load() {
		return fmt.Errorf("ping: %w", store.ErrUnavailable)
	}
	return p.DB.Ping(ctx)
}

// TestReadyzStoreCheck: /readyz pings the store at most once per
// interval however many probes arrive, fails with its failure, and
// recovers with it.
func TestReadyzStoreCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, t.TempDir()+"/sheepfold.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &pingStore{DB: db}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	defer bus.Close()
	srv := server.New(server.Config{Events: bus, ReadyCheckInterval: time.Hour}, st, nil, log)
	hs := httptest.NewServer(srv)
	defer func() { hs.Close(); srv.Shutdown(ctx) }()
	e := &env{t: t, url: hs.URL}
	for range 50 {
		want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")
	}
	if n := st.pings.Load(); n != 1 {
		t.Fatalf("50 probes within the interval pinged the store %d times", n)
	}

	srv2 := server.New(server.Config{Events: bus, ReadyCheckInterval: 50 * time.Millisecond}, st, nil, log)
	hs2 := httptest.NewServer(srv2)
	defer func() { hs2.Close(); srv2.Shutdown(ctx) }()
	e2 := &env{t: t, url: hs2.URL}
	st.down.Store(true)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r := e2.do("GET", "/readyz", "", nil)
		if r.status != http.StatusOK {
			want(t, r, http.StatusServiceUnavailable, "ERR_STORAGE_UNAVAILABLE")
			if r.header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz stays 200 with the store down")
		}
	}
	st.down.Store(false)
	for deadline := time.Now().Add(5 * time.Second); e2.do("GET", "/readyz", "", nil).status != http.StatusOK; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("/readyz did not recover with the store")
		}
	}
}

// served serves e's server on a listener of its own (its Shutdown then
// drains that listener) and returns its URL.
func (e *env) served() string {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	go e.srv.Serve(ln)
	return "http://" + ln.Addr().String()
}

// fresh is a client that opens a new connection for each request, so
// that a closed listener shows.
var fresh = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// probe asks url+path with a new connection: the status, or 0 when the
// connection was refused (or closed by the listener's close).
func probe(t *testing.T, url, path string) int {
	t.Helper()
	res, err := fresh.Get(url + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// TestDrainDelay: on a shutdown, /readyz answers 503 at once, and every
// request is still served for the drain delay before the listener
// closes; a server whose /readyz nobody asked closes it at once. Before,
// /readyz was 503 for under 0.25 s before the listener closed.
func TestDrainDelay(t *testing.T) {
	t.Parallel()
	// Long enough that a loaded host's slowness (a second, under a full
	// run with -race) never looks like the delay, or hides its absence.
	const delay = 3 * time.Second
	for _, asked := range []bool{true, false} {
		t.Run(fmt.Sprintf("readyz asked %v", asked), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, server.Config{DrainDelay: delay})
			url := e.served()
			if asked && probe(t, url, "/readyz") != http.StatusOK {
				t.Fatal("/readyz before the shutdown")
			}
			start := time.Now()
			e.srv.Drain() // what serve does at the signal
			shut := make(chan error, 1)
			go func() { shut <- e.srv.Shutdown(context.Background()) }()
			if asked {
				if s := probe(t, url, "/readyz"); s != http.StatusServiceUnavailable {
					t.Fatalf("/readyz right after the signal: %d", s)
				}
				r, err := fresh.Get(url + "/healthz")
				if err != nil || r.StatusCode != http.StatusOK {
					t.Fatalf("a request during the drain delay: %v %v", r, err)
				}
				r.Body.Close()
			}
			for probe(t, url, "/healthz") != 0 {
				if time.Since(start) > delay+5*time.Second {
					t.Fatal("the listener did not close")
				}
				time.Sleep(10 * time.Millisecond)
			}
			closed := time.Since(start)
			if err := <-shut; err != nil {
				t.Fatal(err)
			}
			switch {
			case asked && closed < delay:
				t.Fatalf("the listener closed %v after the signal, before the drain delay of %v", closed, delay)
			case asked && closed > delay+2*time.Second:
				t.Fatalf("the listener closed %v after the signal, long past the drain delay of %v", closed, delay)
			case !asked && closed > delay/2:
				t.Fatalf("with nothing asking /readyz, the listener closed only %v after the signal", closed)
			}
			t.Logf("the listener closed %v after the signal", closed)
		})
	}
}

// readSSEUntilEnd reads an SSE response to its end and returns its
// events.
func readSSEUntilEnd(body io.Reader) []sseEvent {
	var out []sseEvent
	var ev sseEvent
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Type != "" {
				out = append(out, ev)
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.Data)
		}
	}
	return out
}

// TestDrainEndsStreamsWithAnError: a shutdown whose timeout cuts off
// requests still running ends every stream with an error its client
// reads: an event stream and a streamed execution with a failure event
// (ERR_SHUTTING_DOWN; the event stream's names the last event id), an
// E2B interpreter execution with an error line and end_of_execution, an
// envd process stream with a Connect error (unavailable), an MCP
// run_code with its tool error; the code is interrupted and Shutdown
// returns soon after its timeout. Before, the executions ran on past
// the timeout until the engine was closed under them, and an E2B
// execution's stream then broke off with no end.
func TestDrainEndsStreamsWithAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{DrainDelay: -1})
	url := e.served()
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	second := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	third := e.create(e.keyA, nil)
	const sleep = "import time; time.sleep(30)"

	type result struct {
		name string
		body string
		err  error
	}
	results := make(chan result, 5)
	send := func(name string, req *http.Request) {
		go func() {
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{name, "", err}
				return
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			results <- result{name, string(b), err}
		}()
	}
	req := func(method, path, body string, hdr ...string) *http.Request {
		r, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	send("events", req("GET", "/v1/events", "", "Authorization", "Bearer "+e.keyA, "Accept", "text/event-stream"))
	send("execute", req("POST", "/v1/sandboxes/"+sb.ID+"/execute", fmt.Sprintf(`{"code":%q}`, sleep),
		"Authorization", "Bearer "+e.keyA, "Accept", "text/event-stream"))
	send("e2b", req("POST", "/execute", fmt.Sprintf(`{"code":%q}`, sleep),
		"E2b-Sandbox-Id", second.ID, "E2b-Sandbox-Port", "49999", "X-Access-Token", second.Token))
	pc := processpbconnect.NewProcessClient(&http.Client{Transport: headerTransport{http.Header{"E2b-Sandbox-Id": {sb.ID},
		"E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {sb.Token}}}}, url, connect.WithProtoJSON())
	go func() {
		st, err := pc.Start(context.Background(), connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}}}))
		if err != nil {
			results <- result{"envd", "", err}
			return
		}
		for st.Receive() {
		}
		results <- result{"envd", fmt.Sprintf("%v: %v", connect.CodeOf(st.Err()), st.Err()), nil}
	}()
	send("mcp", req("POST", "/mcp", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"sandbox_id":%q,"code":%q}}}`, third, sleep),
		"Authorization", "Bearer "+e.keyA, "Content-Type", "application/json", "Accept", "application/json, text/event-stream"))
	e.waitRecorded(t, sb.ID, sleep, 1)
	e.waitRecorded(t, second.ID, sleep, 1)
	e.waitRecorded(t, third, sleep, 1)
	// The envd process is up when the sandbox lists it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l, err := pc.List(context.Background(), connect.NewRequest(&processpb.ListRequest{}))
		if err == nil && len(l.Msg.Processes) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the envd process did not start: %v", err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := e.srv.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown did not report requests cut off")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	got := map[string]string{}
	timeout := time.After(10 * time.Second)
	for range 5 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("%s: %v", r.name, r.err)
			}
			got[r.name] = r.body
		case <-timeout:
			t.Fatalf("streams still open 10 s after the drain: %d ended (%v)", len(got), got)
		}
	}
	evs := readSSEUntilEnd(strings.NewReader(got["events"]))
	if len(evs) == 0 || evs[len(evs)-1].Type != "failure" || evs[len(evs)-1].Data["error"].(map[string]any)["code"] != "ERR_SHUTTING_DOWN" {
		t.Fatalf("the event stream ended with %v", evs)
	}
	if _, ok := evs[len(evs)-1].Data["last_event_id"]; !ok {
		t.Fatalf("the event stream's failure names no last event: %v", evs[len(evs)-1])
	}
	evs = readSSEUntilEnd(strings.NewReader(got["execute"]))
	if len(evs) == 0 || evs[len(evs)-1].Type != "failure" || evs[len(evs)-1].Data["error"].(map[string]any)["code"] != "ERR_SHUTTING_DOWN" {
		t.Fatalf("the execution stream ended with %v", evs)
	}
	lines := strings.Split(strings.TrimSpace(got["e2b"]), "\n")
	if n := len(lines); n < 2 || !strings.Contains(lines[n-2], `"name":"ShuttingDown"`) || lines[n-1] != `{"type":"end_of_execution"}` {
		t.Fatalf("the E2B execution ended with %q", got["e2b"])
	}
	if !strings.HasPrefix(got["envd"], "unavailable: ") || !strings.Contains(got["envd"], "shutting down") {
		t.Fatalf("the envd stream ended with %q", got["envd"])
	}
	if !strings.Contains(got["mcp"], "ERR_SHUTTING_DOWN") || !strings.Contains(got["mcp"], `"isError":true`) {
		t.Fatalf("the MCP call ended with %q", got["mcp"])
	}
}

// TestDrainCutKeepsResponsesWhole: a response cut by the drain reaches
// its client whole, even when its last chunk is written late. net/http
// writes the chunked body's end after the handler returns, so closing
// the connections as soon as no handler runs cut it off now and then in
// CI ("unexpected EOF" in TestDrainEndsStreamsWithAnError). Here every
// end of a chunked body is held back 300 ms to make the window wide.
func TestDrainCutKeepsResponsesWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{DrainDelay: -1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(slowEndListener{ln})
	url := "http://" + ln.Addr().String()
	id := e.create(e.keyA, nil)
	const sleep = "import time; time.sleep(30)"
	ended := make(chan error, 1)
	var body []byte
	go func() {
		r, _ := http.NewRequest("POST", url+"/v1/sandboxes/"+id+"/execute", strings.NewReader(fmt.Sprintf(`{"code":%q}`, sleep)))
		r.Header.Set("Authorization", "Bearer "+e.keyA)
		r.Header.Set("Accept", "text/event-stream")
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			ended <- err
			return
		}
		defer res.Body.Close()
		body, err = io.ReadAll(res.Body)
		ended <- err
	}()
	e.waitRecorded(t, id, sleep, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown did not report requests cut off")
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the cut stream's end was lost: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	evs := readSSEUntilEnd(strings.NewReader(string(body)))
	if len(evs) == 0 || evs[len(evs)-1].Type != "failure" {
		t.Fatalf("the execution stream ended with %v", evs)
	}
}

// slowEndListener's connections hold back each write that ends a
// chunked body ("0\r\n\r\n") for 300 ms.
type slowEndListener struct{ net.Listener }

func (l slowEndListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return slowEndConn{c}, nil
}

type slowEndConn struct{ net.Conn }

func (c slowEndConn) Write(p []byte) (int, error) {
	if strings.HasSuffix(string(p), "0\r\n\r\n") {
		time.Sleep(300 * time.Millisecond)
	}
	return c.Conn.Write(p)
}

// TestDrainEventStreamClient: the Go SDK's StreamEvents returns the
// drain's failure event as an *Error (ERR_SHUTTING_DOWN), which says to
// resume, rather than taking it for an event or a broken connection.
func TestDrainEventStreamClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{DrainDelay: -1})
	url := e.served()
	c := client.New(url, e.keyA)
	ended := make(chan error, 1)
	var seen atomic.Int64
	// From a moment before the create: however late the stream opens, it
	// carries the create's event (a stream of what comes next alone
	// missed it on a loaded host, opening after it).
	since := time.Now().Add(-time.Second)
	go func() {
		ended <- c.StreamEvents(context.Background(), client.EventQuery{Since: since}, func(client.Event) error { seen.Add(1); return nil })
	}()
	e.create(e.keyA, nil) // an event on the stream: it is open
	for deadline := time.Now().Add(10 * time.Second); seen.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no event streamed")
		}
	}
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ce *client.Error
	if err := <-ended; !errors.As(err, &ce) || ce.Code != "ERR_SHUTTING_DOWN" {
		t.Fatalf("StreamEvents ended with %v", err)
	}
}

// TestDrainEndsModelStreamWithAnError: a streamed model completion that
// a drain cuts off (its provider stuck mid-answer) ends with an error
// event, as OpenAI's streams report one. Before, it ended with nothing.
func TestDrainEndsModelStreamWithAnError(t *testing.T) {
	t.Parallel()
	e, prov := newModelEnv(t, 0, false, server.Config{DrainDelay: -1})
	prov.Push(llmtest.Reply{Content: "hello there", StallAfter: 2})
	url := e.served()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("the first chunk: %q %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	e.srv.Shutdown(ctx)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), `"code":"ERR_SHUTTING_DOWN"`) {
		t.Fatalf("the stream ended with %q", rest)
	}
}

// TestDrainEventStreamPython: the Python SDK's events.stream() raises the
// drain's failure event (ERR_SHUTTING_DOWN) rather than yielding it as an
// event.
func TestDrainEventStreamPython(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{DrainDelay: -1})
	url := e.served()
	e.create(e.keyA, nil)
	py := `import sys
sys.path.insert(0, "../../sdk/python")
from sheepfold.events import Events
from sheepfold.errors import SheepfoldError
try:
    for ev in Events(api_key=sys.argv[1], base_url=sys.argv[2]).stream(cursor=0):
        print("event", ev.type, flush=True)
    print("ended", flush=True)
except SheepfoldError as err:
    print("raised", err.code, flush=True)
`
	cmd := exec.Command("/usr/bin/python3", "-c", py, e.keyA, url)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "event sandbox.created" {
		t.Fatalf("python's first line: %q", sc.Text())
	}
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !sc.Scan() || sc.Text() != "raised ERR_SHUTTING_DOWN" {
		t.Fatalf("python after the drain: %q", sc.Text())
	}
	cmd.Wait()
}
