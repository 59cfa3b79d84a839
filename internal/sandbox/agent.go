package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// errAgentGone reports that the agent's socket no longer answers: the
// sandbox's init has exited.
var errAgentGone = errors.New("sandbox agent is gone")

// errAgentBroke reports a reply that broke the protocol (malformed, too
// large, cut off) from an agent that still answers: that call failed, the
// sandbox lives on.
var errAgentBroke = errors.New("the sandbox's agent broke off its reply")

// Deadlines of host→agent calls. A call that streams (an execution, a
// process's output, a watch) may be silent for long: an execution is
// bounded by its own timeout plus agentGrace, the others by the
// sandbox's lifetime (destroying a sandbox closes every connection to
// it). Every other call must make progress, each read and write within
// agentIdle, or it fails.
var (
	agentIdle = 60 * time.Second
	// probeTimeout bounds the ping that tells a dead agent from one
	// that broke one reply.
	probeTimeout = 2 * time.Second
)

// agentClient talks to one sandbox's agent: one connection per request.
type agentClient struct {
	// dial connects to the agent: its unix socket, or its TLS listener
	// in a Pod (runtime.Instance.Dial).
	dial func(ctx context.Context) (net.Conn, error)
	// conns are the connections dial opened and not yet closed.
	conns *connSet
	// observe, when set, is told each call's operation and duration.
	observe func(op string, d time.Duration)
	// log, when set, is told of connections slower than slowDial to
	// make: a call waits on them before the agent sees it.
	log      *slog.Logger
	slowDial time.Duration
}

// slowDial is how long connecting to an agent may take before it is
// logged: a local socket connects at once, a Pod's agent in
// milliseconds (through the API server's port-forward, tens of them).
const slowDial = time.Second

// callOptions say how one call reads its reply.
type callOptions struct {
	// idle, when not zero, bounds each read and write of the call.
	idle time.Duration
	// trace, when set, is told when the connection is open.
	trace *ExecTrace
}

// call sends req (and body, if set, as data frames) and reads the reply
// until Done through agentproto.Call, passing the other frames to h. A
// Done that reports a failure becomes an *apierr.Error.
func (c *agentClient) call(ctx context.Context, req agentproto.Request, body io.Reader,
	h agentproto.Handlers, opt callOptions) (agentproto.Event, error) {
	if c.observe != nil {
		start := time.Now()
		defer func() { c.observe(req.Op, time.Since(start)) }()
	}
	dialStart := time.Now()
	nc, err := c.dial(ctx)
	if d := time.Since(dialStart); d > c.slowDial && c.log != nil {
		c.log.Warn("slow agent connection", "op", req.Op, "took", d, "err", err)
	}
	if err != nil {
		return agentproto.Event{}, dialErr(err)
	}
	if opt.trace != nil {
		opt.trace.Dialed = time.Now()
	}
	dc := &deadlineConn{Conn: nc, idle: opt.idle}
	defer dc.Close()
	// Cancelling ctx unblocks every read and write below.
	stop := context.AfterFunc(ctx, dc.cancel)
	defer stop()

	done, err := agentproto.Call(dc, req, body, h)
	if err != nil {
		if ctx.Err() != nil {
			return agentproto.Event{}, ctx.Err()
		}
		if errors.Is(err, agentproto.ErrRequestTooLarge) {
			// The caller's own request (code, a command line, a path) is
			// over the protocol's frame size.
			return agentproto.Event{}, apierr.Wrap(err, apierr.BadRequest, "the request is too large: code, command lines, paths and environments may hold at most %d MiB together", agentproto.MaxFrame>>20)
		}
		var be *agentproto.BodyError
		if errors.As(err, &be) {
			// The caller's body failed (e.g. an upload over the server's
			// limit): the connection is dropped, and with it the agent's
			// partial file.
			return agentproto.Event{}, be.Err
		}
		return agentproto.Event{}, c.ioErr(err)
	}
	if done.Code != "" {
		return done, agentError(done)
	}
	return done, nil
}

// newAgentClient returns the client of the agent of inst. Every
// connection it opens is tracked, so that closeAll can end them when the
// sandbox is destroyed: a Pod's network namespace goes away without a
// reset reaching the server, and a stream would hang until its timeout.
func newAgentClient(inst *runtime.Instance, observe func(op string, d time.Duration), log *slog.Logger) agentClient {
	dial := inst.Dial
	if dial == nil {
		sock := inst.Socket
		dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	}
	cs := &connSet{conns: map[*trackedConn]struct{}{}}
	return agentClient{dial: cs.tracking(dial), conns: cs, observe: observe, log: log, slowDial: slowDial}
}

