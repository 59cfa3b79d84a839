package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// memPeak samples the process's Go heap and RSS until stop is called and
// returns how far each rose above where they were at the start.
func memPeak(t *testing.T) (stop func() (heap, rss int64)) {
	t.Helper()
	runtime.GC()
	heap0, rss0 := heapBytes(), rssBytes(t)
	var mu sync.Mutex
	maxHeap, maxRSS := heap0, rss0
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			h, r := heapBytes(), rssBytes(t)
			mu.Lock()
			maxHeap, maxRSS = max(maxHeap, h), max(maxRSS, r)
			mu.Unlock()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int64, int64) {
		close(quit)
		<-done
		return maxHeap - heap0, maxRSS - rss0
	}
}

func heapBytes() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

func rssBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// execution is the part of an execution these tests look at.
type execution struct {
	Status    string `json:"status"`
	Truncated bool   `json:"truncated"`
	Results   []struct {
		Text string `json:"text"`
	} `json:"results"`
	Dropped *struct {
		Results int    `json:"results"`
		Bytes   int64  `json:"bytes"`
		Reason  string `json:"reason"`
	} `json:"dropped"`
}

// executeLean runs code and reads the answer without keeping what it does
// not need (the test runs in the server's process: what the client holds
// would count as the server's). Streamed, it counts the result lines.
func executeLean(t *testing.T, e *env, id, code string, stream bool) (ex execution, streamed int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code, "timeout_ms": 600000}) // a loaded machine is slow
	url := e.url + "/v1/sandboxes/" + id + "/execute"
	if stream {
		url += "?stream=1"
	}
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	if !stream {
		if err := json.NewDecoder(res.Body).Decode(&ex); err != nil {
			t.Fatal(err)
		}
		return ex, 0
	}
	br := bufio.NewReaderSize(res.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull { // a long line (a result): keep its start, skip the rest
			line = bytes.Clone(line[:64])
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
		}
		if err != nil {
			t.Fatalf("stream ended without done: %v", err)
		}
		switch {
		case bytes.HasPrefix(line, []byte(`{"result":`)), bytes.HasPrefix(line, []byte(`{"type":"result"`)):
			streamed++
		case bytes.Contains(line, []byte(`"type":"done"`)):
			var done struct {
				Execution execution `json:"execution"`
			}
			if err := json.Unmarshal(line, &done); err != nil {
				t.Fatalf("done line: %v", err)
			}
			return done.Execution, streamed
		case bytes.Contains(line, []byte(`"type":"failure"`)):
			t.Fatalf("stream failed: %s", line)
		}
	}
}

// TestResultsBounded: a cell that calls display() 100 times with 3 MB
// each, or makes one 50 MB figure, leaves the server's memory flat; what
// was not delivered is reported (truncated, dropped), never silently lost.
// Not parallel: it measures the process's memory.
func TestResultsBounded(t *testing.T) {
	if testutil.Race {
		t.Skip("measures the server's memory; the race detector distorts it (make test also runs it without -race)")
	}
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, nil)
	const flood = `
class Big:
    def __init__(self, i): self.i = i
    def _repr_html_(self): return "<b>" + "x" * 3_000_000 + "</b>"
    def __repr__(self): return "Big(%d)" % self.i
for i in range(100):
    display(Big(i))
`
	const figure = `
class Figure:
    def _repr_png_(self): return b"\x89PNG" + bytes(50_000_000)
    def __repr__(self): return "Figure"
display(Figure())
print("after the figure")
`
	// The bound on what one execution may make the server hold: the
	// results it keeps (16 MiB) as the response encodes them, a few
	// frames, and the collector's lag.
	const bound = 128 << 20
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("flood stream=%v", stream), func(t *testing.T) {
			stop := memPeak(t)
			ex, streamed := executeLean(t, e, id, flood, stream)
			heap, rss := stop()
			t.Logf("display() 100 × 3 MB, stream=%v: heap +%d MiB, RSS +%d MiB; delivered %d, dropped %+v",
				stream, heap>>20, rss>>20, len(ex.Results)+streamed, ex.Dropped)
			if heap > bound || rss > bound {
				t.Errorf("the server's memory rose by %d MiB (heap) and %d MiB (RSS), over %d MiB", heap>>20, rss>>20, bound>>20)
			}
			delivered := len(ex.Results) + streamed
			if ex.Status != "success" || !ex.Truncated || ex.Dropped == nil || delivered+ex.Dropped.Results != 100 ||
				delivered == 0 || !strings.Contains(ex.Dropped.Reason, "bytes of results") {
				t.Errorf("execution %+v (results %d, streamed %d), dropped %+v", ex.Status, len(ex.Results), streamed, ex.Dropped)
			}
			if stream && len(ex.Results) != 0 {
				t.Errorf("the done event repeats %d streamed results", len(ex.Results))
			}
		})
	}
	t.Run("one 50 MB figure", func(t *testing.T) {
		stop := memPeak(t)
		ex, _ := executeLean(t, e, id, figure, false)
		heap, rss := stop()
		t.Logf("one 50 MB figure: heap +%d MiB, RSS +%d MiB; dropped %+v", heap>>20, rss>>20, ex.Dropped)
		if heap > bound || rss > bound {
			t.Errorf("the server's memory rose by %d MiB (heap) and %d MiB (RSS)", heap>>20, rss>>20)
		}
		if !ex.Truncated || ex.Dropped == nil || ex.Dropped.Results != 1 || ex.Dropped.Bytes < 50_000_000 || len(ex.Results) != 0 {
			t.Errorf("a 50 MB figure was not reported as dropped: %+v, dropped %+v", ex, ex.Dropped)
		}
	})
	// The sandbox is still usable, and its memory given back.
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"})
	want(t, r, http.StatusOK, "")
	if res := r.json(t)["results"].([]any); len(res) != 1 {
		t.Fatalf("1+1 after the flood: %s", r.body)
	}
}

