package testutil

import (
	"net"
	"testing"
)

// ClosingListener listens on addr (TCP) until t ends and accepts every
// connection only to close it at once: a port that is open, for tests that
// check whether something can reach it. Each accepted connection is also
// announced on the returned channel, which drops announcements nobody reads
// once 16 are waiting.
func ClosingListener(t testing.TB, addr string) (net.Listener, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	return ln, accepted
}
