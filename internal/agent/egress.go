package agent

import (
	"errors"
	"net"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/backoff"
)

// Egress through the agent. A sandbox whose runtime gives it no network
// interface of the host's (a Pod, whose NetworkPolicy denies all egress)
// may still reach the network its policy allows, through the server's
// gateway: the agent listens on a loopback port inside the sandbox
// (Config.Egress), which the sandbox's HTTP_PROXY and HTTPS_PROXY name,
// and the server fetches each connection made to it with egress.accept
// over its own connection to the agent, then hands it to the sandbox's
// gateway (internal/egress, proxy_linux.go), which decides it as it decides
// any flow. No packet of the sandbox leaves but through the server.

// egressAccepts hands the connections accepted on the egress listener to
// egress.accept requests. It runs until the listener closes.
func (s *server) egressAccepts() {
	retry := backoff.Backoff{Base: 10 * time.Millisecond, Max: time.Second}
	for {
		nc, err := s.cfg.Egress.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("egress accept", "err", err)
			retry.Wait(s.ctx)
			continue
		}
		retry.Reset()
		select {
		case s.egress <- nc:
		case <-s.ctx.Done():
			nc.Close()
			return
		}
	}
}

// egressAccept serves egress.accept: it waits for the next connection
// made to the egress listener, sends the connected event, and then pipes
// bytes between it and the host's connection, as port.connect does. A
// waiting request is not activity (the idle stop does not count it); a
// connection being carried is.
func (s *server) egressAccept(c *conn) agentproto.Event {
	if s.cfg.Egress == nil {
		return fail(agentproto.CodeUnsupported, "this sandbox has no egress listener")
	}
	ctx, cancel := s.requestContext(c)
	defer cancel()
	var nc net.Conn
	s.egressWaiting.Add(1)
	select {
	case nc = <-s.egress:
	case <-ctx.Done():
	}
	s.egressWaiting.Add(-1)
	if nc == nil {
		return agentproto.Event{}
	}
	defer nc.Close()
	// The hang-up watcher reads the host's connection: stop it before
	// the host may send anything (it sends only once connected).
	c.nc.SetReadDeadline(time.Unix(1, 0))
	<-c.watchDone
	s.busy.Add(1)
	defer func() {
		s.lastDone.Store(time.Now().UnixNano())
		s.busy.Add(-1)
	}()
	connected(c, nc.(*net.TCPConn))
	return agentproto.Event{}
}
