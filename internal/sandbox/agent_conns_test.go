package sandbox

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

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
	}}, nil)
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
	}}, nil)
	nc2, _ := c2.dial(context.Background())
	nc2.Close()
	if len(c2.conns.conns) != 0 {
		t.Fatal("a closed connection stayed in the set")
	}
}