// TestSlowClientPinsNothing: a client that stops reading a stream breaks
// it at the write deadline, which stops the execution: the context is free
// for the next one. Through the E2B interpreter, whose output cap (64 MiB)
// is far over what the socket buffers hold. Not parallel: it shortens the
// deadline.
func TestSlowClientPinsNothing(t *testing.T) {
	defer server.SetStreamWriteTimeout(500 * time.Millisecond)()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "code-interpreter-v1"})
	// A client with a tiny receive window that never reads.
	conn := smallWindowConn(t, e.url)
	body := `{"code":"import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"}`
	fmt.Fprintf(conn, "POST /execute HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 49999\r\nX-Access-Token: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", sb.ID, sb.Token, len(body), body)

	// Read until the flood's output shows, then stop reading.
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var seen []byte
	for buf := make([]byte, 4096); !bytes.Contains(seen, []byte(`"type":"stdout"`)); {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("the flood did not start: %v: %q", err, seen)
		}
		seen = append(seen, buf[:n]...)
	}
	// The next execution in the same (default) context.
	done := make(chan resp, 1)
	go func() {
		done <- e.do("POST", "/execute", "", map[string]any{"code": "1+1"},
			"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.Token)
	}()
	select {
	case r := <-done:
		want(t, r, http.StatusOK, "")
		if !strings.Contains(string(r.body), `"text":"2"`) {
			t.Fatalf("1+1: %s", r.body)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the next execution waited behind a stream nobody reads")
	}
}

// TestSlowEnvdClientPinsNothing: an envd process stream (Connect's
// Process.Start) whose client stops reading breaks at its write
// deadline: the server ends the stream and detaches from the process,
// which runs on, as when a client closes its stream. Without the
// deadline the stream, its handler and the agent call behind it stay
// blocked for as long as the client keeps the connection. Not parallel:
// it shortens the deadline.
func TestSlowEnvdClientPinsNothing(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	defer server.SetStreamWriteTimeout(writeTimeout)()
	// A fast output rate fills the socket buffers (megabytes) at once.
	logs := &logRecords{}
	e := newLoggedEnv(t, server.Config{}, logs, func(c *sandbox.Config) { c.OutputRate = 256 << 20 })
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	conn := smallWindowConn(t, e.url)
	msg := []byte(`{"process":{"cmd":"/bin/sh","args":["-c","exec yes flood"]},"tag":"flood"}`)
	body := append([]byte{0, 0, 0, 0, 0}, msg...)
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	fmt.Fprintf(conn, "POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nX-Request-Id: envd-flood\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: %s\r\n"+
		"Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n%s", sb.ID, sb.Token, len(body), body)

	// Read until the flood's output shows, then stop reading until the
	// server ends the request: the client that stops reading is what is
	// tested.
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var seen []byte
	for buf := make([]byte, 4096); !bytes.Contains(seen, []byte(`"stdout"`)); {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("the flood did not start: %v: %q", err, seen)
		}
		seen = append(seen, buf[:n]...)
	}
	waitRequestEnded(t, logs, "envd-flood")

	// The server gave up on the stream: reading again finds what the
	// socket buffers held, then the end of the connection; a stream still
	// open would flow on at the sandbox's output rate.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if err != nil {
		t.Fatalf("the stream was still open after its client stopped reading (%d bytes more): %v", n, err)
	}
	t.Logf("%d bytes were left in the buffers", n)

	// The process runs on, detached, as after a closed stream.
	proc, _ := e.rpcClients(sb, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := proc.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	for _, p := range list.Msg.GetProcesses() {
		if p.GetTag() == "flood" {
			pid = p.GetPid()
		}
	}
	if pid == 0 {
		t.Fatalf("the flood process is gone: %v", list.Msg.GetProcesses())
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{
		Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}

// TestSlowEventClientPinsNothing: an SSE event stream whose client stops
// reading ends at its write deadline, with its subscription, instead of
// staying open for as long as the client keeps the connection. Not
// parallel: it shortens the deadline.
func TestSlowEventClientPinsNothing(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	defer server.SetStreamWriteTimeout(writeTimeout)()
	logs := &logRecords{}
	e := newLoggedEnv(t, server.Config{}, logs)
	id := e.create(e.keyA, nil)
	rec, err := e.store.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	conn := smallWindowConn(t, e.url)
	fmt.Fprintf(conn, "GET /v1/events HTTP/1.1\r\nHost: x\r\nX-Request-Id: events-slow\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n", e.keyA)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var seen []byte
	for buf := make([]byte, 4096); !bytes.Contains(seen, []byte(": stream")); {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("the stream did not start: %v: %q", err, seen)
		}
		seen = append(seen, buf[:n]...)
	}
	// Far more than the socket buffers hold, while the client reads
	// nothing until the server ends the request: that client is what is
	// tested.
	pad := strings.Repeat("x", 64<<10)
	for i := range 300 {
		e.bus.Emit(events.Event{Type: events.ExecutionFinished, SandboxID: id, Owner: rec.Owner,
			Details: map[string]any{"n": i, "pad": pad}})
		if i%50 == 49 {
			e.bus.Sync(context.Background())
		}
	}
	waitRequestEnded(t, logs, "events-slow")

	// The server gave up: reading again finds what the buffers held, then
	// the end of the connection.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if err != nil {
		t.Fatalf("the event stream was still open after its client stopped reading (%d bytes more): %v", n, err)
	}
	if n >= 300*64<<10 {
		t.Fatalf("all %d bytes arrived: the stream was never cut", n)
	}
	t.Logf("%d bytes were left in the buffers", n)
}

