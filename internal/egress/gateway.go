// Package egress is the network gateway of sandboxes whose policy allows
// a network. Each such sandbox gets a TUN device in its own network
// namespace (put there before any of its code runs) and nothing else: no
// interface into the host's network, no host firewall rule. The host end
// of the TUN is a userspace TCP/IP stack (gvisor.dev/gvisor/pkg/tcpip),
// one per sandbox, which terminates every flow; the Gateway decides each
// one with internal/policy and dials out only what is allowed.
//
//   - DNS is answered by the gateway itself at ResolverAddr: names the
//     policy does not allow get NXDOMAIN (and a dns_denied event), names
//     that look like DNS tunnelling are refused, only A records are
//     answered (AAAA is empty: the sandbox has no IPv6 route), and what
//     an allowed name resolved to is remembered for this sandbox.
//   - A TCP connection is allowed, in allowlist mode, only to an address
//     an allowed name resolved to in this sandbox, at a port that name's
//     rule allows, or to a listed address or CIDR; in public mode to any
//     public address. In every mode the forbidden ranges of
//     policy.ForbiddenAddr, the host's own addresses and the server's
//     listeners (Options.Self) are refused after resolution, so a name
//     rebound to 127.0.0.1 or 169.254.169.254 gains nothing. The gateway
//     dials the very address it checked.
//   - Every connection is a flow (flow.go). Its first bytes tell what it
//     is: a TLS ClientHello, an HTTP/1 request (read loosely to tell,
//     whatever the method's spelling), or other. A plain HTTP/1 flow is
//     read request by request, strictly (http.go), in every mode. In
//     allowlist mode a connection allowed by name (not by an address
//     rule) must claim allowed names at its port: the SNI of its
//     ClientHello (none is refused), the names of every HTTP request
//     (its Host, and an absolute or CONNECT target); other protocols
//     are refused there. A request carrying Upgrade (or a CONNECT) waits
//     for its answer: a 101 (a 2xx) makes the flow opaque, any other
//     answer leaves it HTTP, the next request judged.
//   - UDP other than DNS is refused (ICMP port unreachable) and reported.
//   - Every connection, and every plain HTTP request after a
//     connection's first, counts against resource_limits.network_requests;
//     past the limit connections are refused with a resource_exceeded
//     event. Every decision is logged with the rule that made it.
//   - A sandbox holds at most Options.MaxFlows connections at once, each
//     closed after Options.IdleTimeout without a byte either way; the
//     bytes each way are counted (Bytes) and held to Options.Rate.
//   - SetPolicy judges the open flows again and closes those the new
//     policy refuses.
//   - A policy's rules per destination put the account's secrets into
//     the plain HTTP requests they match, and refuse a secret's
//     placeholder anywhere else (inject.go); for their hosts' HTTPS flows
//     the gateway terminates TLS with the server's CA (tls.go).
//
// # In detail
//
// A sandbox whose policy has `network.mode` `allowlist` or `public` gets one
// interface, `eth0` (10.255.255.2, peer and default route 10.255.255.1, MTU
// 65520), and nothing else; with mode `none` (the default) nothing changes:
// only `lo`, created in one `runc run`, connections fail at once with
// ENETUNREACH. For a networked sandbox internal/runtime/oci runs `runc
// create`, calls `runtime.Spec.Network.Attach` with the init's pid, then
// `runc start`, so no code runs before the interface exists (for a gVisor
// sandbox it makes the namespace first and calls `AttachNetns` with it
// before runsc starts, whose Sentry takes the device for its own stack;
// the device's address then has no peer). Attach
// (internal/egress) enters the sandbox's network namespace on a locked
// thread that never returns to the host's, opens `/dev/net/tun`, configures
// it with netlink and keeps the fd; the sandbox has no CAP_NET_ADMIN to
// change it. The host end is a userspace TCP/IP stack (gvisor's tcpip), one
// per sandbox, that terminates every flow; the sandbox never has an
// interface into the host's network and the host firewall is untouched.
// The stack keeps no TIME_WAIT: when the outside closes first its end
// would hold the 4-tuple for 60 s while the sandbox's kernel, which holds
// nothing, picks the same source port again, and a forwarder (not a
// listener) never reuses a TIME_WAIT endpoint for a new SYN: that SYN was
// dropped silently and the sandbox's connect timed out
// (`TestEgressPortReuse`; on this point-to-point link no old segment can
// arrive late).
// `/etc/resolv.conf` is bind-mounted read-only and names the gateway.
//
// The gateway decides with the pure functions of internal/policy/egress.go:
//   - DNS (UDP and TCP at 10.255.255.1:53) is answered by the gateway: names
//     outside the allowlist get NXDOMAIN (`dns_denied`), tunnelling-shaped
//     names (a label over 40 characters, a name over 100, over 10 labels, over
//     64 distinct names under one zone) are REFUSED and reported; only A
//     records are answered (no IPv6: the sandbox has no IPv6 route, AAAA is
//     empty); answers that are forbidden destinations are dropped (rebinding)
//     and the rest remembered per sandbox.
//   - TCP: allowlist mode allows an address only if an allowed name resolved
//     to it in this sandbox (at a port the name's rule allows) or a listed
//     address/CIDR covers it; public mode any public address. In every mode
//     loopback, private, link-local, every cloud metadata address (Azure's
//     public 168.63.129.16 too), CGNAT, multicast, reserved,
//     IPv4-mapped/NAT64/6to4 addresses, the host's own addresses and the
//     server's listeners are refused, and the gateway dials exactly the
//     address it checked.
//   - Every TCP connection is a flow (egress/flow.go), registered from the
//     decision to dial until both ends are done. Its first bytes tell what
//     it is (egress/sniff.go): a TLS ClientHello (parsed by crypto/tls from
//     the recorded bytes), an HTTP/1 request (a first line of a token, a
//     space, ..., a last word "HTTP/": any method, any case), or other. A
//     plain HTTP flow is followed both ways in every mode (egress/http.go):
//     each request's header block is read whole, strictly (CRLF only, token
//     header names, no folding, no control bytes, one Host, never both
//     Content-Length and Transfer-Encoding; anything else closes the flow)
//     and judged before any of it goes on, bodies carried by their framing;
//     the answers are read as they are forwarded, only to learn whether an
//     Upgrade (101) or a CONNECT (2xx) switched the connection: a request
//     that could switch it waits for its answer, and the flow becomes opaque
//     only if it did. In allowlist mode a flow allowed by name (not by an
//     address rule) must claim allowed names at its port: its SNI (a
//     ClientHello without one is refused) or the names of every request (the
//     Host, and an absolute or CONNECT target); other protocols are refused.
//     Each flow records what it claimed last, under a lock that a policy
//     change also takes: `Gateway.SetPolicy` judges every open flow again
//     and closes those the new policy refuses.
//   - A sandbox holds at most `MaxFlows` flows (128; past it
//     `resource_exceeded`, resource `network_flows`); a flow on which no
//     byte moved for `IdleTimeout` (5 min) is closed by a reaper goroutine
//     per gateway; bytes each way are counted and held to `Rate` (25 MiB/s
//     each way, one token bucket per direction per sandbox,
//     golang.org/x/time/rate); `serve --egress-max-flows`,
//     `--egress-idle-timeout`, `--egress-rate` set them (0: none). The
//     metering loop reads the gateway's requests and bytes with each sample
//     (`usage_hours.egress_bytes_in`, `egress_bytes_out`, migration 0012).
//   - UDP other than DNS is refused (ICMP port unreachable, `network_denied`).
//   - Each connection, and each plain HTTP request after a connection's
//     first, counts against `resource_limits.network_requests`; past it,
//     `resource_exceeded` (resource `network_requests`). A policy change
//     (`Sandbox.SetPolicy`) reaches the gateway at once and closes the open
//     flows it refuses; a sandbox created without a network cannot gain one.
//
// Every decision is logged with its rule; denials emit `security_violation`
// events (kind, target, rule; identical ones at most every 2 s). Tests never
// leave the machine: `egress.Options.Test` (Go only, never from the API)
// maps names to addresses and addresses to loopback servers, after the
// policy has judged the addresses the sandbox sees. The E2B surface maps
// `network.allowOut` to an allowlist and `allow_internet_access: true` to
// mode public (internal/e2b/control.go, `networkOf`).
//
// The package imports internal/policy, internal/events and
// internal/ratelimit (its log's cap, logcap.go), never the engine.
package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// Addresses inside every networked sandbox. The sandbox's TUN has
// SandboxAddr with GatewayAddr as its peer and the default route; the
// gateway answers DNS at GatewayAddr:53 (ResolverAddr).
var (
	GatewayAddr = netip.MustParseAddr("10.255.255.1")
	SandboxAddr = netip.MustParseAddr("10.255.255.2")
)

