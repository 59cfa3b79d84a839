package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

type sink struct {
	mu  sync.Mutex
	evs []events.Event
}

func (s *sink) Emit(e events.Event) {
	s.mu.Lock()
	s.evs = append(s.evs, e)
	s.mu.Unlock()
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.evs)
}

func testGateway(t *testing.T, n *policy.Network, limit int64) (*Gateway, *sink) {
	t.Helper()
	pol, err := policy.CompileEgress(n)
	if err != nil {
		t.Fatal(err)
	}
	ev := &sink{}
	g, err := New(Options{Events: ev, Self: []netip.AddrPort{netip.MustParseAddrPort("203.0.113.50:8080")},
		Test: &TestNet{
			Hosts: map[string][]netip.Addr{
				"api.test":    {netip.MustParseAddr("203.0.113.10")},
				"rebind.test": {netip.MustParseAddr("127.0.0.1")},
				"x.wild.test": {netip.MustParseAddr("203.0.113.12")},
			},
			Routes: map[netip.AddrPort]netip.AddrPort{
				netip.MustParseAddrPort("203.0.113.10:80"):   netip.MustParseAddrPort("127.0.0.1:1"),
				netip.MustParseAddrPort("203.0.113.10:8080"): netip.MustParseAddrPort("203.0.113.50:8080"),
			},
		}}, "sb1", pol, limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, ev
}

func query(t *testing.T, g *Gateway, name string, qtype dnsmessage.Type) (dnsmessage.RCode, []netip.Addr) {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: qtype, Class: dnsmessage.ClassINET})
	req, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	out := g.answerDNS(context.Background(), req)
	var msg dnsmessage.Message
	if err := msg.Unpack(out); err != nil {
		t.Fatalf("answer to %s: %v", name, err)
	}
	if msg.ID != 7 || !msg.Response {
		t.Fatalf("answer header %+v", msg.Header)
	}
	var addrs []netip.Addr
	for _, a := range msg.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			addrs = append(addrs, netip.AddrFrom4(r.A))
		}
	}
	return msg.RCode, addrs
}

func TestDNS(t *testing.T) {
	g, ev := testGateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "rebind.test", "*.wild.test"}}, 0)
	cases := []struct {
		name   string
		qtype  dnsmessage.Type
		rcode  dnsmessage.RCode
		n      int
		events int
	}{
		{"api.test", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1, 0},
		{"API.Test", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1, 0},
		{"api.test", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0, 0},
		{"api.test", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, 0, 0},
		{"other.test", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0, 1},
		{"rebind.test", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0, 1},
		{"x.wild.test", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1, 0},
		{"unknown.wild.test", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0, 0},
		{strings.Repeat("z", 50) + ".wild.test", dnsmessage.TypeA, dnsmessage.RCodeRefused, 0, 1},
	}
	for _, c := range cases {
		before := ev.count()
		rcode, addrs := query(t, g, c.name, c.qtype)
		if rcode != c.rcode || len(addrs) != c.n {
			t.Errorf("%s %v: %v %v, want %v with %d answers", c.name, c.qtype, rcode, addrs, c.rcode, c.n)
		}
		if got := ev.count() - before; got != c.events {
			t.Errorf("%s %v: %d events, want %d", c.name, c.qtype, got, c.events)
		}
	}
	// Many distinct names under one zone: past the limit, refused.
	var last dnsmessage.RCode
	for i := range maxNamesPerParent + 1 {
		last, _ = query(t, g, fmt.Sprintf("n%d.wild.test", i), dnsmessage.TypeA)
	}
	if last != dnsmessage.RCodeRefused {
		t.Errorf("name %d under one zone: %v, want REFUSED", maxNamesPerParent+1, last)
	}
	if out := g.answerDNS(context.Background(), []byte("garbage")); out != nil {
		t.Errorf("garbage answered: %x", out)
	}
}

