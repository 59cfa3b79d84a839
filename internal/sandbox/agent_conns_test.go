package sandbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// TestCloseAllEndsStreams: destroying a sandbox ends a call blocked on its
// agent even when nothing resets the connection (a Pod's network goes
// away silently), and no later dial gets through.
func TestCloseAllEndsStreams(t *testing.T) {
	t.Parallel()
	var peers []net.Conn
	c := newAgentClient(&runtime.Instance{Dial: func(context.Context) (net.Conn, error) {
		a, b := net.Pipe() // b never answers and is never closed
		peers = append(peers, b)
		return a, nil
	}}, nil, nil)
	nc, err := c.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := nc.Read(make([]byte, 1))
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("read returned before closeAll: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.conns.closeAll()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("read after closeAll succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked read outlived closeAll")
	}
	if _, err := c.dial(context.Background()); !errors.Is(err, errAgentGone) {
		t.Fatalf("dial after closeAll: %v", err)
	}
	if len(c.conns.conns) != 0 {
		t.Fatalf("connections still tracked: %d", len(c.conns.conns))
	}
	// A connection closed by its caller leaves the set.
	c2 := newAgentClient(&runtime.Instance{Dial: func(context.Context) (net.Conn, error) {
		a, _ := net.Pipe()
		return a, nil
	}}, nil, nil)
	nc2, _ := c2.dial(context.Background())
	nc2.Close()
	if len(c2.conns.conns) != 0 {
		t.Fatal("a closed connection stayed in the set")
	}
}

// TestSlowDialLogged: a connection to an agent that is slow to make is
// logged with the call's operation, whether it then failed or not.
func TestSlowDialLogged(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	c := newAgentClient(&runtime.Instance{Dial: func(context.Context) (net.Conn, error) {
		time.Sleep(30 * time.Millisecond)
		return nil, syscall.ECONNREFUSED
	}}, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if _, err := c.call(context.Background(), agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{}, callOptions{}); err == nil {
		t.Fatal("a refused dial succeeded")
	}
	if logs.Len() != 0 {
		t.Fatalf("a dial faster than %v logged:\n%s", c.slowDial, logs.String())
	}
	c.slowDial = 10 * time.Millisecond
	c.call(context.Background(), agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{}, callOptions{})
	if l := logs.String(); !strings.Contains(l, "slow agent connection") || !strings.Contains(l, "op="+agentproto.OpPing) || !strings.Contains(l, "connection refused") {
		t.Fatalf("a slow dial is not logged with its op and error:\n%s", l)
	}
}
