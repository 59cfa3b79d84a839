package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// Flows. A flow is one TCP connection the gateway carries for its
// sandbox, from the decision to dial until either end is done. The
// gateway keeps every open flow, so that it can bound how many a sandbox
// holds (Options.MaxFlows), close those on which nothing moved for
// Options.IdleTimeout, count and rate the bytes they carry
// (Options.Rate), and judge each again when the policy changes: SetPolicy
// closes the flows the new policy refuses.
//
// What a flow claims is judged as it is read (carry): the first bytes
// must be a TLS ClientHello or an HTTP/1 request (http.go), and where a
// name is required (allowlist mode, a destination allowed by a name rule
// rather than an address rule) the SNI, or the names of every request,
// must be allowed. A claim and SetPolicy's review of the flow hold the
// flow's lock, so that no claim judged under the old policy escapes the
// review.

// flowState is what a flow has shown of itself.
type flowState uint8

const (
	flowSniffing flowState = iota // its first bytes not yet judged
	flowTLS                       // a TLS ClientHello: names holds its SNI, if any
	flowHTTP                      // plain HTTP/1: names are those of its latest request
	flowUpgraded                  // opaque after a 101 or a CONNECT's 2xx: names are that request's
	flowOpaque                    // neither TLS nor HTTP/1: no names
)

// flow is one connection the gateway carries.
type flow struct {
	g      *Gateway
	dst    netip.AddrPort // what the sandbox dialled
	target string         // how logs and events name it
	ctx    context.Context
	cancel context.CancelFunc
	last   atomic.Int64 // when a byte last moved either way (Gateway.now)

	// mu guards state, names, ex and unfollowed.
	mu         sync.Mutex
	state      flowState
	names      []string
	ex         *exchange // the HTTP exchange whose answers are followed
	unfollowed bool      // the answers went on unfollowed (the server spoke first)

	// reply is what the sandbox is answered when carry refused a request
	// for a secret's sake (inject.go), once the answers to the requests
	// before it went back.
	reply atomic.Pointer[reply]
	// mute stops the answers going on to the sandbox: set once the
	// answers to the requests before a refused one went back, so that
	// nothing the outside says to the refused one reaches it.
	mute atomic.Bool

	// For a flow whose TLS the gateway terminates (tls.go): the outside
	// end, the end of the answers splice follows before the flow is
	// judged, and whether the outside spoke before the sandbox. takeover
	// (under mu) says the outside end was taken from those answers.
	up        net.Conn
	answering chan struct{}
	spoke     atomic.Bool
	takeover  bool
	sni       string // the name whose TLS the gateway terminated, set before its requests are read
}

// replyWait bounds how long a refusal's answer waits for the answers to
// the requests before it.
const replyWait = 10 * time.Second

// reply is a refusal's answer, given when outstanding requests (those
// forwarded whose answer did not go back whole) are all that are.
type reply struct {
	text        []byte
	outstanding int64
}

// refusal says why connect refused a connection, with the HTTP status a
// proxied sandbox is answered.
type refusal struct {
	status int
	msg    string
}

// connect decides a connection the sandbox asked for to dst (named
// target in logs; reported as decided), registers its flow (MaxFlows),
// counts it (network_requests) and dials it: the flow and its outside
// end, or why not.
func (g *Gateway) connect(dst netip.AddrPort, target, decided string) (*flow, net.Conn, *refusal) {
	g.seen.syns.Add(1)
	t, d, _ := g.decide(dst, decided)
	if !d.ok {
		g.seen.refused.Add(1)
		return nil, nil, &refusal{http.StatusForbidden, d.rule}
	}
	if g.testHookDecided != nil {
		g.testHookDecided()
	}
	f, ok := g.openFlow(dst, target)
	if !ok {
		g.seen.refused.Add(1)
		return nil, nil, &refusal{http.StatusTooManyRequests, fmt.Sprintf("too many connections open at once (%d)", g.opt.MaxFlows)}
	}
	// A policy changed since the decision reviewed the open flows
	// without this one: judge it again under the policy now in force.
	if rule, refused := f.refusedBy(g.pol.Load()); refused {
		f.end()
		g.seen.refused.Add(1)
		g.report(deny(events.KindNetworkDenied, "policy changed: "+rule), "tcp", decided)
		return nil, nil, &refusal{http.StatusForbidden, rule}
	}
	if !g.countRequest(target) {
		f.end()
		g.seen.refused.Add(1)
		return nil, nil, &refusal{http.StatusTooManyRequests, "resource_limits.network_requests reached"}
	}
	up, err := g.dial(f.ctx, t)
	if err != nil {
		f.end()
		g.seen.dialFailed.Add(1)
		g.log.Info("egress dial failed", "target", target, "err", err)
		return nil, nil, &refusal{http.StatusBadGateway, "the destination did not answer"}
	}
	return f, up, nil
}