// TUNName is the sandbox's network interface.
const TUNName = "eth0"

// MTU of the TUN device. A large MTU means fewer packets through the
// userspace stack.
const MTU = 65520

// ResolvConf is the sandbox's /etc/resolv.conf.
var ResolvConf = "nameserver " + GatewayAddr.String() + "\noptions edns0 single-request\n"

// Options are shared by every sandbox's gateway.
type Options struct {
	// Events receives security_violation and resource_exceeded events.
	Events events.Sink
	// Logger receives one line per decision.
	Logger *slog.Logger
	// Self are the server's own listeners: refused in every mode, also
	// as a test route's target (the host's interface addresses are
	// refused too, all ports).
	Self []netip.AddrPort
	// DialTimeout bounds one outgoing connection [10s].
	DialTimeout time.Duration
	// MaxFlows bounds the connections one sandbox has open through the
	// gateway at once; past it new ones are refused with a
	// resource_exceeded (network_flows) event [DefaultMaxFlows; negative:
	// none].
	MaxFlows int
	// IdleTimeout closes a connection on which no byte moved either way
	// for so long [DefaultIdleTimeout; negative: never].
	IdleTimeout time.Duration
	// Rate bounds one sandbox's bytes a second through the gateway, each
	// way, over all its connections [DefaultRate; negative: none].
	Rate int64
	// Secrets resolves the secrets the policy's rules per destination
	// inject and records their uses (inject.go); nil: a rule's request
	// fails closed.
	Secrets Secrets
	// Identity mints the tokens that the rules' ${identity.token}
	// placeholders become (inject.go); nil: a rule's request that would
	// carry one fails closed.
	Identity Identity
	// Intercept terminates TLS for the hosts the policy's rules name, so
	// that their requests can be rewritten (tls.go); nil: TLS is never
	// decrypted.
	Intercept *Intercept
	// Test replaces the outside world: for tests and the benchmark only,
	// never set from configuration or the API.
	Test *TestNet
}

