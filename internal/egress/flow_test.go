package egress

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// The flow tests drive flows as handleTCP does (connect, then splice),
// with a loopback TCP pair standing in for the sandbox's end: the same
// code carries every TUN and proxied connection.

var (
	apiIP   = netip.MustParseAddr("203.0.113.10") // api.test
	otherIP = netip.MustParseAddr("203.0.113.11") // other.test
	echoIP  = netip.MustParseAddr("203.0.113.12") // echo.test
	cidrIP  = netip.MustParseAddr("198.51.100.7")
)

// flowWorld is the outside of the flow tests: an HTTP server (api.test
// and other.test, port 80) that says which Host it serves and switches
// to an echo on Upgrade: echo, the same over TLS (port 443), and a line
// echo server (echo.test and 198.51.100.7, port 9000).
type flowWorld struct {
	test           *TestNet
	http, tls, raw netip.AddrPort
}

func newFlowWorld(t *testing.T) *flowWorld {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/upgrade" && r.Header.Get("Upgrade") == "echo":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			echoLines(c, brw.Reader)
		case r.URL.Path == "/big":
			w.Write(make([]byte, 640<<10))
		default:
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "hello from "+r.Host)
		}
	})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				echoLines(c, bufio.NewReader(c))
			}()
		}
	}()
	w := &flowWorld{
		http: netip.MustParseAddrPort(hs.Listener.Addr().String()),
		tls:  netip.MustParseAddrPort(ts.Listener.Addr().String()),
		raw:  netip.MustParseAddrPort(ln.Addr().String()),
	}
	w.test = &TestNet{
		Hosts: map[string][]netip.Addr{"api.test": {apiIP}, "other.test": {otherIP}, "echo.test": {echoIP}},
		Routes: map[netip.AddrPort]netip.AddrPort{
			netip.AddrPortFrom(apiIP, 80): w.http, netip.AddrPortFrom(otherIP, 80): w.http,
			netip.AddrPortFrom(apiIP, 443): w.tls, netip.AddrPortFrom(otherIP, 443): w.tls,
			netip.AddrPortFrom(echoIP, 9000): w.raw, netip.AddrPortFrom(cidrIP, 9000): w.raw,
		},
	}
	return w
}

// echoLines answers each line read from r with "echo: " and the line.
func echoLines(w io.Writer, r *bufio.Reader) {
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := io.WriteString(w, "echo: "+l); err != nil {
			return
		}
	}
}

