package agent

import (
	"bufio"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// dialPort performs port.connect against the test agent.
func dialPort(t *testing.T, a *testAgent, port int) (net.Conn, agentproto.Event) {
	t.Helper()
	nc, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	ev, err := agentproto.Connect(nc, agentproto.Request{Op: agentproto.OpPortConnect, Port: port})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	return nc, ev
}

func TestPortConnectPipesBothWaysWithHalfClose(t *testing.T) {
	a := startAgent(t, Config{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The server reads until the client's half-close, then answers what
	// it read in upper case and closes: both half-closes must pass.
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		c.Write([]byte(strings.ToUpper(string(b))))
	}()
	nc, ev := dialPort(t, a, ln.Addr().(*net.TCPAddr).Port)
	if ev.Type != agentproto.EventConnected {
		t.Fatalf("event %+v, want connected", ev)
	}
	msg := strings.Repeat("hello through the agent ", 10000) // more than one buffer
	if _, err := nc.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	nc.(*net.UnixConn).CloseWrite()
	got, err := io.ReadAll(nc)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != strings.ToUpper(msg) {
		t.Fatalf("got %d bytes, want the %d bytes sent, upper-cased", len(got), len(msg))
	}
}

func TestPortConnectRefusedAtOnce(t *testing.T) {
	a := startAgent(t, Config{})
	// A port that was just listening and is closed now.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	start := time.Now()
	_, ev := dialPort(t, a, port)
	if ev.Type != agentproto.EventDone || ev.Code != agentproto.CodeRefused {
		t.Fatalf("event %+v, want a Done with code refused", ev)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusal took %v", d)
	}
	for _, bad := range []int{0, -1, 65536} {
		_, ev := dialPort(t, a, bad)
		if ev.Code != agentproto.CodeBadRequest {
			t.Errorf("port %d: %+v, want bad_request", bad, ev)
		}
	}
}

func TestPortConnectServerSpeaksFirst(t *testing.T) {
	a := startAgent(t, Config{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("banner\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Write([]byte("echo " + line))
	}()
	nc, _ := dialPort(t, a, ln.Addr().(*net.TCPAddr).Port)
	r := bufio.NewReader(nc)
	if line, err := r.ReadString('\n'); err != nil || line != "banner\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	nc.Write([]byte("ping\n"))
	if line, err := r.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("second line %q, %v", line, err)
	}
}

func TestListeningPorts(t *testing.T) {
	// Lines as the kernel writes them (trimmed after the state column's
	// neighbours); only LISTEN (0A) rows count.
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1
   2: 0100007F:0BB8 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 3 1
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000
   1: 00000000000000000000000001000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000
`
	got, err := listeningPorts(strings.NewReader(tcp))
	if err != nil {
		t.Fatal(err)
	}
	got6, err := listeningPorts(strings.NewReader(tcp6))
	if err != nil {
		t.Fatal(err)
	}
	want := []agentproto.PortInfo{{Port: 8000, Address: "0.0.0.0"}, {Port: 3000, Address: "127.0.0.1"},
		{Port: 8080, Address: "::"}, {Port: 9000, Address: "::1"}}
	if all := append(got, got6...); !slices.Equal(all, want) {
		t.Fatalf("ports %+v, want %+v", all, want)
	}
}

func TestPortListSeesAListener(t *testing.T) {
	a := startAgent(t, Config{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	done := a.call(t, agentproto.Request{Op: agentproto.OpPortList}).mustOK(t).done
	for _, p := range done.Ports {
		if p.Port == port && p.Address == "127.0.0.1" {
			return
		}
	}
	t.Fatalf("port %d not among %+v", port, done.Ports)
}