// now is the gateway's monotonic clock, for flows' activity.
func (g *Gateway) now() int64 { return int64(time.Since(g.started)) }

// openFlow registers a new flow to dst, or refuses it past MaxFlows
// (a resource_exceeded event, network_flows).
func (g *Gateway) openFlow(dst netip.AddrPort, target string) (*flow, bool) {
	g.fmu.Lock()
	if g.opt.MaxFlows > 0 && len(g.flows) >= g.opt.MaxFlows {
		n := len(g.flows)
		g.fmu.Unlock()
		g.seen.overCap.Add(1)
		g.log.Info("egress denied", "target", target, "rule", "max flows", "limit", g.opt.MaxFlows)
		if !g.repeated("flows\x00") {
			g.opt.Events.Emit(events.Event{
				Type: events.ResourceExceeded, SandboxID: g.id,
				Details: map[string]any{"resource": events.ResourceNetworkFlows, "limit": g.opt.MaxFlows,
					"observed": n + 1, "target": target},
			})
		}
		return nil, false
	}
	f := &flow{g: g, dst: dst, target: target}
	f.ctx, f.cancel = context.WithCancel(g.ctx)
	f.last.Store(g.now())
	g.flows[f] = struct{}{}
	g.fmu.Unlock()
	g.reaper.Do(func() {
		if g.opt.IdleTimeout > 0 {
			go g.reapIdle()
		}
	})
	return f, true
}

// end closes the flow and forgets it.
func (f *flow) end() {
	f.cancel()
	f.g.fmu.Lock()
	delete(f.g.flows, f)
	f.g.fmu.Unlock()
}

// Flows returns how many connections the sandbox has open through the
// gateway.
func (g *Gateway) Flows() int {
	g.fmu.Lock()
	defer g.fmu.Unlock()
	return len(g.flows)
}

// openFlows returns the open flows.
func (g *Gateway) openFlows() []*flow {
	g.fmu.Lock()
	defer g.fmu.Unlock()
	out := make([]*flow, 0, len(g.flows))
	for f := range g.flows {
		out = append(out, f)
	}
	return out
}

// reapIdle closes flows idle past IdleTimeout until the gateway closes.
func (g *Gateway) reapIdle() {
	every := min(max(g.opt.IdleTimeout/4, 5*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		cut := g.now() - int64(g.opt.IdleTimeout)
		for _, f := range g.openFlows() {
			if f.last.Load() <= cut {
				g.seen.idleClosed.Add(1)
				g.log.Info("egress flow closed", "target", f.target, "rule", "idle timeout", "idle_timeout", g.opt.IdleTimeout)
				f.cancel()
			}
		}
	}
}

// review closes the open flows pol refuses.
func (g *Gateway) review(pol *policy.Egress) {
	for _, f := range g.openFlows() {
		if rule, refused := f.refusedBy(pol); refused {
			g.seen.policyClosed.Add(1)
			g.log.Info("egress flow closed", "target", f.target, "rule", "policy changed: "+rule)
			f.cancel()
		}
	}
}

// namesRequired reports whether a flow to a under pol must claim allowed
// names: in allowlist mode, unless an address rule covers a.
func namesRequired(pol *policy.Egress, a netip.Addr) bool {
	if pol.Mode != policy.NetworkAllowlist {
		return false
	}
	_, byAddr := pol.AllowAddrRule(a)
	return !byAddr
}

// refusedBy judges the flow again under pol, as a new connection that
// claimed what it claimed so far would be judged.
func (f *flow) refusedBy(pol *policy.Egress) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, _ := f.g.checkConn(pol, f.dst); !d.ok {
		return d.rule, true
	}
	if !namesRequired(pol, f.dst.Addr()) || f.state == flowSniffing {
		return "", false
	}
	if len(f.names) == 0 {
		return "no name claimed (a TLS ClientHello with SNI or HTTP/1 requests with Host)", true
	}
	for _, n := range f.names {
		if d := f.g.checkName(pol, n, f.dst.Port()); !d.ok {
			return fmt.Sprintf("name %q: %s", n, d.rule), true
		}
	}
	return "", false
}