// gateway returns a gateway over the world for network n, with the names
// of n's allowlist resolved (as the sandbox's DNS questions would).
func (w *flowWorld) gateway(t *testing.T, n *policy.Network, limit int64, opt func(*Options)) (*Gateway, *sink) {
	t.Helper()
	pol, err := policy.CompileEgress(n)
	if err != nil {
		t.Fatal(err)
	}
	ev := &sink{}
	o := Options{Events: ev, Test: w.test}
	if opt != nil {
		opt(&o)
	}
	g, err := New(o, "sb1", pol, limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	for name := range w.test.Hosts {
		if _, ok := pol.ResolveName(name); ok {
			query(t, g, name, dnsmessage.TypeA)
		}
	}
	return g, ev
}

// dialFlow is the sandbox's end of a connection to dst through g, or nil
// if g refused it.
func dialFlow(t *testing.T, g *Gateway, dst string) net.Conn {
	t.Helper()
	d := netip.MustParseAddrPort(dst)
	f, up, why := g.connect(d, dst, dst)
	if why != nil {
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	go f.splice(s.(*net.TCPConn), up)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// rawDial is a connection straight to the world's server for dst: the
// control, where nothing is confined.
func (w *flowWorld) rawDial(t *testing.T, dst string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", w.test.Routes[netip.MustParseAddrPort(dst)].String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// exchangeOn writes each request on c in turn and reads its answer:
// the bodies, or "refused" where the connection ended instead.
func exchangeOn(c net.Conn, reqs ...string) []string {
	var out []string
	br := bufio.NewReader(c)
	for _, r := range reqs {
		if _, err := io.WriteString(c, r); err != nil {
			return append(out, "refused")
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return append(out, "refused")
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		out = append(out, fmt.Sprintf("%d %s", res.StatusCode, b))
	}
	return out
}

// refused reports whether c is closed by the gateway: a read ends
// otherwise than by its deadline.
func refused(c net.Conn) bool {
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestFlowJudgesEveryRequest: in allowlist mode a flow to an allowed
// name must claim allowed names in every request, whatever it looks like.
// Each attack is first sent straight to the server, which serves it (the
// control), then through the gateway, which refuses it and reports why.
func TestFlowJudgesEveryRequest(t *testing.T) {
	w := newFlowWorld(t)
	api := "203.0.113.10:80"
	evil := "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	get := "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"
	cases := []struct {
		name   string
		reqs   []string
		direct string // the control's last answer
		via    string // through the gateway, all answers
		rule   string // a part of the refusal's rule
	}{
		{"keep-alive, allowed", []string{get, get, get}, "200 hello from api.test",
			"200 hello from api.test|200 hello from api.test|200 hello from api.test", ""},
		{"upgrade not switched, then another host",
			[]string{"GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", evil},
			"200 hello from evil.test", "200 hello from api.test|refused", `http name "evil.test"`},
		{"lower-case method", []string{"get / HTTP/1.1\r\nHost: evil.test\r\n\r\n"}, "200 hello from evil.test", "refused", `http name "evil.test"`},
		{"unknown method", []string{"FOO / HTTP/1.1\r\nHost: evil.test\r\n\r\n"}, "200 hello from evil.test", "refused", `http name "evil.test"`},
		{"lower-case method later", []string{get, "get / HTTP/1.1\r\nHost: evil.test\r\n\r\n"}, "200 hello from evil.test",
			"200 hello from api.test|refused", `http name "evil.test"`},
		{"bare LF line ends", []string{"GET / HTTP/1.1\nHost: evil.test\n\n"}, "200 hello from evil.test", "refused", "CRLF"},
		{"absolute target", []string{"GET http://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n"}, "200 hello from evil.test", "refused", `http name "evil.test"`},
		{"no Host", []string{"GET / HTTP/1.0\r\n\r\n"}, "200 hello from ", "refused", "without Host"},
		{"smuggled behind Content-Length and chunked",
			[]string{"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + evil},
			"200 hello from api.test", "refused", "both Content-Length and Transfer-Encoding"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			direct := exchangeOn(w.rawDial(t, api), c.reqs...)
			if direct[len(direct)-1] != c.direct {
				t.Fatalf("the control: straight to the server %q, want %q last", direct, c.direct)
			}
			g, ev := w.gateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test"}}, 0, nil)
			got := strings.Join(exchangeOn(dialFlow(t, g, api), c.reqs...), "|")
			if got != c.via {
				t.Fatalf("through the gateway %q, want %q", got, c.via)
			}
			if c.rule == "" {
				if n := ev.count(); n != 0 {
					t.Fatalf("%d events for allowed requests", n)
				}
				return
			}
			if !ev.has(events.SecurityViolation, c.rule) {
				t.Fatalf("no security_violation with a rule holding %q: %+v", c.rule, ev.evs)
			}
		})
	}
	// The smuggled request, straight to the server, was served as a
	// second request (the control of the last case).
	c := w.rawDial(t, api)
	io.WriteString(c, cases[len(cases)-1].reqs[0])
	br := bufio.NewReader(c)
	var bodies []string
	for range 2 {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		bodies = append(bodies, string(b))
	}
	if bodies[1] != "hello from evil.test" {
		t.Fatalf("the smuggling control: %q", bodies)
	}
}

// has reports whether an event of typ has a rule holding part.
func (s *sink) has(typ events.Type, part string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.evs {
		if e.Type == typ && strings.Contains(fmt.Sprint(e.Details["rule"]), part) {
			return true
		}
	}
	return false
}

// TestFlowFirstBytes: where a name is required, a flow whose first bytes
// are neither a TLS ClientHello with an allowed SNI nor an HTTP/1
// request is refused; where an address rule allows it (or in public
// mode), the same bytes are carried (the control).
func TestFlowFirstBytes(t *testing.T) {
	w := newFlowWorld(t)
	g, ev := w.gateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "echo.test", "198.51.100.0/24"}}, 0, nil)
	echo := func(c net.Conn) string {
		if c == nil {
			return "no connection"
		}
		io.WriteString(c, "ping\n")
		l, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "refused"
		}
		return strings.TrimSpace(l)
	}
	if got := echo(dialFlow(t, g, "198.51.100.7:9000")); got != "echo: ping" {
		t.Fatalf("a raw flow allowed by an address rule: %q", got)
	}
	if got := echo(dialFlow(t, g, "203.0.113.12:9000")); got != "refused" {
		t.Fatalf("a raw flow to an address allowed by name: %q", got)
	}
	if !ev.has(events.SecurityViolation, "neither a TLS ClientHello nor an HTTP/1 request") {
		t.Fatalf("events %+v", ev.evs)
	}
	// HTTP/2 with prior knowledge claims no name either.
	c := dialFlow(t, g, "203.0.113.10:80")
	io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	if !refused(c) {
		t.Fatal("h2c prior knowledge carried to a name-allowed destination")
	}

	// TLS: without SNI refused, with an allowed SNI carried; straight to
	// the server, without SNI is served (the control).
	tlsGet := func(c net.Conn, sni string) string {
		if c == nil {
			return "no connection"
		}
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return "refused"
		}
		return exchangeOn(tc, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")[0]
	}
	if got := tlsGet(w.rawDial(t, "203.0.113.10:443"), ""); got != "200 hello from evil.test" {
		t.Fatalf("the control: TLS without SNI straight to the server: %q", got)
	}
	if got := tlsGet(dialFlow(t, g, "203.0.113.10:443"), ""); got != "refused" {
		t.Fatalf("TLS without SNI: %q", got)
	}
	if !ev.has(events.SecurityViolation, "TLS without SNI") {
		t.Fatalf("events %+v", ev.evs)
	}
	if got := tlsGet(dialFlow(t, g, "203.0.113.10:443"), "evil.test"); got != "refused" {
		t.Fatalf("TLS with a refused SNI: %q", got)
	}
	if got := tlsGet(dialFlow(t, g, "203.0.113.10:443"), "api.test"); got != "200 hello from evil.test" {
		t.Fatalf("TLS with an allowed SNI: %q", got) // inside TLS the Host is not seen
	}

	// Public mode carries raw bytes and TLS without SNI.
	pub, _ := w.gateway(t, &policy.Network{Mode: "public"}, 0, nil)
	if got := echo(dialFlow(t, pub, "203.0.113.12:9000")); got != "echo: ping" {
		t.Fatalf("public mode, raw: %q", got)
	}
	if got := tlsGet(dialFlow(t, pub, "203.0.113.10:443"), ""); got != "200 hello from evil.test" {
		t.Fatalf("public mode, TLS without SNI: %q", got)
	}
}

// TestFlowUpgrade: an Upgrade the server accepts (101) makes the flow
// opaque, allowed because its Host was; one it does not accept leaves the
// flow HTTP, every request after it judged (TestFlowJudgesEveryRequest).
func TestFlowUpgrade(t *testing.T) {
	w := newFlowWorld(t)
	g, _ := w.gateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test"}}, 0, nil)
	c := dialFlow(t, g, "203.0.113.10:80")
	io.WriteString(c, "GET /upgrade HTTP/1.1\r\nHost: api.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", res, err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if l, err := br.ReadString('\n'); err != nil || l != "echo: GET / HTTP/1.1\r\n" {
		t.Fatalf("after 101 the flow is opaque: %q %v", l, err)
	}
	// An Upgrade to a refused Host is refused before it goes on.
	c = dialFlow(t, g, "203.0.113.10:80")
	io.WriteString(c, "GET /upgrade HTTP/1.1\r\nHost: evil.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	if !refused(c) {
		t.Fatal("an Upgrade to a refused Host went on")
	}
}

// TestFlowCountsEveryRequest: network_requests counts every request of a
// plain HTTP flow in every mode, after an Upgrade the server did not
// accept and whatever the method's spelling.
func TestFlowCountsEveryRequest(t *testing.T) {
	w := newFlowWorld(t)
	g, ev := w.gateway(t, &policy.Network{Mode: "public"}, 5, nil)
	got := exchangeOn(dialFlow(t, g, "203.0.113.10:80"),
		"GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", // the connection's count: 1
		"get / HTTP/1.1\r\nHost: api.test\r\n\r\n",                                                // 2
		"FOO / HTTP/1.1\r\nHost: api.test\r\n\r\n",                                                // 3
		"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")                                                // 4
	// A connection whose first request has a lower-case method: 5, then over.
	got = append(got, exchangeOn(dialFlow(t, g, "203.0.113.10:80"),
		"get / HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")...)
	if want := strings.Repeat("200 hello from api.test|", 5) + "refused"; strings.Join(got, "|") != want {
		t.Fatalf("answers %q, want %q", got, want)
	}
	if g.Requests() != 5 {
		t.Fatalf("Requests = %d, want 5", g.Requests())
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.evs) != 1 || ev.evs[0].Type != events.ResourceExceeded || ev.evs[0].Details["resource"] != events.ResourceNetworkRequests {
		t.Fatalf("events %+v", ev.evs)
	}
}

// TestFlowPolicyTightened: a policy change closes the open flows the new
// policy refuses (by destination, by the name they claimed, for claiming
// none) and keeps the rest; a change that refuses none of them (the
// control) closes nothing.
func TestFlowPolicyTightened(t *testing.T) {
	w := newFlowWorld(t)
	g, _ := w.gateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "other.test", "198.51.100.0/24"}}, 0, nil)
	get := func(c net.Conn, host string) string {
		return exchangeOn(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")[0]
	}
	api := dialFlow(t, g, "203.0.113.10:80")
	other := dialFlow(t, g, "203.0.113.11:80")
	raw := dialFlow(t, g, "198.51.100.7:9000")
	tlsc := tls.Client(dialFlow(t, g, "203.0.113.10:443"), &tls.Config{ServerName: "api.test", InsecureSkipVerify: true})
	rawBR := bufio.NewReader(raw)
	echo := func() string {
		io.WriteString(raw, "ping\n")
		l, err := rawBR.ReadString('\n')
		if err != nil {
			return "refused"
		}
		return l
	}
	all := func() string {
		return strings.Join([]string{get(api, "api.test"), get(other, "other.test"), echo(), get(tlsc, "api.test")}, "|")
	}
	open := "200 hello from api.test|200 hello from other.test|echo: ping\n|200 hello from api.test"
	if got := all(); got != open {
		t.Fatalf("before: %q", got)
	}
	// The control: the same policy again, and one that only adds.
	g.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "other.test", "198.51.100.0/24"}}), 0)
	g.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "other.test", "198.51.100.0/24", "x.test"}}), 0)
	if got := all(); got != open {
		t.Fatalf("after a change that refuses none: %q", got)
	}
	g.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"other.test"}}), 0)
	for name, c := range map[string]net.Conn{"http to api.test": api, "raw to the CIDR": raw, "tls to api.test": tlsc} {
		if !refused(c) {
			t.Errorf("%s still open", name)
		}
	}
	if got := get(other, "other.test"); got != "200 hello from other.test" {
		t.Fatalf("other.test after: %q", got)
	}
	if d := g.Diagnose(); !strings.Contains(d, "3 closed by a policy change") {
		t.Fatalf("Diagnose = %q", d)
	}
	// Public, then an allowlist by name: an opaque flow claimed no name.
	pub, _ := w.gateway(t, &policy.Network{Mode: "public"}, 0, nil)
	raw = dialFlow(t, pub, "203.0.113.12:9000")
	rawBR = bufio.NewReader(raw)
	if got := echo(); got != "echo: ping\n" {
		t.Fatalf("public raw: %q", got)
	}
	pub.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"203.0.113.12"}}), 0)
	if got := echo(); got != "echo: ping\n" {
		t.Fatalf("kept by an address rule: %q", got)
	}
	pub.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"echo.test"}}), 0)
	if !refused(raw) {
		t.Fatal("an opaque flow kept under a name rule")
	}
	// Mode none closes everything.
	g.SetPolicy(mustEgress(t, nil), 0)
	if !refused(other) {
		t.Fatal("a flow kept under mode none")
	}
	waitFor(t, func() bool { return g.Flows() == 0 && pub.Flows() == 0 })
}

