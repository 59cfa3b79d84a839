package agent

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// The sandbox's code connects to the egress listener; the host, waiting
// in egress.accept, gets the connection's bytes both ways, half-closes
// included. A waiting accept is not activity; a host that hangs up stops
// waiting; without a listener the op is unsupported.
func TestEgressAccept(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, Config{Egress: ln})
	srv := <-a.srv
	a.srv <- srv
	waiting := func(n int64, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); srv.egressWaiting.Load() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d egress.accept requests wait, want %d", what, srv.egressWaiting.Load(), n)
			}
		}
	}

	// A host that hangs up while waiting leaves nothing behind.
	gone := a.dial(t)
	if err := agentproto.WriteFrame(gone, agentproto.FrameJSON, []byte(`{"op":"egress.accept"}`)); err != nil {
		t.Fatal(err)
	}
	waiting(1, "the request sent")
	gone.Close()
	waiting(0, "its host hung up")

	host := a.dial(t)
	host.SetDeadline(time.Now().Add(10 * time.Second))
	connected := make(chan agentproto.Event, 1)
	go func() {
		ev, err := agentproto.Connect(host, agentproto.Request{Op: agentproto.OpEgressAccept})
		if err != nil {
			t.Error(err)
		}
		connected <- ev
	}()
	waiting(1, "the host's request sent")
	if info := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t).done.Agent; info.Busy != 0 {
		t.Fatalf("a waiting egress.accept counts as busy: %+v", info)
	}
	code, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer code.Close()
	if ev := <-connected; ev.Type != agentproto.EventConnected {
		t.Fatalf("event %+v, want connected", ev)
	}
	msg := strings.Repeat("CONNECT example.test:443 ", 5000)
	go func() {
		code.Write([]byte(msg))
		code.(*net.TCPConn).CloseWrite()
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(host, got); err != nil || string(got) != msg {
		t.Fatalf("host read %d bytes, %v", len(got), err)
	}
	host.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	host.(*net.UnixConn).CloseWrite()
	back, err := io.ReadAll(code)
	if err != nil || string(back) != "HTTP/1.1 200 Connection established\r\n\r\n" {
		t.Fatalf("code read %q, %v", back, err)
	}

	b := startAgent(t, Config{})
	if done := b.call(t, agentproto.Request{Op: agentproto.OpEgressAccept}).done; done.Code != agentproto.CodeUnsupported {
		t.Fatalf("without a listener: %+v", done)
	}
}