// Defaults of Options.
const (
	DefaultMaxFlows    = 128
	DefaultIdleTimeout = 5 * time.Minute
	DefaultRate        = 25 << 20 // bytes a second, each way
)

// TestNet stands in for DNS and the network in tests, which never leave
// the machine. The policy still applies to the addresses the sandbox sees
// (so Hosts mapping a name to 127.0.0.1 is refused as rebinding); Routes
// then maps an allowed destination to the loopback server that plays it.
// With TestNet set, nothing is resolved or dialled outside it.
type TestNet struct {
	Hosts  map[string][]netip.Addr           // name → the addresses DNS answers
	Routes map[netip.AddrPort]netip.AddrPort // what the sandbox dials → what the gateway dials
}

// Gateway decides and carries one sandbox's traffic.
type Gateway struct {
	opt    Options
	id     string
	log    *slog.Logger
	limit  int64 // network_requests; 0 = none
	budget Budget
	ctx    context.Context
	cancel context.CancelFunc
	// amu guards closers: Attach, Detach and Close one at a time.
	amu     sync.Mutex
	closers []func() // what the last Attach made, undone by Close and Detach in reverse

	pol      atomic.Pointer[policy.Egress]
	requests atomic.Int64
	seen     counters
	stackSum atomic.Pointer[func() string] // the userspace stack's counters, while attached

	started           time.Time     // the origin of now
	inRate, outRate   *rate.Limiter // Options.Rate to and from the sandbox; nil: none
	bytesIn, bytesOut atomic.Int64  // carried to and from the sandbox
	reaper            sync.Once     // starts reapIdle with the first flow

	// fmu guards flows.
	fmu   sync.Mutex
	flows map[*flow]struct{}

	testHookDecided func() // tests only: runs between a connection's decision and its flow's registration

	// mu guards resolved, parents and reported.
	mu       sync.Mutex
	resolved map[netip.Addr]map[string]bool // address → names it answered in this sandbox
	parents  map[string]map[string]bool     // parent zone → distinct names asked under it
	reported map[string]time.Time           // denial → when its event was last emitted
}

