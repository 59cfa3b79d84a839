package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// egressAgent is an agent's egress listener as the server sees it: it
// takes egress.accept requests on a loopback port and answers each when
// told to (connect, with the sandbox's bytes; or refuse).
type egressAgent struct {
	ln      net.Listener
	waiting chan net.Conn // the requests waiting for a connection
	refused chan struct{} // told of each request refused
	mu      sync.Mutex
	refuse  bool // answer the next requests with a failed Done
}

func newEgressAgent(t *testing.T) *egressAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &egressAgent{ln: ln, waiting: make(chan net.Conn, 64), refused: make(chan struct{}, 64)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go a.handle(t, c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return a
}

func (a *egressAgent) handle(t *testing.T, c net.Conn) {
	kind, p, err := agentproto.ReadFrame(c)
	if err != nil || kind != agentproto.FrameJSON {
		c.Close()
		return
	}
	var req agentproto.Request
	if err := json.Unmarshal(p, &req); err != nil || req.Op != agentproto.OpEgressAccept {
		t.Errorf("the agent got %q (%v), want an egress.accept request", p, err)
		c.Close()
		return
	}
	a.mu.Lock()
	refuse := a.refuse
	a.mu.Unlock()
	if refuse {
		b, _ := json.Marshal(agentproto.Event{Type: agentproto.EventDone, Code: agentproto.CodeUnsupported, Message: "no egress listener"})
		agentproto.WriteFrame(c, agentproto.FrameJSON, b)
		c.Close()
		a.refused <- struct{}{}
		return
	}
	a.waiting <- c
}

// connect answers one waiting request as the sandbox's code connecting,
// and writes msg on the stream.
func (a *egressAgent) connect(t *testing.T, msg string) net.Conn {
	t.Helper()
	c := a.next(t)
	b, _ := json.Marshal(agentproto.Event{Type: agentproto.EventConnected})
	if err := agentproto.WriteFrame(c, agentproto.FrameJSON, b); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	return c
}

func (a *egressAgent) next(t *testing.T) net.Conn {
	t.Helper()
	return testutil.Receive(t, a.waiting, "an egress.accept request waiting at the agent")
}

// TestServeEgress: the runtime keeps egressPumps egress.accept requests
// waiting at a proxied sandbox's agent, hands each connection made to
// serve with the stream's bytes and replaces its request, makes a
// refused request again, and stops at its context's end, Close waiting
// for all of it.
func TestServeEgress(t *testing.T) {
	t.Parallel()
	a := newEgressAgent(t)
	var d net.Dialer
	inst := &runtime.Instance{ID: "sb", Dial: func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", a.ln.Addr().String())
	}}
	served := make(chan string, 8)
	serve := func(c net.Conn) {
		defer c.Close()
		if _, ok := c.(interface{ CloseWrite() error }); !ok {
			t.Errorf("served a %T, which cannot half-close", c)
		}
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Errorf("read the stream: %v", err)
		}
		served <- string(b)
	}
	r := &Runtime{}
	ctx, cancel := context.WithCancel(context.Background())
	r.ServeEgress(ctx, inst, serve, nil)

	var pending []net.Conn
	for range egressPumps {
		pending = append(pending, a.next(t))
	}
	// Each connection made reaches serve, and its request is replaced.
	for _, msg := range []string{"hello", "again"} {
		b, _ := json.Marshal(agentproto.Event{Type: agentproto.EventConnected})
		c := pending[0]
		pending = pending[1:]
		if err := agentproto.WriteFrame(c, agentproto.FrameJSON, b); err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, msg)
		if got := testutil.Receive(t, served, "the connection made, served"); got != msg {
			t.Fatalf("served %q, want %q", got, msg)
		}
		pending = append(pending, a.next(t))
	}
	// A request that fails (the agent restarting, then refusing) is made
	// again, after a backoff, until one waits again; it still serves.
	a.mu.Lock()
	a.refuse = true
	a.mu.Unlock()
	pending[0].Close()
	pending = pending[1:]
	for range 2 {
		testutil.Receive(t, a.refused, "the failed request made again")
	}
	a.mu.Lock()
	a.refuse = false
	a.mu.Unlock()
	a.connect(t, "third") // the request made again
	if got := testutil.Receive(t, served, "a connection served after failed requests"); got != "third" {
		t.Fatalf("served %q after failed requests", got)
	}
	pending = append(pending, a.next(t))

	// The context's end ends every waiting request; Close waits for it.
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	testutil.Receive(t, closed, "Close to return after the context ended")
	for _, c := range pending {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("a waiting request was not ended: %v", err)
		}
	}
}