// connSet holds an agent client's open connections.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// tracking wraps dial: each connection joins the set until it closes, and
// once the set is closed no dial succeeds (the agent is gone).
func (cs *connSet) tracking(dial func(context.Context) (net.Conn, error)) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		cs.mu.Lock()
		closed := cs.closed
		cs.mu.Unlock()
		if closed {
			return nil, errAgentGone
		}
		nc, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: nc, set: cs}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.closed {
			nc.Close()
			return nil, errAgentGone
		}
		cs.conns[tc] = struct{}{}
		return tc, nil
	}
}

// closeAll closes every open connection and refuses new ones.
func (cs *connSet) closeAll() {
	if cs == nil {
		return
	}
	cs.mu.Lock()
	cs.closed = true
	conns := cs.conns
	cs.conns = nil
	cs.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

// trackedConn leaves its set when closed.
type trackedConn struct {
	net.Conn
	set *connSet
}

// CloseWrite half-closes the connection where it can (a unix or TLS
// connection): egress and port streams pass an end of stream on.
func (c *trackedConn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.conns, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

// dialErr classifies a failed dial of the agent: refused, missing or
// unreachable means the agent is gone.
func dialErr(err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return errAgentGone
	}
	return fmt.Errorf("dial agent: %w", err)
}

// ioErr classifies a failed call. A connection cut off or a reply that
// breaks the protocol means a dead agent only if the agent no longer
// answers a ping: a live agent that broke one reply (a hostile or buggy
// one) fails that call alone, and its sandbox lives on.
func (c *agentClient) ioErr(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, agentproto.ErrBadFrame), errors.Is(err, agentproto.ErrFrameTooLarge),
		errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed): // closed by closeAll: the sandbox was destroyed
	case errors.As(err, &ne) && ne.Timeout():
		return apierr.Wrap(err, apierr.SandboxTimeout, "the sandbox's agent did not answer in time")
	default:
		return err // a handler's own error, passed through
	}
	if !c.alive() {
		return fmt.Errorf("%w: %w", errAgentGone, err)
	}
	return apierr.Wrap(fmt.Errorf("%w: %w", errAgentBroke, err), apierr.Internal, "%s", errAgentBroke.Error())
}

// alive reports whether the agent answers a ping.
func (c *agentClient) alive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	nc, err := c.dial(ctx)
	if err != nil {
		return false
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(probeTimeout))
	done, err := agentproto.Call(nc, agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{})
	return err == nil && done.Agent != nil
}

// deadlineConn gives each read and write of a call its own deadline (when
// idle is set) and lets cancel end them all for good.
type deadlineConn struct {
	net.Conn
	idle time.Duration

	// mu guards cancelled, so that a deadline set for a read never
	// undoes a cancellation.
	mu        sync.Mutex
	cancelled bool
}

func (c *deadlineConn) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelled = true
	c.Conn.SetDeadline(time.Unix(1, 0))
}

func (c *deadlineConn) arm(set func(time.Time) error) {
	if c.idle <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cancelled {
		set(time.Now().Add(c.idle))
	}
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	c.arm(c.Conn.SetReadDeadline)
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	c.arm(c.Conn.SetWriteDeadline)
	return c.Conn.Write(p)
}

// agentError turns a failed Done into a coded error. The agent's message
// is shown to the caller: it speaks only of the caller's own sandbox.
func agentError(ev agentproto.Event) error {
	code := apierr.Internal
	switch ev.Code {
	case agentproto.CodeBadRequest, agentproto.CodeNotDir, agentproto.CodeIsDir:
		code = apierr.BadRequest
	case agentproto.CodeNotFound:
		code = apierr.NotFound
	case agentproto.CodeExists:
		code = apierr.Conflict
	case agentproto.CodePermission:
		code = apierr.PathNotAllowed
	case agentproto.CodeTooLarge:
		code = apierr.FileTooLarge
	case agentproto.CodeNoSpace:
		code = apierr.DiskFull
	case agentproto.CodeUnsupported:
		code = apierr.UnsupportedLanguage
	}
	msg := ev.Message
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	if msg == "" {
		msg = ev.Code
	}
	return apierr.New(code, "%s", msg)
}