// counters are what the gateway saw of its sandbox's connections and
// link, for Diagnose.
type counters struct {
	syns, carried, refused, dialFailed, handshakeFailed atomic.Uint64
	linkWriteErrs                                       atomic.Uint64
	lastLinkErr                                         atomic.Pointer[string]
	overCap, idleClosed, policyClosed                   atomic.Uint64
}

// Diagnose summarises what the gateway saw: the connections the sandbox
// asked for and what became of them, the packets the TUN refused and the
// stack's drops. It is for error messages and logs when traffic stalls.
func (g *Gateway) Diagnose() string {
	c := &g.seen
	out := fmt.Sprintf("tcp: %d asked, %d carried, %d refused, %d dial failures, %d handshake failures; link: %d write errors",
		c.syns.Load(), c.carried.Load(), c.refused.Load(), c.dialFailed.Load(), c.handshakeFailed.Load(), c.linkWriteErrs.Load())
	if e := c.lastLinkErr.Load(); e != nil {
		out += " (last: " + *e + ")"
	}
	if sum := g.stackSum.Load(); sum != nil {
		out += "; stack: " + (*sum)()
	}
	return out + "; " + g.flowSummary()
}

// maxResolved bounds the remembered answers of one sandbox.
const maxResolved = 4096

// maxNamesPerParent is how many distinct names under one zone a sandbox
// may ask for before further ones are refused as tunnelling.
const maxNamesPerParent = 64

