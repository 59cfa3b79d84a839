//go:build linux

package kubernetes

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	//lint:ignore SA1019 client-go's portforward and spdy dialers still hand out this package's types (k8s.io/streaming's are distinct)
	"k8s.io/apimachinery/pkg/util/httpstream"
)

// pipeStream is an httpstream.Stream over a pipe: what the far end writes
// is read; Reset breaks it.
type pipeStream struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func newPipeStream() *pipeStream {
	r, w := io.Pipe()
	return &pipeStream{r: r, w: w}
}

func (s *pipeStream) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s *pipeStream) Write(p []byte) (int, error) { return len(p), nil }
func (s *pipeStream) Close() error                { return nil }
func (s *pipeStream) Reset() error {
	s.r.CloseWithError(errors.New("stream reset"))
	return nil
}
func (s *pipeStream) Headers() http.Header { return http.Header{} }
func (s *pipeStream) Identifier() uint32   { return 1 }

// TestStreamConnDeadlines: a forwarded stream honours deadlines as a
// net.Conn must (the agent client bounds calls with them), and reports
// why the kubelet ended it.
func TestStreamConnDeadlines(t *testing.T) {
	t.Parallel()
	st := newPipeStream()
	removed := false
	c := &streamConn{data: st, remove: func() { removed = true }}
	go st.w.Write([]byte("hi"))
	buf := make([]byte, 2)
	if n, err := c.Read(buf); n != 2 || err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	// A deadline cleared in time does not fire.
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	c.SetReadDeadline(time.Time{})
	go func() { time.Sleep(60 * time.Millisecond); st.w.Write([]byte("ok")) }()
	if n, err := c.Read(buf); n != 2 || err != nil {
		t.Fatalf("after a cleared deadline: %d, %v", n, err)
	}
	// One that passes ends a blocked read with a timeout.
	c.SetDeadline(time.Now().Add(20 * time.Millisecond))
	start := time.Now()
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the deadline fired after %v", d)
	}
	c.Close()
	if !removed {
		t.Fatal("Close left the streams with the connection")
	}

	// The kubelet's message on the error stream is what a read reports.
	st2 := newPipeStream()
	c2 := &streamConn{data: st2, remove: func() {}}
	c2.fail(errors.New("kubernetes: port-forward to sf-x: connection refused"))
	if _, err := c2.Read(buf); err == nil || err.Error() != "kubernetes: port-forward to sf-x: connection refused" {
		t.Fatalf("read after the kubelet's error: %v", err)
	}
}

// hungConn is a port-forward connection whose far end never answers:
// CreateStream waits until the connection closes.
type hungConn struct {
	closed chan bool
	once   sync.Once
}

func (c *hungConn) CreateStream(http.Header) (httpstream.Stream, error) {
	<-c.closed
	return nil, errors.New("connection closed")
}
func (c *hungConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}
func (c *hungConn) CloseChan() <-chan bool             { return c.closed }
func (c *hungConn) SetIdleTimeout(time.Duration)       {}
func (c *hungConn) RemoveStreams(...httpstream.Stream) {}

// TestDialHonoursContext: a dial over a connection whose Pod is gone
// (its streams are never answered) ends with the caller's context, not
// the connection's own timeout, and the connection is dropped.
func TestDialHonoursContext(t *testing.T) {
	t.Parallel()
	f := newForwarder(nil, "ns")
	hc := &hungConn{closed: make(chan bool)}
	f.conns["sf-x"] = &forwardConn{conn: hc}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.dial(ctx, "sf-x", 49983)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the dial returned after %v", d)
	}
	select {
	case <-hc.closed:
	default:
		t.Fatal("the connection that did not answer was kept")
	}
	if len(f.conns) != 0 {
		t.Fatalf("connections kept: %v", f.conns)
	}
}