func mustEgress(t *testing.T, n *policy.Network) *policy.Egress {
	t.Helper()
	e, err := policy.CompileEgress(n)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFlowCap: past MaxFlows open at once, a connection is refused with a
// resource_exceeded (network_flows) event; one closing makes room.
func TestFlowCap(t *testing.T) {
	w := newFlowWorld(t)
	g, ev := w.gateway(t, &policy.Network{Mode: "public"}, 0, func(o *Options) { o.MaxFlows = 2 })
	a := dialFlow(t, g, "203.0.113.12:9000")
	b := dialFlow(t, g, "203.0.113.12:9000")
	if a == nil || b == nil {
		t.Fatal("flows under the cap refused")
	}
	if dialFlow(t, g, "203.0.113.12:9000") != nil {
		t.Fatal("a third flow over a cap of 2")
	}
	ev.mu.Lock()
	if len(ev.evs) != 1 || ev.evs[0].Details["resource"] != events.ResourceNetworkFlows || ev.evs[0].Details["limit"] != 2 {
		t.Errorf("events %+v", ev.evs)
	}
	ev.mu.Unlock()
	a.Close()
	waitFor(t, func() bool { return g.Flows() == 1 })
	if dialFlow(t, g, "203.0.113.12:9000") == nil {
		t.Fatal("no room after one closed")
	}
	if g.Requests() != 3 {
		t.Fatalf("Requests = %d: a refused flow was counted", g.Requests())
	}
}

// TestFlowIdleTimeout: a flow on which nothing moves for IdleTimeout is
// closed; one that keeps talking is not (the control).
func TestFlowIdleTimeout(t *testing.T) {
	w := newFlowWorld(t)
	const idle = 150 * time.Millisecond
	g, _ := w.gateway(t, &policy.Network{Mode: "public"}, 0, func(o *Options) { o.IdleTimeout = idle })
	start := time.Now()
	quiet := dialFlow(t, g, "203.0.113.10:80")
	busy := dialFlow(t, g, "203.0.113.10:80")
	closed := make(chan time.Duration, 1)
	go func() {
		refused(quiet)
		closed <- time.Since(start)
	}()
	for i := 0; ; i++ {
		if got := exchangeOn(busy, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")[0]; got != "200 hello from api.test" {
			t.Fatalf("busy flow, request %d after %v: %q", i, time.Since(start), got)
		}
		select {
		case d := <-closed:
			if d < idle {
				t.Fatalf("closed after %v, before the idle timeout", d)
			}
			if time.Since(start) < 3*idle {
				// Keep the busy flow busy past a few timeouts.
				for time.Since(start) < 3*idle {
					exchangeOn(busy, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
					time.Sleep(idle / 5)
				}
			}
			if got := exchangeOn(busy, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")[0]; got != "200 hello from api.test" {
				t.Fatalf("the busy flow was closed too: %q", got)
			}
			if !strings.Contains(g.Diagnose(), "1 closed idle") {
				t.Fatalf("Diagnose = %q", g.Diagnose())
			}
			return
		default:
		}
		time.Sleep(idle / 5)
	}
}

// TestFlowBytes: the bytes each way are counted, as the sandbox sent and
// received them.
func TestFlowBytes(t *testing.T) {
	w := newFlowWorld(t)
	g, _ := w.gateway(t, &policy.Network{Mode: "public"}, 0, nil)
	c := dialFlow(t, g, "203.0.113.10:80")
	req := "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n"
	io.WriteString(c, req)
	got, err := io.ReadAll(c)
	if err != nil || !strings.HasSuffix(string(got), "hello from api.test") {
		t.Fatalf("%q %v", got, err)
	}
	c.Close()
	waitFor(t, func() bool { return g.Flows() == 0 })
	if in, out := g.Bytes(); in != int64(len(got)) || out != int64(len(req)) {
		t.Fatalf("Bytes = %d in, %d out; want %d, %d", in, out, len(got), len(req))
	}
}

// TestFlowRate: Rate holds each way of a sandbox's traffic to its bytes
// a second; without it (the control) the same transfers are fast.
func TestFlowRate(t *testing.T) {
	w := newFlowWorld(t)
	const rate = 256 << 10
	const size = 640 << 10
	// The burst is rate/8: the rest takes (size - rate/8) / rate seconds.
	least := time.Duration(float64(size-rate/8) / rate * float64(time.Second) * 0.9)
	for _, limited := range []bool{false, true} {
		r := int64(-1)
		if limited {
			r = rate
		}
		g, _ := w.gateway(t, &policy.Network{Mode: "public"}, 0, func(o *Options) { o.Rate = r })
		start := time.Now()
		c := dialFlow(t, g, "203.0.113.10:80")
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if got := exchangeOn(c, "GET /big HTTP/1.1\r\nHost: api.test\r\n\r\n")[0]; len(got) != 4+size {
			t.Fatalf("download: %d bytes", len(got))
		}
		down := time.Since(start)
		start = time.Now()
		body := strings.Repeat("x", size)
		if got := exchangeOn(c, fmt.Sprintf("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n%s", size, body))[0]; got != "200 hello from api.test" {
			t.Fatalf("upload: %q", got)
		}
		upload := time.Since(start)
		t.Logf("rate limited %v: %d KiB down in %v, up in %v", limited, size>>10, down, upload)
		if limited && (down < least || upload < least) {
			t.Fatalf("limited to %d KiB/s: down in %v, up in %v, want at least %v", rate>>10, down, upload, least)
		}
		if !limited && (down >= least || upload >= least) {
			t.Fatalf("the control, unlimited: down in %v, up in %v", down, upload)
		}
	}
}

// TestFlowPolicyChangedWhileDeciding: a policy that changes between a
// connection's decision and its flow's registration (the review of open
// flows cannot see it yet) still refuses it.
func TestFlowPolicyChangedWhileDeciding(t *testing.T) {
	w := newFlowWorld(t)
	g, _ := w.gateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test"}}, 0, nil)
	if c := dialFlow(t, g, "203.0.113.10:80"); c == nil {
		t.Fatal("the control: refused before any change")
	}
	g.testHookDecided = func() {
		g.testHookDecided = nil
		g.SetPolicy(mustEgress(t, &policy.Network{Mode: "allowlist", Allow: []string{"other.test"}}), 0)
	}
	if c := dialFlow(t, g, "203.0.113.10:80"); c != nil {
		t.Fatal("a connection decided under the old policy went on")
	}
}