// New returns the gateway of one sandbox; Attach connects it to the
// sandbox's network namespace. limit is resource_limits.network_requests
// (0 for none).
func New(opt Options, sandboxID string, pol *policy.Egress, limit int64) (*Gateway, error) {
	if !pol.Enabled() {
		return nil, errors.New("egress: the policy allows no network")
	}
	if opt.Events == nil {
		opt.Events = events.Discard
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 10 * time.Second
	}
	switch {
	case opt.MaxFlows == 0:
		opt.MaxFlows = DefaultMaxFlows
	case opt.MaxFlows < 0:
		opt.MaxFlows = 0
	}
	switch {
	case opt.IdleTimeout == 0:
		opt.IdleTimeout = DefaultIdleTimeout
	case opt.IdleTimeout < 0:
		opt.IdleTimeout = 0
	}
	if opt.Rate == 0 {
		opt.Rate = DefaultRate
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{
		opt: opt, id: sandboxID, limit: max(limit, 0), ctx: ctx, cancel: cancel,
		log:      slog.New(newLogCap(opt.Logger.Handler(), LogLinesPerMinute, time.Now)).With("sandbox", sandboxID, "component", "egress"),
		resolved: map[netip.Addr]map[string]bool{},
		parents:  map[string]map[string]bool{},
		reported: map[string]time.Time{},
		started:  time.Now(),
		flows:    map[*flow]struct{}{},
	}
	if opt.Rate > 0 {
		// A burst of an eighth of a second's worth (4 KiB to 1 MiB)
		// lets short exchanges through at once.
		burst := int(min(max(opt.Rate/8, 4<<10), 1<<20))
		g.inRate = rate.NewLimiter(rate.Limit(opt.Rate), burst)
		g.outRate = rate.NewLimiter(rate.Limit(opt.Rate), burst)
	}
	g.pol.Store(pol)
	return g, nil
}

// SetPolicy replaces the policy for DNS queries, new connections and
// every later request, and closes the open connections it refuses (their
// destination, or the names they claimed: the TLS SNI, the Host of the
// latest HTTP request). A policy without network closes every connection
// and refuses new ones; the interface stays until the sandbox ends.
func (g *Gateway) SetPolicy(pol *policy.Egress, limit int64) {
	g.pol.Store(pol)
	atomic.StoreInt64(&g.limit, max(limit, 0))
	g.review(pol)
}

// Mode is the network mode the gateway enforces now.
func (g *Gateway) Mode() string { return g.pol.Load().Mode }

// Context ends when the gateway closes.
func (g *Gateway) Context() context.Context { return g.ctx }

// Requests returns how many requests the sandbox has made: connections,
// and plain HTTP requests after a connection's first.
func (g *Gateway) Requests() int64 { return g.requests.Load() }

// Bytes returns the bytes carried to the sandbox (in) and from it (out),
// the payload of its TCP connections.
func (g *Gateway) Bytes() (in, out int64) { return g.bytesIn.Load(), g.bytesOut.Load() }

// Close stops the gateway: every connection is closed and the TUN device
// (and with it the sandbox's interface) goes away.
func (g *Gateway) Close() error {
	g.cancel()
	g.detach()
	if h, ok := g.log.Handler().(*logCap); ok {
		h.flush()
	}
	return nil
}

// Detach takes the gateway off its sandbox's network namespace and keeps
// the rest: every open connection is closed, the userspace stack ends
// and the TUN device goes away with its last descriptor (the sandbox is
// left its loopback alone, as a network namespace CRIU can dump), before
// Detach returns. The policy, the request count, the bytes carried and
// the names the sandbox resolved stay, and Attach, to the same sandbox's
// namespace again or to the one of its restored processes, goes on with
// them. A pause, a snapshot and a fork of a sandbox with a network
// detach it for their dump (internal/sandbox, pause.go).
func (g *Gateway) Detach() {
	for _, f := range g.openFlows() {
		f.cancel()
	}
	g.detach()
}

// Attached says whether the gateway is attached to a namespace (Attach,
// and no Detach or Close since).
func (g *Gateway) Attached() bool {
	g.amu.Lock()
	defer g.amu.Unlock()
	return len(g.closers) > 0
}

// detach undoes the last Attach.
func (g *Gateway) detach() {
	g.amu.Lock()
	defer g.amu.Unlock()
	g.detachLocked()
}

// detachLocked runs the closers of the last Attach; amu is held.
func (g *Gateway) detachLocked() {
	for i := len(g.closers) - 1; i >= 0; i-- {
		g.closers[i]()
	}
	g.closers = nil
	g.stackSum.Store(nil)
}

// SetRequests sets the count of requests the sandbox has made (Requests)
// to n, for a gateway that carries on a sandbox an earlier one served
// (a paused sandbox taken back after a restart): its network_requests
// go on from where they were.
func (g *Gateway) SetRequests(n int64) { g.requests.Store(max(n, 0)) }

// decision is the outcome of one check, with the rule that made it.
type decision struct {
	ok   bool
	rule string
	kind string // the event kind when refused
}

func allow(rule string) decision { return decision{ok: true, rule: rule} }
func deny(kind, rule string) decision {
	return decision{kind: kind, rule: rule}
}

// report logs a decision and emits its event when refused.
func (g *Gateway) report(d decision, proto, target string) {
	if d.ok {
		g.log.Info("egress allowed", "proto", proto, "target", target, "rule", d.rule)
		return
	}
	g.log.Info("egress denied", "proto", proto, "target", target, "rule", d.rule, "kind", d.kind)
	if g.repeated(d.kind + "\x00" + target + "\x00" + d.rule) {
		return
	}
	g.opt.Events.Emit(events.Event{
		Type: events.SecurityViolation, SandboxID: g.id,
		Details: map[string]any{"kind": d.kind, "target": target, "rule": d.rule, "protocol": proto},
	})
}

// repeatWindow is how long an identical denial is not reported again (a
// resolver asks for A and AAAA; a client retries).
const repeatWindow = 2 * time.Second

// repeated reports whether the same denial was reported within
// repeatWindow, and otherwise notes it.
func (g *Gateway) repeated(key string) bool {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if at, ok := g.reported[key]; ok && now.Sub(at) < repeatWindow {
		return true
	}
	if len(g.reported) >= 1024 {
		clear(g.reported)
	}
	g.reported[key] = now
	return false
}

// Budget takes one request from a network_requests budget of limit kept
// outside the gateway, where every gateway of the sandbox counts (each
// replica of the server has one): whether it was taken and how many the
// budget has given. An error refuses the request (failing closed).
type Budget func(ctx context.Context, limit int64) (allowed bool, given int64, err error)

// ErrNoBudget, from a Budget, says that it keeps no budget after all: the
// gateway counts alone.
var ErrNoBudget = errors.New("egress: no shared network_requests budget")

// ShareBudget makes the gateway count network_requests in b rather than
// alone; Requests still counts what this gateway carried. Call it before
// the gateway carries traffic.
func (g *Gateway) ShareBudget(b Budget) { g.budget = b }

// countRequest counts one request and refuses it past the limit.
func (g *Gateway) countRequest(target string) bool {
	limit := atomic.LoadInt64(&g.limit)
	if limit > 0 && g.budget != nil {
		ok, given, err := g.budget(g.ctx, limit)
		if errors.Is(err, ErrNoBudget) {
			return g.countAlone(target, limit)
		}
		if err != nil {
			g.log.Warn("egress denied: the shared network_requests budget could not be counted", "target", target, "err", err)
			return false
		}
		if ok {
			g.requests.Add(1)
			return true
		}
		g.overLimit(target, limit, given+1)
		return false
	}
	return g.countAlone(target, limit)
}

// countAlone counts one request in the gateway's own count.
func (g *Gateway) countAlone(target string, limit int64) bool {
	n := g.requests.Add(1)
	if limit == 0 || n <= limit {
		return true
	}
	g.requests.Add(-1)
	g.overLimit(target, limit, n)
	return false
}

// overLimit reports a request refused past network_requests.
func (g *Gateway) overLimit(target string, limit, n int64) {
	g.log.Info("egress denied", "target", target, "rule", "resource_limits.network_requests", "limit", limit)
	g.opt.Events.Emit(events.Event{
		Type: events.ResourceExceeded, SandboxID: g.id,
		Details: map[string]any{"resource": events.ResourceNetworkRequests, "limit": limit,
			"observed": n, "target": target},
	})
}

// remember records that name resolved to addrs in this sandbox.
func (g *Gateway) remember(name string, addrs []netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range addrs {
		names := g.resolved[a]
		if names == nil {
			if len(g.resolved) >= maxResolved {
				continue
			}
			names = map[string]bool{}
			g.resolved[a] = names
		}
		if len(names) < 64 {
			names[name] = true
		}
	}
}

// namesOf returns the names that resolved to a in this sandbox.
func (g *Gateway) namesOf(a netip.Addr) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.resolved[a]))
	for n := range g.resolved[a] {
		out = append(out, n)
	}
	return out
}

