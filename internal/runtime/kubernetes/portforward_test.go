//go:build linux

package kubernetes

import (
	"errors"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
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