func TestCheckConn(t *testing.T) {
	g, _ := testGateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test:80", "198.51.100.0/24"}}, 0)
	ap := netip.MustParseAddrPort
	// Before any lookup, the address of an allowed name is unknown.
	if d, _ := g.checkConn(g.pol.Load(), ap("203.0.113.10:80")); d.ok {
		t.Fatal("address allowed before its name was resolved")
	}
	query(t, g, "api.test", dnsmessage.TypeA)
	cases := []struct {
		dst    string
		ok     bool
		byName bool
		rule   string
	}{
		{"203.0.113.10:80", true, true, "api.test:80"},
		{"203.0.113.10:443", false, false, "port 443 not allowed"},
		{"198.51.100.9:22", true, false, "198.51.100.0/24"},
		{"203.0.113.11:80", false, false, "not resolved"},
		{"127.0.0.1:80", false, false, "loopback"},
		{"169.254.169.254:80", false, false, "cloud metadata"},
		{"10.255.255.1:53", false, false, "private"},
	}
	for _, c := range cases {
		d, byName := g.checkConn(g.pol.Load(), ap(c.dst))
		if d.ok != c.ok || byName != c.byName || !strings.Contains(d.rule, c.rule) {
			t.Errorf("checkConn(%s) = %+v byName %v; want ok %v byName %v rule ~%q", c.dst, d, byName, c.ok, c.byName, c.rule)
		}
	}
	// The test routes: a missing route refuses, a route onto the server's
	// own listener refuses.
	if _, d := g.target(ap("203.0.113.10:80")); !d.ok {
		t.Errorf("route refused: %+v", d)
	}
	if _, d := g.target(ap("203.0.113.10:81")); d.ok {
		t.Error("unrouted test destination allowed")
	}
	if _, d := g.target(ap("203.0.113.10:8080")); d.ok || !strings.Contains(d.rule, "own port") {
		t.Errorf("the server's own port: %+v", d)
	}
	// Names claimed by SNI or Host.
	for name, ok := range map[string]bool{"api.test": true, "API.TEST": true, "evil.test": false, "198.51.100.3": true, "8.8.8.8": false, "bad name": false} {
		if d := g.checkName(g.pol.Load(), name, 80); d.ok != ok {
			t.Errorf("checkName(%q) = %+v, want ok %v", name, d, ok)
		}
	}
	// A policy without network refuses everything from then on.
	none, _ := policy.CompileEgress(nil)
	g.SetPolicy(none, 0)
	if d, _ := g.checkConn(g.pol.Load(), ap("203.0.113.10:80")); d.ok {
		t.Error("connection allowed after the network was turned off")
	}
}

func TestRequestLimit(t *testing.T) {
	g, ev := testGateway(t, &policy.Network{Mode: "public"}, 2)
	for i, want := range []bool{true, true, false, false} {
		if got := g.countRequest("203.0.113.10:80"); got != want {
			t.Errorf("request %d: %v, want %v", i+1, got, want)
		}
	}
	if g.Requests() != 2 || ev.count() != 2 {
		t.Errorf("requests %d, events %d", g.Requests(), ev.count())
	}
}

// TestSharedRequestLimit: two gateways of one sandbox (two replicas)
// sharing a budget give network_requests in all, each counting what it
// carried; a budget that cannot be counted refuses.
func TestSharedRequestLimit(t *testing.T) {
	var mu sync.Mutex
	var given int64
	budget := func(ctx context.Context, limit int64) (bool, int64, error) {
		mu.Lock()
		defer mu.Unlock()
		if given >= limit {
			return false, given, nil
		}
		given++
		return true, given, nil
	}
	a, evA := testGateway(t, &policy.Network{Mode: "public"}, 3)
	b, evB := testGateway(t, &policy.Network{Mode: "public"}, 3)
	a.ShareBudget(budget)
	b.ShareBudget(budget)
	var allowed []bool
	for _, g := range []*Gateway{a, b, a, b, a} {
		allowed = append(allowed, g.countRequest("203.0.113.10:80"))
	}
	if fmt.Sprint(allowed) != "[true true true false false]" || a.Requests() != 2 || b.Requests() != 1 {
		t.Fatalf("allowed %v, carried %d and %d", allowed, a.Requests(), b.Requests())
	}
	if evA.count() != 1 || evB.count() != 1 {
		t.Fatalf("resource_exceeded events %d and %d", evA.count(), evB.count())
	}
	c, _ := testGateway(t, &policy.Network{Mode: "public"}, 3)
	c.ShareBudget(func(context.Context, int64) (bool, int64, error) { return false, 0, context.DeadlineExceeded })
	if c.countRequest("203.0.113.10:80") || c.Requests() != 0 {
		t.Fatal("a budget that could not be counted allowed a request")
	}
	// A budget that is not kept after all: the gateway counts alone.
	d, _ := testGateway(t, &policy.Network{Mode: "public"}, 1)
	d.ShareBudget(func(context.Context, int64) (bool, int64, error) { return false, 0, ErrNoBudget })
	if !d.countRequest("203.0.113.10:80") || d.countRequest("203.0.113.10:80") || d.Requests() != 1 {
		t.Fatalf("counting alone: %d carried", d.Requests())
	}
}