// claim judges what the flow shows of itself (state, and the names it
// claims) under the policy in force, reports the decision, and records
// it. why says what is wrong when it claims no name.
func (f *flow) claim(proto string, state flowState, names []string, why string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.g
	pol := g.pol.Load()
	if !pol.Enabled() {
		g.report(deny(events.KindNetworkDenied, "mode none"), proto, f.target)
		return false
	}
	if namesRequired(pol, f.dst.Addr()) {
		if len(names) == 0 {
			g.report(deny(events.KindNetworkDenied, why+": a destination allowed by name must claim it"), proto, f.target)
			return false
		}
		for _, n := range names {
			d := g.checkName(pol, n, f.dst.Port())
			if !d.ok {
				d.rule = fmt.Sprintf("%s name %q: %s", proto, n, d.rule)
			}
			g.report(d, proto, n+" at "+f.target)
			if !d.ok {
				return false
			}
		}
	}
	f.state, f.names = state, names
	return true
}

// splice carries the flow both ways until both ends are done or the flow
// is closed (by the policy, idleness or the gateway), then forgets it.
func (f *flow) splice(in HalfConn, up net.Conn) {
	stop := context.AfterFunc(f.ctx, func() { in.Close(); up.Close() })
	defer stop()
	defer f.end()
	defer in.Close()
	defer up.Close()
	out := meteredConn{Conn: up, f: f}
	done := make(chan struct{})
	f.mu.Lock()
	f.up, f.answering = up, done
	f.mu.Unlock()
	go func() {
		defer close(done)
		f.answers(in, out)
		f.mu.Lock()
		taken := f.takeover
		f.mu.Unlock()
		if f.reply.Load() == nil && !taken {
			_ = in.CloseWrite()
		}
	}()
	if f.carry(in, out) {
		if hc, ok := up.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		select {
		case <-done:
		case <-f.ctx.Done():
		}
		return
	}
	f.replyAfter(done, in, func() { up.Close() })
}

// replyAfter answers the sandbox on w why carry refused a request, if it
// did for a secret's sake: once the answers to the requests before it
// went back (done closes when the answers end), the outside end closed
// (closeUp).
func (f *flow) replyAfter(done <-chan struct{}, w net.Conn, closeUp func()) {
	f.mu.Lock()
	ex := f.ex
	f.mu.Unlock()
	r := f.reply.Load()
	if r == nil || ex == nil {
		return
	}
	defer f.reply.Store(nil)
	wait := time.NewTimer(replyWait)
	defer wait.Stop()
answers:
	for ex.forwarded.Load()-ex.answered.Load() > r.outstanding {
		select {
		case <-ex.answer:
		case <-done:
			break answers
		case <-wait.C:
			break answers
		case <-f.ctx.Done():
			return
		}
	}
	f.mute.Store(true)
	closeUp()
	select {
	case <-done:
	case <-f.ctx.Done():
		return
	}
	if ex.forwarded.Load()-ex.answered.Load() == r.outstanding {
		_ = w.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = w.Write(r.text)
	}
}

// answers carries what the outside sends to the sandbox. On a plain HTTP
// flow it follows the answers (exchange.answers) as they go by.
func (f *flow) answers(in io.Writer, up io.Reader) {
	br := bufio.NewReaderSize(&teeReader{r: up, w: in, mute: &f.mute}, 32<<10)
	if _, err := br.Peek(1); err != nil {
		return
	}
	f.spoke.Store(true)
	f.mu.Lock()
	ex := f.ex
	f.unfollowed = ex == nil
	f.mu.Unlock()
	if ex != nil {
		ex.answers(br)
	}
	// What br holds went on through the tee already; the rest goes
	// straight across.
	if f.mute.Load() {
		return
	}
	_, _ = io.CopyBuffer(in, up, make([]byte, 32<<10))
}

// follow hands the exchange to answers; if the outside spoke before any
// request, its answers are not followed.
func (f *flow) follow(ex *exchange) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unfollowed {
		ex.stop()
		return
	}
	f.ex = ex
}

// teeReader forwards every byte it reads from r to w, until mute.
type teeReader struct {
	r    io.Reader
	w    io.Writer
	mute *atomic.Bool
}

// errMuted ends the answers of a flow whose request was refused.
var errMuted = errors.New("answers muted after a refusal")

func (t *teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if t.mute != nil && t.mute.Load() {
		return 0, errMuted
	}
	if n > 0 {
		if _, werr := t.w.Write(p[:n]); werr != nil {
			return n, werr
		}
	}
	return n, err
}

