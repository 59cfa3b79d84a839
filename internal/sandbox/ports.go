package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// ErrNoListener reports that nothing listens on a port inside the sandbox.
var ErrNoListener = errors.New("nothing listens on the port inside the sandbox")

// ErrEgressPort reports a connection asked to the port of the sandbox's
// egress proxy (runtime.ProxyPort, its agent's listener where its runtime
// proxies egress: a Pod's), which is the sandbox's own way out: only its
// code reaches it, never a preview (a stranger would reach what the
// sandbox's network policy allows, on its budget).
var ErrEgressPort = errors.New("the port is the sandbox's egress proxy, which only its own code reaches")

// portConnectTimeout bounds opening a port.connect (the agent's dial on
// the loopback included) when ctx has no earlier deadline.
const portConnectTimeout = 10 * time.Second

// DialPort opens a TCP connection to port on the sandbox's loopback,
// through its agent (the sandbox has no other interface the host could
// reach). The returned connection carries the stream's bytes; closing it
// closes the connection inside. Nothing listening is ErrNoListener, at
// once. ctx bounds only the opening. The egress proxy's port of a sandbox
// whose runtime proxies egress is ErrEgressPort, whatever listens there:
// the agent is not asked.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if port == runtime.ProxyPort && s.m.proxiesEgress() {
		return nil, fmt.Errorf("port %d: %w", port, ErrEgressPort)
	}
	s.touch()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(portConnectTimeout)
	}
	nc, ev, err := s.connect(ctx, agentproto.Request{Op: agentproto.OpPortConnect, Port: port}, deadline)
	switch {
	case err != nil:
		return nil, err
	case nc == nil && ev.Code == agentproto.CodeRefused:
		return nil, fmt.Errorf("port %d: %w", port, ErrNoListener)
	case nc == nil:
		return nil, agentError(ev)
	}
	return &activeConn{Conn: nc, s: s}, nil
}

// connect sends req, an op that turns the agent connection into a byte
// stream (port.connect, egress.accept), and returns the connection once
// the agent said connected; a Done it answered instead is returned with
// a nil connection. deadline (zero: none) bounds the wait, as ctx does.
func (s *Sandbox) connect(ctx context.Context, req agentproto.Request, deadline time.Time) (net.Conn, agentproto.Event, error) {
	nc, err := s.agent.dial(ctx)
	if err != nil {
		return nil, agentproto.Event{}, s.gone(dialErr(err))
	}
	nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	ev, err := agentproto.Connect(nc, req)
	if !stop() || err != nil || ev.Type != agentproto.EventConnected {
		nc.Close()
		switch {
		case ctx.Err() != nil:
			return nil, ev, ctx.Err()
		case err != nil:
			return nil, ev, s.gone(s.agent.ioErr(err))
		}
		return nil, ev, nil
	}
	nc.SetDeadline(time.Time{})
	return nc, ev, nil
}

// Ports lists the TCP ports listening inside the sandbox.
func (s *Sandbox) Ports(ctx context.Context) ([]agentproto.PortInfo, error) {
	var done agentproto.Event
	if err := s.do(ctx, agentproto.Request{Op: agentproto.OpPortList}, nil, nil, nil, &done); err != nil {
		return nil, err
	}
	return done.Ports, nil
}

// touch records activity (a preview connection opened), which keeps an
// idle timeout from stopping the sandbox.
func (s *Sandbox) touch() {
	s.mu.Lock()
	s.lastActive = time.Now()
	s.mu.Unlock()
}