func TestSniff(t *testing.T) {
	hello := clientHello(t, "api.test")
	cases := []struct {
		name   string
		input  []byte
		proto  string
		claims string
	}{
		{"tls", hello, protoTLS, "api.test"},
		{"http", []byte("GET /x HTTP/1.1\r\nHost: api.test:8080\r\nUser-Agent: t\r\n\r\nbody"), protoHTTP, ""},
		{"http, lower case", []byte("get /x HTTP/1.1\r\nHost: api.test\r\n\r\n"), protoHTTP, ""},
		{"http, unknown method", []byte("PROPFIND /x HTTP/1.1\r\nHost: api.test\r\n\r\n"), protoHTTP, ""},
		{"ssh", []byte("SSH-2.0-OpenSSH_9.2\r\n"), protoOther, ""},
		{"raw", []byte("ping\n"), protoOther, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() {
				// Two writes: the parsers must read across segments.
				a.Write(c.input[:len(c.input)/2])
				a.Write(c.input[len(c.input)/2:])
			}()
			proto, name, read, err := sniff(b, 5*time.Second)
			if err != nil || proto != c.proto || name != c.claims {
				t.Fatalf("sniff = %q %q %v, want %q %q", proto, name, err, c.proto, c.claims)
			}
			if !bytes.HasPrefix(c.input, read) || len(read) == 0 {
				t.Fatalf("recorded %q, not a prefix of the input", read)
			}
		})
	}
	// A TLS record that never completes is cut by the timeout.
	a, b := net.Pipe()
	defer a.Close()
	go a.Write(hello[:20])
	if _, _, _, err := sniff(b, 200*time.Millisecond); err == nil {
		t.Fatal("incomplete ClientHello accepted")
	}
}

// clientHello returns the first flight of a real TLS client for sni.
func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		c.Handshake()
	}()
	buf := make([]byte, 16<<10)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	var out []byte
	for {
		n, err := b.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) >= 5 && len(out) >= 5+int(out[3])<<8|int(out[4]) {
			b.Close()
			a.Close()
			return out
		}
	}
}

func TestClassify(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "G": "", "GE": "", "GET": "", "GET ": "", "GET / HTTP/1.1\r": "",
		"GET / HTTP/1.1\r\n": protoHTTP, "get / http/1.1\r\n": protoHTTP, "PROPFIND /x HTTP/1.1\r\n": protoHTTP,
		"GET / HTTP/1.1\n": protoHTTP, "GET\t/ HTTP/1.0 \r\n": protoHTTP, "CONNECT a:1 HTTP/1.1\r\n": protoHTTP,
		"GETX\r\n": protoOther, "\x16\x03\x01": protoTLS, "x": "", "x\n": protoOther, "\x00": protoOther,
		"SSH-2.0-OpenSSH_9.2\r\n": protoOther, "EHLO example.com\r\n": protoOther, "GET /\r\n": protoOther,
		"SET k \x00\x01": protoOther, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": protoOther, "PRI * HTTP/2": "",
		"POST /": "",
	} {
		if got := classify([]byte(in)); got != want {
			t.Errorf("classify(%q) = %q, want %q", in, got, want)
		}
	}
}