// carry forwards what the sandbox sends, judging it on the way; false
// means the flow was refused and is to be closed at once.
func (f *flow) carry(in net.Conn, up net.Conn) bool {
	g := f.g
	proto, name, read, err := sniff(in, sniffTimeout)
	switch {
	case proto == "" && len(read) == 0:
		return true // ended before a byte: the outside may still speak
	case proto == "" && errors.Is(err, io.EOF):
		// Ended before it could be told: it is no request.
		if !f.claim(protoOther, flowOpaque, nil, "a stream that ended before it could be told") {
			return false
		}
	case proto == "":
		g.report(deny(events.KindNetworkDenied, "unreadable first message: "+err.Error()), protoOther, f.target)
		return false
	case proto == protoHTTP:
		return f.carryHTTP(bufio.NewReaderSize(io.MultiReader(bytes.NewReader(read), in), 16<<10), up)
	case proto == protoTLS:
		var names []string
		why := "TLS without SNI"
		switch {
		case err != nil:
			why = "unreadable TLS ClientHello (" + err.Error() + ")"
		case name != "":
			names = []string{name}
		}
		if !f.claim(protoTLS, flowTLS, names, why) {
			return false
		}
		if err == nil && g.interceptRule(g.pol.Load(), f.dst.Addr(), name) != nil {
			return f.terminate(in, up, read, name)
		}
	default:
		if !f.claim(protoOther, flowOpaque, nil, "neither a TLS ClientHello nor an HTTP/1 request") {
			return false
		}
	}
	if _, err := up.Write(read); err != nil {
		return false
	}
	_, _ = io.Copy(up, in)
	return true
}

// carryHTTP carries plain HTTP/1 requests read from r to up, judging
// each (and, under rules per destination, injecting and scanning it);
// false means a request was refused.
func (f *flow) carryHTTP(r *bufio.Reader, up io.Writer) bool {
	g := f.g
	ex := newExchange()
	f.follow(ex)
	first := true
	var inBody bool // the refusal came from a request's body
	err := ex.requests(r, up,
		func(req *http.Request, names []string, head []byte) ([]byte, func(string) error, error) {
			if !f.claim(protoHTTP, flowHTTP, names, "an HTTP request without Host") {
				return nil, nil, errRefused
			}
			if !first && !g.countRequest(f.target) {
				return nil, nil, errRefused
			}
			first = false
			pol := g.pol.Load()
			if !pol.Injects() {
				return head, nil, nil
			}
			out, err := f.inject(pol, req, names, head)
			if err != nil {
				return nil, nil, err
			}
			host, _ := policy.NormalizeName(firstOr(names))
			in := injection{host: host, method: req.Method, path: req.URL.EscapedPath()}
			return out, func(name string) error {
				inBody = true
				return f.misdirected(in, name, "the body")
			}, nil
		},
		func() { f.setState(flowUpgraded) })
	var bad *malformedError
	var se *secretError
	switch {
	case errors.As(err, &se):
		r := &reply{text: se.answer()}
		if inBody {
			r.outstanding = 1
		}
		f.reply.Store(r)
	case errors.As(err, &bad) || errors.Is(err, errUnfollowed):
		g.report(deny(events.KindNetworkDenied, "http: "+err.Error()), protoHTTP, f.target)
	}
	return err == nil
}

// firstOr is names[0], or "".
func firstOr(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[0]
}

// setState records what the flow became.
func (f *flow) setState(s flowState) {
	f.mu.Lock()
	f.state = s
	f.mu.Unlock()
}

// meteredConn is a flow's outside end: it counts the bytes each way,
// notes the flow's activity, and holds each way to the gateway's rate.
type meteredConn struct {
	net.Conn
	f *flow
}

func (c meteredConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		g := c.f.g
		g.bytesIn.Add(int64(n))
		c.f.last.Store(g.now())
		if werr := wait(c.f.ctx, g.inRate, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

func (c meteredConn) Write(p []byte) (int, error) {
	g := c.f.g
	done := 0
	for done < len(p) {
		chunk := p[done:]
		if g.outRate != nil {
			chunk = chunk[:min(len(chunk), g.outRate.Burst())]
			if err := wait(c.f.ctx, g.outRate, len(chunk)); err != nil {
				return done, err
			}
		}
		n, err := c.Conn.Write(chunk)
		done += n
		g.bytesOut.Add(int64(n))
		c.f.last.Store(g.now())
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// wait takes n tokens from l (nil: no limit), in pieces of at most its
// burst.
func wait(ctx context.Context, l *rate.Limiter, n int) error {
	if l == nil {
		return nil
	}
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// flowSummary is the flows' part of Diagnose.
func (g *Gateway) flowSummary() string {
	c := &g.seen
	return fmt.Sprintf("flows: %d open, %d refused over %d, %d closed idle, %d closed by a policy change; bytes: %d in, %d out",
		g.Flows(), c.overCap.Load(), g.opt.MaxFlows, c.idleClosed.Load(), c.policyClosed.Load(), g.bytesIn.Load(), g.bytesOut.Load())
}
