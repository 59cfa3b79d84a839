//go:build linux

package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	//lint:ignore SA1019 client-go's portforward and spdy dialers still hand out this package's types (k8s.io/streaming's are distinct)
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// forwarder reaches agents through the API server's port-forward of
// their Pods, for servers that cannot reach Pod IPs (outside the
// cluster's network). It keeps one streaming connection per Pod and opens
// a pair of streams (error, data) per dial; TLS to the agent runs inside,
// as over the pod network, so the API server and the kubelet relay bytes
// they cannot read.
type forwarder struct {
	cfg *rest.Config
	ns  string

	mu    sync.Mutex
	conns map[string]*forwardConn // by Pod name
}

type forwardConn struct {
	conn httpstream.Connection
	next atomic.Int64 // request ids
}

func newForwarder(cfg *rest.Config, ns string) *forwarder {
	return &forwarder{cfg: cfg, ns: ns, conns: map[string]*forwardConn{}}
}

// dial opens a connection to port of Pod pod.
func (f *forwarder) dial(ctx context.Context, pod string, port int) (net.Conn, error) {
	c, err := f.connection(ctx, pod)
	if err != nil {
		return nil, err
	}
	id := strconv.FormatInt(c.next.Add(1), 10)
	hdr := http.Header{}
	hdr.Set(corev1.StreamType, corev1.StreamTypeError)
	hdr.Set(corev1.PortHeader, strconv.Itoa(port))
	hdr.Set(corev1.PortForwardRequestIDHeader, id)
	errStream, err := createStream(ctx, c.conn, hdr)
	if err != nil {
		f.drop(pod, c)
		return nil, fmt.Errorf("kubernetes: port-forward to %s: %w", pod, err)
	}
	errStream.Close() // nothing is written to it
	hdr = hdr.Clone()
	hdr.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := createStream(ctx, c.conn, hdr)
	if err != nil {
		c.conn.RemoveStreams(errStream)
		f.drop(pod, c)
		return nil, fmt.Errorf("kubernetes: port-forward to %s: %w", pod, err)
	}
	sc := &streamConn{data: data, remove: func() { c.conn.RemoveStreams(errStream, data) }}
	// The kubelet reports a failed forward (nothing listening, the Pod
	// gone) on the error stream: it ends the data stream too.
	go func() {
		msg, _ := io.ReadAll(errStream)
		if len(msg) > 0 {
			sc.fail(fmt.Errorf("kubernetes: port-forward to %s: %s", pod, strings.TrimSpace(string(msg))))
		}
	}()
	return sc, nil
}

// createStream opens a stream of conn within ctx. Unbounded, it waits
// for the connection's own timeout (30 s) when the far end does not
// answer: a Pod deleted while its connection stayed open. The caller
// drops a connection whose stream failed, which ends a creation left
// running here.
func createStream(ctx context.Context, conn httpstream.Connection, hdr http.Header) (httpstream.Stream, error) {
	type result struct {
		s   httpstream.Stream
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := conn.CreateStream(hdr)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.s != nil {
				conn.RemoveStreams(r.s)
			}
		}()
		return nil, ctx.Err()
	}
}

// connection returns the Pod's streaming connection, made on first use
// and again after it broke.
func (f *forwarder) connection(ctx context.Context, pod string) (*forwardConn, error) {
	f.mu.Lock()
	c, ok := f.conns[pod]
	f.mu.Unlock()
	if ok {
		select {
		case <-c.conn.CloseChan():
			f.drop(pod, c)
		default:
			return c, nil
		}
	}
	u, err := url.Parse(strings.TrimSuffix(f.cfg.Host, "/") + "/api/v1/namespaces/" + f.ns + "/pods/" + pod + "/portforward")
	if err != nil {
		return nil, err
	}
	rt, upgrader, err := spdy.RoundTripperFor(f.cfg)
	if err != nil {
		return nil, err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	wsDialer, err := portforward.NewSPDYOverWebsocketDialer(u, f.cfg)
	if err != nil {
		return nil, err
	}
	// WebSockets first, SPDY where the API server does not take them
	// (as kubectl does).
	dialer := portforward.NewFallbackDialer(wsDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	type result struct {
		conn httpstream.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		done <- result{conn, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
	if res.err != nil {
		return nil, fmt.Errorf("kubernetes: port-forward to %s: %w", pod, res.err)
	}
	c = &forwardConn{conn: res.conn}
	f.mu.Lock()
	if other, ok := f.conns[pod]; ok {
		f.mu.Unlock()
		res.conn.Close() // a concurrent dial won
		return other, nil
	}
	f.conns[pod] = c
	f.mu.Unlock()
	return c, nil
}

// drop closes and forgets a Pod's connection.
func (f *forwarder) drop(pod string, c *forwardConn) {
	f.mu.Lock()
	if f.conns[pod] == c {
		delete(f.conns, pod)
	}
	f.mu.Unlock()
	c.conn.Close()
}

// forget closes the connection of a Pod that is gone.
func (f *forwarder) forget(pod string) {
	f.mu.Lock()
	c, ok := f.conns[pod]
	delete(f.conns, pod)
	f.mu.Unlock()
	if ok {
		c.conn.Close()
	}
}

// streamConn is a port-forward data stream as a net.Conn. A deadline
// that passes resets the stream (it cannot be resumed; the agent's
// connections serve one request each).
type streamConn struct {
	data   httpstream.Stream
	remove func()

	mu       sync.Mutex
	err      error          // why the stream ended early (a deadline, the kubelet)
	timers   [2]*time.Timer // the read and the write deadline
	closed   bool
	closeErr error
}

func (c *streamConn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.data.Reset()
}

func (c *streamConn) wrap(n int, err error) (int, error) {
	if err == nil {
		return n, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return n, c.err
	}
	return n, err
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.wrap(c.data.Read(p)) }
func (c *streamConn) Write(p []byte) (int, error) { return c.wrap(c.data.Write(p)) }

func (c *streamConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	for _, t := range c.timers {
		if t != nil {
			t.Stop()
		}
	}
	c.closeErr = c.data.Reset()
	c.remove()
	return c.closeErr
}

func (c *streamConn) LocalAddr() net.Addr  { return forwardAddr{} }
func (c *streamConn) RemoteAddr() net.Addr { return forwardAddr{} }

// SetDeadline resets the stream when t passes; reads and writes from
// then on fail with os.ErrDeadlineExceeded.
func (c *streamConn) SetDeadline(t time.Time) error {
	c.setDeadline(0, t)
	c.setDeadline(1, t)
	return nil
}

func (c *streamConn) SetReadDeadline(t time.Time) error  { c.setDeadline(0, t); return nil }
func (c *streamConn) SetWriteDeadline(t time.Time) error { c.setDeadline(1, t); return nil }

func (c *streamConn) setDeadline(i int, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timers[i] != nil {
		c.timers[i].Stop()
		c.timers[i] = nil
	}
	if t.IsZero() || c.closed {
		return
	}
	c.timers[i] = time.AfterFunc(time.Until(t), func() { c.fail(os.ErrDeadlineExceeded) })
}

type forwardAddr struct{}

func (forwardAddr) Network() string { return "port-forward" }
func (forwardAddr) String() string  { return "port-forward" }