// notePrefix counts a distinct name under its parent zone and reports
// whether the zone has seen too many (tunnelling through many labels).
func (g *Gateway) tooManyUnder(name string) bool {
	p := policy.Parent(name)
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := g.parents[p]
	if seen == nil {
		seen = map[string]bool{}
		g.parents[p] = seen
	}
	if seen[name] {
		return false
	}
	if len(seen) >= maxNamesPerParent {
		return true
	}
	seen[name] = true
	return false
}

// checkConn decides a TCP connection to dst under pol. It returns the
// decision and whether a name rule (rather than an address rule) allowed
// it.
func (g *Gateway) checkConn(pol *policy.Egress, dst netip.AddrPort) (decision, bool) {
	a, port := dst.Addr(), dst.Port()
	if !pol.Enabled() {
		return deny(events.KindNetworkDenied, "mode none"), false
	}
	if reason, bad := policy.ForbiddenAddr(a); bad {
		return deny(events.KindNetworkDenied, "forbidden destination: "+reason), false
	}
	if g.opt.Test == nil && g.hostAddr(a) {
		return deny(events.KindNetworkDenied, "forbidden destination: the host's own address"), false
	}
	if rule, ok := pol.AllowAddrRule(a); ok {
		return allow(rule), false
	}
	names := g.namesOf(a)
	for _, n := range names {
		if rule, ok := pol.AllowNamePort(n, port); ok {
			return allow(rule + " (resolved " + n + ")"), true
		}
	}
	if len(names) > 0 {
		return deny(events.KindNetworkDenied, fmt.Sprintf("port %d not allowed for %s", port, names[0])), false
	}
	return deny(events.KindNetworkDenied, "address not resolved from an allowed name in this sandbox"), false
}