// exchangeWith runs ex.requests over input to a stand-in server that
// answers each request it reads with answer(req) (and then, after a 101
// or a CONNECT's 200, echoes what comes). It returns what reached the
// server, the names judged, and requests' error.
func exchangeWith(t *testing.T, input string, judge func(names []string) error, answer func(*http.Request) string) (string, [][]string, error) {
	t.Helper()
	ex := newExchange()
	toServer, fromClient := io.Pipe()
	toClient, fromServer := io.Pipe()
	var got bytes.Buffer
	server := make(chan struct{})
	go func() { // the server
		defer close(server)
		defer fromServer.Close()
		br := bufio.NewReader(io.TeeReader(toServer, &got))
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			a := answer(req)
			if _, err := io.WriteString(fromServer, a); err != nil {
				return
			}
			if strings.HasPrefix(a, "HTTP/1.1 101") || req.Method == http.MethodConnect && strings.HasPrefix(a, "HTTP/1.1 200") {
				io.Copy(io.Discard, br) // opaque now
				return
			}
		}
	}()
	answered := make(chan struct{})
	go func() { // the gateway's other half
		defer close(answered)
		br := bufio.NewReader(toClient)
		ex.answers(br)
		io.Copy(io.Discard, br)
	}()
	var judged [][]string
	err := ex.requests(bufio.NewReader(strings.NewReader(input)), fromClient, func(_ *http.Request, names []string, head []byte) ([]byte, func(string) error, error) {
		judged = append(judged, names)
		return head, nil, judge(names)
	}, nil)
	fromClient.Close()
	<-server
	toClient.Close()
	<-answered
	return got.String(), judged, err
}