// TestSlowDownloadPinsNothing: a file download whose client stops
// reading ends at its write deadline, and with it the agent call that
// reads the file. Not parallel: it shortens the deadline.
func TestSlowDownloadPinsNothing(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	defer server.SetStreamWriteTimeout(writeTimeout)()
	logs := &logRecords{}
	e := newLoggedEnv(t, server.Config{}, logs)
	id := e.create(e.keyA, nil)
	const size = 64 << 20
	if err := os.WriteFile(filepath.Join(e.home(id), "big"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	conn := smallWindowConn(t, e.url)
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/files?path=big HTTP/1.1\r\nHost: x\r\nX-Request-Id: download-slow\r\nAuthorization: Bearer %s\r\n\r\n", id, e.keyA)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(conn, make([]byte, 4096)); err != nil {
		t.Fatalf("the download did not start: %v", err)
	}
	// The client reads nothing until the server ends the request: that
	// client is what is tested.
	waitRequestEnded(t, logs, "download-slow")

	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if err != nil || n >= size {
		t.Fatalf("the download went on after its client stopped reading (%d more bytes of %d): %v", n, size, err)
	}
	t.Logf("%d bytes were left in the buffers", n)
	// The sandbox still answers.
	want(t, e.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=big", e.keyA, nil), http.StatusOK, "")
}

// smallWindowConn dials the server with a 4 KiB receive buffer, so that a
// test that stops reading soon blocks the server's writes.
func smallWindowConn(t *testing.T, url string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitRequestEnded waits until the server has logged the end of the
// request with id rid (its handler returned), failing t after 30 s.
func waitRequestEnded(t *testing.T, logs *logRecords, rid string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(logs.find("request", "request_id", rid)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not end request %s within 30 s of its client's last read", rid)
		}
	}
}
