package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// testAgent is an agent served on a unix socket for one test.
type testAgent struct {
	sock   string
	cfg    Config
	srv    chan *server // the server, for white-box checks
	cancel context.CancelFunc
	done   chan error
}

// startAgent runs Serve with cfg (defaults: Root and Home in temporary
// directories, a fake kernel) and stops it when the test ends, failing the
// test if Serve returned an error or recovered a panic.
func startAgent(t testing.TB, cfg Config) *testAgent {
	t.Helper()
	return startAgentWith(t, cfg, true)
}

// startAgentWith is startAgent; fakeKernel says whether a nil NewKernel is
// replaced by the fake kernel.
func startAgentWith(t testing.TB, cfg Config, fakeKernel bool) *testAgent {
	t.Helper()
	dir := testutil.ShortTempDir(t) // socket paths are limited to 108 bytes
	if cfg.Root == "" {
		cfg.Root = t.TempDir()
	}
	if cfg.Home == "" {
		cfg.Home = "/home/user"
		if err := os.MkdirAll(filepath.Join(cfg.Root, cfg.Home), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.NewKernel == nil && fakeKernel {
		cfg.NewKernel = (&fakeKernels{}).new
		cfg.Languages = []string{"python", "javascript", "bash"}
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &testAgent{sock: ln.Addr().String(), cfg: cfg, cancel: cancel, done: make(chan error, 1), srv: make(chan *server, 1)}
	go func() { a.done <- serveForTest(ctx, ln, cfg, a.srv) }()
	t.Cleanup(func() {
		if err := a.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return a
}

// serveForTest is Serve, also handing out its server.
func serveForTest(ctx context.Context, ln net.Listener, cfg Config, srv chan<- *server) error {
	return serve(ctx, ln, cfg, func(s *server) { srv <- s })
}

// stop cancels Serve and waits for it (at most 10 s).
func (a *testAgent) stop() error {
	a.cancel()
	select {
	case err := <-a.done:
		a.done <- err
		if err != nil {
			return err
		}
	case <-time.After(10 * time.Second):
		return errors.New("Serve did not return within 10 s")
	}
	select {
	case s := <-a.srv:
		a.srv <- s
		if n := s.panics.Load(); n > 0 {
			return fmt.Errorf("%d panics recovered", n)
		}
	default:
	}
	return nil
}

func (a *testAgent) dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// result is what one request produced.
type result struct {
	done   agentproto.Event
	events []agentproto.Event
	data   []byte
}

// call performs one request and returns its events; it fails the test on a
// protocol error.
func (a *testAgent) call(t testing.TB, req agentproto.Request) result {
	t.Helper()
	return a.callBody(t, req, nil)
}

func (a *testAgent) callBody(t testing.TB, req agentproto.Request, body io.Reader) result {
	t.Helper()
	c := a.dial(t)
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var r result
	var data bytes.Buffer
	done, err := agentproto.Call(c, req, body, agentproto.Handlers{
		Data: func(p []byte) error { data.Write(p); return nil },
		Event: func(ev agentproto.Event) error {
			r.events = append(r.events, ev)
			return nil
		}})
	if err != nil {
		t.Fatalf("%s: %v", req.Op, err)
	}
	r.done, r.data = done, data.Bytes()
	return r
}

// mustOK fails the test unless r succeeded.
func (r result) mustOK(t testing.TB) result {
	t.Helper()
	if r.done.Code != "" {
		t.Fatalf("done: code %q, message %q", r.done.Code, r.done.Message)
	}
	return r
}

// output concatenates the data of the events of one type.
func (r result) output(typ string) string {
	var b strings.Builder
	for _, ev := range r.events {
		if ev.Type == typ {
			b.Write(ev.Data)
		}
	}
	return b.String()
}

// stream is a request whose events are read one at a time. It reads
// them with agentproto.Call, the engine's own loop, on a goroutine.
type stream struct {
	t      testing.TB
	nc     net.Conn
	events chan agentproto.Event // every event, the Done last
	err    chan error            // the call's error, if it failed
}

func (a *testAgent) open(t testing.TB, req agentproto.Request) *stream {
	t.Helper()
	nc := a.dial(t)
	s := &stream{t: t, nc: nc, events: make(chan agentproto.Event, 1024), err: make(chan error, 1)}
	go func() {
		done, err := agentproto.Call(nc, req, nil, agentproto.Handlers{Event: func(ev agentproto.Event) error {
			s.events <- ev
			return nil
		}})
		if err != nil {
			s.err <- err
			return
		}
		s.events <- done
	}()
	return s
}

// upload sends a request whose body the test then writes frame by frame
// (and may leave unfinished); no reply is read.
func (a *testAgent) upload(t testing.TB, req agentproto.Request) (net.Conn, *agentproto.Conn) {
	t.Helper()
	nc := a.dial(t)
	c := agentproto.NewConn(nc)
	if err := c.WriteJSON(req); err != nil {
		t.Fatal(err)
	}
	return nc, c
}

// next returns the next event (data frames are skipped).
func (s *stream) next() agentproto.Event {
	s.t.Helper()
	select {
	case ev := <-s.events:
		return ev
	case err := <-s.err:
		s.t.Fatalf("read event: %v", err)
	case <-time.After(20 * time.Second):
		s.t.Fatal("read event: no event in 20 s")
	}
	return agentproto.Event{}
}

// until reads events until one of type typ, collecting the output.
func (s *stream) until(typ string) (agentproto.Event, string) {
	s.t.Helper()
	var out strings.Builder
	for {
		ev := s.next()
		if ev.Type == typ {
			return ev, out.String()
		}
		if ev.Type == agentproto.EventDone {
			s.t.Fatalf("done before %s: %+v", typ, ev)
		}
		out.Write(ev.Data)
	}
}

// fakeKernels makes fake kernels and counts them.
type fakeKernels struct {
	started atomic.Int32
	// startDelay slows kernel starts (to race default context creation).
	startDelay time.Duration

	mu  sync.Mutex
	all []*fakeKernel
}

func (fk *fakeKernels) new(ctx context.Context, spec agentproto.ContextSpec) (Kernel, error) {
	if spec.Language == "bash" && spec.Env["FAIL"] != "" {
		return nil, errors.New("interpreter missing")
	}
	time.Sleep(fk.startDelay)
	fk.started.Add(1)
	k := &fakeKernel{spec: spec, vars: map[string]string{}}
	fk.mu.Lock()
	fk.all = append(fk.all, k)
	fk.mu.Unlock()
	return k, nil
}

// fakeKernel interprets a tiny language, one statement per execution:
// "set K V", "get K", "print TEXT", "stderr TEXT", "result TEXT", "raise",
// "block" (until cancelled), "panic", "env K".
type fakeKernel struct {
	spec agentproto.ContextSpec

	mu       sync.Mutex
	vars     map[string]string
	running  int
	overlap  bool
	restarts int
	closed   bool
}

var _ Kernel = (*fakeKernel)(nil)

func (k *fakeKernel) Language() string { return k.spec.Language }

func (k *fakeKernel) Execute(ctx context.Context, spec agentproto.ExecuteSpec, emit func(agentproto.Event) error) agentproto.Event {
	k.mu.Lock()
	k.running++
	if k.running > 1 {
		k.overlap = true
	}
	closed := k.closed
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.running--
		k.mu.Unlock()
	}()
	done := agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusOK, Stats: &agentproto.Stats{}}
	if closed {
		done.Status = agentproto.StatusKilled
		return done
	}
	verb, arg, _ := strings.Cut(spec.Code, " ")
	switch verb {
	case "set":
		key, val, _ := strings.Cut(arg, " ")
		k.mu.Lock()
		k.vars[key] = val
		k.mu.Unlock()
	case "get":
		k.mu.Lock()
		v := k.vars[arg]
		k.mu.Unlock()
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(v)})
	case "print":
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(arg)})
	case "stderr":
		emit(agentproto.Event{Type: agentproto.EventStderr, Data: []byte(arg)})
	case "result":
		emit(agentproto.Event{Type: agentproto.EventResult, Result: &agentproto.Result{Text: arg, IsMainResult: true}})
	case "env":
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(spec.Env[arg])})
	case "raise":
		emit(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{Name: "ValueError", Value: arg}})
		done.Status = agentproto.StatusError
	case "block":
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte("blocking")})
		select {
		case <-ctx.Done():
			done.Status = agentproto.StatusKilled
		case <-time.After(10 * time.Second):
		}
	case "oversize": // events whose encodings are over a frame, then a small one
		emit(agentproto.Event{Type: agentproto.EventResult, Result: &agentproto.Result{Text: strings.Repeat("\x01", 1<<20)}})
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: bytes.Repeat([]byte{0xff}, 4<<20)})
		emit(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{Name: "Huge", Value: strings.Repeat("<", 5<<20)}})
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte("after")})
		done.Status = agentproto.StatusError
	case "panic":
		panic("fake kernel panic")
	default:
		emit(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(spec.Code)})
	}
	return done
}

func (k *fakeKernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.vars = map[string]string{}
	k.restarts++
	return nil
}

func (k *fakeKernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	return nil
}
