package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// portDialTimeout bounds a port.connect's dial on the loopback: a refusal
// is immediate, so only a listener whose backlog is full waits this long.
const portDialTimeout = 5 * time.Second

// portConnect serves port.connect: it dials the port on the loopback and
// then pipes bytes between it and the host's connection until both
// directions have ended. It replies itself (the connected event), so it
// returns a zero Event once connected.
func (s *server) portConnect(c *conn, req *agentproto.Request) agentproto.Event {
	if req.Port < 1 || req.Port > 65535 {
		return fail(agentproto.CodeBadRequest, "port must be between 1 and 65535, not %d", req.Port)
	}
	tc, err := dialLoopback(s.ctx, req.Port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fail(agentproto.CodeRefused, "nothing listens on port %d inside the sandbox", req.Port)
		}
		return fail(agentproto.CodeInternal, "connect to port %d: %v", req.Port, err)
	}
	defer tc.Close()
	connected(c, tc)
	return agentproto.Event{}
}

// connected sends the connected event and then pipes bytes between the
// host's connection and tc until both directions have ended.
func connected(c *conn, tc *net.TCPConn) {
	if err := c.send(agentproto.Event{Type: agentproto.EventConnected}); err != nil {
		return
	}
	// From here the connection is a byte stream: no deadlines (an idle
	// WebSocket may be silent for long); the host ends it, or the agent's
	// shutdown closes it.
	c.nc.SetDeadline(time.Time{})
	var from io.Reader = c.nc
	if early := c.pc.Buffered(); len(early) > 0 {
		from = io.MultiReader(bytes.NewReader(early), c.nc)
	}
	pipe(c.nc, from, tc)
}

// dialLoopback connects to port on 127.0.0.1, or on ::1 when nothing
// listens on the IPv4 loopback (a server bound to "localhost" may have
// chosen either).
func dialLoopback(ctx context.Context, port int) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: portDialTimeout}
	p := strconv.Itoa(port)
	nc, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", p))
	if errors.Is(err, syscall.ECONNREFUSED) {
		if nc6, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", p)); err6 == nil {
			nc, err = nc6, nil
		}
	}
	if err != nil {
		return nil, err
	}
	tc := nc.(*net.TCPConn)
	tc.SetNoDelay(true)
	return tc, nil
}

// halfCloser is a connection whose sending side can be closed alone.
type halfCloser interface {
	CloseWrite() error
}

// pipe copies host→tc (from reads the host's side) and tc→host until
// both directions end. The end of one direction is passed on as a
// half-close; a failure of either closes both.
func pipe(host net.Conn, from io.Reader, tc *net.TCPConn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(tc, from); err != nil {
			host.Close()
			tc.Close()
			return
		}
		tc.CloseWrite()
	}()
	if _, err := io.Copy(host, tc); err != nil {
		host.Close()
		tc.Close()
	} else if hc, ok := host.(halfCloser); ok {
		hc.CloseWrite()
	}
	<-done
}

// procNetTCP are the tables port.list reads; a variable for tests.
var procNetTCP = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// portList serves port.list.
func (s *server) portList() agentproto.Event {
	var ports []agentproto.PortInfo
	for _, name := range procNetTCP {
		f, err := os.Open(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6
			}
			return fail(agentproto.CodeInternal, "read %s: %v", name, err)
		}
		ps, err := listeningPorts(f)
		f.Close()
		if err != nil {
			return fail(agentproto.CodeInternal, "read %s: %v", name, err)
		}
		ports = append(ports, ps...)
	}
	slices.SortFunc(ports, func(a, b agentproto.PortInfo) int {
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		return strings.Compare(a.Address, b.Address)
	})
	ports = slices.Compact(ports)
	ev := ok()
	ev.Ports = ports
	if ev.Ports == nil {
		ev.Ports = []agentproto.PortInfo{}
	}
	return ev
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listeningPorts parses a /proc/net/tcp or tcp6 table: a header line,
// then one socket a line, "sl local_address rem_address st ...", the
// local address as hex (the IP in host byte order, 32-bit words) ":" hex port.
func listeningPorts(r io.Reader) ([]agentproto.PortInfo, error) {
	var out []agentproto.PortInfo
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != tcpListen {
			continue
		}
		hexIP, hexPort, found := strings.Cut(f[1], ":")
		if !found {
			continue
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || port == 0 {
			continue
		}
		ip, err := procIP(hexIP)
		if err != nil {
			continue
		}
		out = append(out, agentproto.PortInfo{Port: int(port), Address: ip.String()})
	}
	return out, sc.Err()
}

// procIP decodes an address of /proc/net/tcp{,6}: 4 or 16 bytes written
// as 32-bit words in host (little-endian on every architecture we run
// on) byte order.
func procIP(h string) (net.IP, error) {
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil, errors.New("bad address")
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b), nil
}