// decide decides a TCP connection to dst (checkConn, then the server's
// own listeners refused) and reports it under target: where to dial,
// the decision, and whether a name allowed it.
func (g *Gateway) decide(dst netip.AddrPort, target string) (netip.AddrPort, decision, bool) {
	d, byName := g.checkConn(g.pol.Load(), dst)
	var t netip.AddrPort
	if d.ok {
		var td decision
		if t, td = g.target(dst); !td.ok {
			d = td
		}
	}
	g.report(d, "tcp", target)
	return t, d, byName
}

// checkName decides under pol a name a connection claims (TLS SNI, HTTP
// Host).
func (g *Gateway) checkName(pol *policy.Egress, name string, port uint16) decision {
	if a, err := netip.ParseAddr(name); err == nil {
		if rule, ok := pol.AllowAddrRule(a); ok {
			return allow(rule)
		}
		return deny(events.KindNetworkDenied, "address not in allowlist")
	}
	n, ok := policy.NormalizeName(name)
	if !ok {
		return deny(events.KindNetworkDenied, "not a valid host name")
	}
	if rule, ok := pol.AllowNamePort(n, port); ok {
		return allow(rule)
	}
	return deny(events.KindNetworkDenied, "name not in allowlist")
}

// target returns where the gateway really connects for dst, and refuses
// the server's own listeners.
func (g *Gateway) target(dst netip.AddrPort) (netip.AddrPort, decision) {
	t := dst
	if g.opt.Test != nil {
		r, ok := g.opt.Test.Routes[dst]
		if !ok {
			return t, deny(events.KindNetworkDenied, "test network: no route")
		}
		t = r
	}
	for _, s := range g.opt.Self {
		// A wildcard listener is reached through the host's own
		// addresses, which checkConn refuses.
		if s.Port() == t.Port() && s.Addr().Unmap() == t.Addr().Unmap() {
			return t, deny(events.KindNetworkDenied, "forbidden destination: the server's own port")
		}
	}
	return t, allow("")
}

// dial connects to the checked target.
func (g *Gateway) dial(ctx context.Context, t netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: g.opt.DialTimeout}
	return d.DialContext(ctx, "tcp", t.String())
}

// lookup resolves an allowed name to its IPv4 addresses.
func (g *Gateway) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if g.opt.Test != nil {
		return g.opt.Test.Hosts[name], nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return nil, nil
	}
	return addrs, err
}

// hostAddrs caches the host's interface addresses.
var hostAddrs struct {
	mu    sync.Mutex
	at    time.Time
	addrs map[netip.Addr]bool
}

// HostAddr reports whether a (unmapped) is one of the host's own
// addresses; the server's webhook dialler refuses them as the gateway does.
func HostAddr(a netip.Addr) bool { return (*Gateway)(nil).hostAddr(a) }

// hostAddr reports whether a is one of the host's own addresses.
func (g *Gateway) hostAddr(a netip.Addr) bool {
	hostAddrs.mu.Lock()
	defer hostAddrs.mu.Unlock()
	if time.Since(hostAddrs.at) > 10*time.Second {
		m := map[netip.Addr]bool{}
		if list, err := net.InterfaceAddrs(); err == nil {
			for _, ia := range list {
				if p, err := netip.ParsePrefix(ia.String()); err == nil {
					m[p.Addr().Unmap()] = true
				}
			}
		}
		hostAddrs.addrs, hostAddrs.at = m, time.Now()
	}
	return hostAddrs.addrs[a]
}