func ok200(*http.Request) string { return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" }

func TestExchangeRequests(t *testing.T) {
	reqs := "GET /a HTTP/1.1\r\nHost: api.test\r\n\r\n" +
		"POST /b HTTP/1.1\r\nHost: api.test:80\r\nContent-Length: 5\r\n\r\nhello" +
		"\r\n" + // a stray empty line between requests
		"PUT /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: 1\r\n\r\n" +
		"get /d HTTP/1.1\r\nHost: evil.test\r\n\r\n" +
		"GET /e HTTP/1.1\r\nHost: api.test\r\n\r\n"
	onlyAPI := func(names []string) error {
		for _, n := range names {
			if n != "api.test" {
				return errRefused
			}
		}
		return nil
	}
	got, judged, err := exchangeWith(t, reqs, onlyAPI, ok200)
	if err != errRefused {
		t.Fatalf("requests = %v, want errRefused", err)
	}
	if fmt.Sprint(judged) != "[[api.test] [api.test] [api.test] [evil.test]]" {
		t.Fatalf("judged %v", judged)
	}
	// Everything before the refused request went through unchanged (the
	// stray empty line aside), nothing of it or after it.
	want := strings.Replace(reqs[:strings.Index(reqs, "get /d")], "hello\r\nPUT", "helloPUT", 1)
	if got != want {
		t.Fatalf("forwarded %q\nwant %q", got, want)
	}

	// The names a request claims: an absolute or CONNECT target and the
	// Host header, both judged.
	for in, names := range map[string]string{
		"GET http://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n": "[evil.test api.test]",
		"CONNECT evil.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n": "[evil.test api.test]",
		"GET / HTTP/1.0\r\n\r\n":                                   "[]",
		"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n":         "[2001:db8::1]",
		"GET / HTTP/1.1\r\nhOsT: API.test\r\n\r\n":                 "[API.test]",
	} {
		_, judged, _ := exchangeWith(t, in, func([]string) error { return errRefused }, ok200)
		if len(judged) != 1 || fmt.Sprint(judged[0]) != names {
			t.Errorf("%q: judged %v, want %s", in, judged, names)
		}
	}

	// Malformed: nothing of it is forwarded and requests fails.
	for _, bad := range []string{
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n",
		"NOT-HTTP\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\n\n",
		"GET / HTTP/1.1\r\nHost: a\rHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
		"GET /  HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		got, _, err := exchangeWith(t, bad, func([]string) error { return nil }, ok200)
		if err == nil || strings.Contains(got, "\r\n\r\n") && !strings.Contains(bad, "chunked") {
			t.Errorf("requests(%q) = %v, forwarded %q", bad, err, got)
		}
	}
}

// TestExchangeUpgrade: a request carrying Upgrade (or a CONNECT) waits
// for its answer. Answered 101 (200 to CONNECT), the rest is carried as
// it is; answered anything else, the requests after it are still read
// and judged.
func TestExchangeUpgrade(t *testing.T) {
	up := "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	after := "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	refuseEvil := func(names []string) error {
		if len(names) > 0 && names[0] == "evil.test" {
			return errRefused
		}
		return nil
	}
	switched := func(*http.Request) string {
		return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	}
	got, judged, err := exchangeWith(t, up+after, refuseEvil, switched)
	if err != nil || got != up+after || len(judged) != 1 {
		t.Fatalf("101: %v, forwarded %q, judged %v", err, got, judged)
	}
	// Not switched (a server that ignores Upgrade, with interim answers
	// first): the next request is judged, and refused.
	interim := func(r *http.Request) string {
		return "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + ok200(r)
	}
	got, judged, err = exchangeWith(t, up+after, refuseEvil, interim)
	if err != errRefused || got != up || fmt.Sprint(judged) != "[[api.test] [evil.test]]" {
		t.Fatalf("upgrade answered 200: %v, forwarded %q, judged %v", err, got, judged)
	}
	// CONNECT refused by the server (403): still HTTP.
	conn := "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n"
	forbidden := func(*http.Request) string { return "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n" }
	if _, judged, err = exchangeWith(t, conn+after, refuseEvil, forbidden); err != errRefused || len(judged) != 2 {
		t.Fatalf("CONNECT answered 403: %v, judged %v", err, judged)
	}
	// Accepted: opaque.
	tunnel := func(*http.Request) string { return "HTTP/1.1 200 Connection established\r\n\r\n" }
	if got, judged, err = exchangeWith(t, conn+after, refuseEvil, tunnel); err != nil || got != conn+after || len(judged) != 1 {
		t.Fatalf("CONNECT answered 200: %v, forwarded %q, judged %v", err, got, judged)
	}
	// HEAD's answer has no body though it says Content-Length.
	head := "HEAD / HTTP/1.1\r\nHost: api.test\r\n\r\n"
	headAnswer := func(r *http.Request) string {
		if r.Method == http.MethodHead {
			return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
		}
		return ok200(r)
	}
	if _, judged, err = exchangeWith(t, head+up+after, refuseEvil, headAnswer); err != errRefused || len(judged) != 3 {
		t.Fatalf("after HEAD: %v, judged %v", err, judged)
	}
	// Answers that cannot be followed: an Upgrade is refused.
	garbage := func(*http.Request) string { return "SSH-2.0-x\r\n" }
	if _, _, err = exchangeWith(t, up+after, refuseEvil, garbage); err != errUnfollowed {
		t.Fatalf("unparseable answer: %v, want errUnfollowed", err)
	}
}

// TestCloudMetadataRefused: in public mode, where any public address is
// reached (the control: 203.0.113.5), every cloud metadata address is
// refused as such, Azure's wireserver (a public address) included.
func TestCloudMetadataRefused(t *testing.T) {
	g, _ := testGateway(t, &policy.Network{Mode: "public"}, 0)
	if d, _ := g.checkConn(g.pol.Load(), netip.MustParseAddrPort("203.0.113.5:80")); !d.ok {
		t.Fatalf("a public address refused in public mode: %+v", d)
	}
	for _, s := range []string{"169.254.169.254:80", "168.63.129.16:80", "168.63.129.16:32526", "100.100.100.200:80", "192.0.0.192:80", "169.254.170.2:80"} {
		if d, _ := g.checkConn(g.pol.Load(), netip.MustParseAddrPort(s)); d.ok || !strings.Contains(d.rule, "cloud metadata") {
			t.Errorf("checkConn(%s) = %+v, want refused as cloud metadata", s, d)
		}
	}
}

// TestExchangeLongAnswerHead: a server that answers with an endless
// header (any public server is anyone's) is not read into memory: the
// answers stop being followed once the buffer is full, and an Upgrade
// after that is refused.
func TestExchangeLongAnswerHead(t *testing.T) {
	ex := newExchange()
	pr, pw := io.Pipe()
	defer pw.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ex.answers(bufio.NewReaderSize(pr, 4096))
	}()
	ex.sent <- &pending{method: "GET"}
	go func() {
		io.WriteString(pw, "HTTP/1.1 200 OK\r\nX: ")
		for {
			if _, err := pw.Write(bytes.Repeat([]byte("a"), 1024)); err != nil {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("still reading an endless header")
	}
	select {
	case <-ex.lost:
	default:
		t.Fatal("answers stopped without saying so")
	}
	pr.Close()
}
