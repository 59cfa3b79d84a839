package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
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
	if d, _ := g.checkConn(ap("203.0.113.10:80")); d.ok {
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
		d, byName := g.checkConn(ap(c.dst))
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
		if d := g.checkName(name, 80); d.ok != ok {
			t.Errorf("checkName(%q) = %+v, want ok %v", name, d, ok)
		}
	}
	// A policy without network refuses everything from then on.
	none, _ := policy.CompileEgress(nil)
	g.SetPolicy(none, 0)
	if d, _ := g.checkConn(ap("203.0.113.10:80")); d.ok {
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
		{"http", []byte("GET /x HTTP/1.1\r\nHost: api.test:8080\r\nUser-Agent: t\r\n\r\nbody"), protoHTTP, "api.test"},
		{"http ipv6 host", []byte("POST / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\nContent-Length: 0\r\n\r\n"), protoHTTP, "2001:db8::1"},
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
	for in, want := range map[string]string{"": "", "G": "", "GE": "", "GET ": protoHTTP, "GETX": protoOther,
		"\x16\x03\x01": protoTLS, "PO": "", "POST /": protoHTTP, "x": protoOther, "CONNECT a:1": protoHTTP} {
		if got := classify([]byte(in)); got != want {
			t.Errorf("classify(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestForwardHTTP(t *testing.T) {
	reqs := "GET /a HTTP/1.1\r\nHost: api.test\r\n\r\n" +
		"POST /b HTTP/1.1\r\nHost: api.test:80\r\nContent-Length: 5\r\n\r\nhello" +
		"\r\n" + // a stray empty line between requests
		"PUT /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: 1\r\n\r\n" +
		"GET /d HTTP/1.1\r\nHost: evil.test\r\n\r\n" +
		"GET /e HTTP/1.1\r\nHost: api.test\r\n\r\n"
	var out bytes.Buffer
	var hosts []string
	err := forwardHTTP(bufio.NewReader(strings.NewReader(reqs)), &out, func(host string) bool {
		hosts = append(hosts, host)
		return host == "api.test"
	})
	if err != errRefused {
		t.Fatalf("forwardHTTP = %v, want errRefused", err)
	}
	if want := []string{"api.test", "api.test", "api.test", "evil.test"}; fmt.Sprint(hosts) != fmt.Sprint(want) {
		t.Fatalf("judged %v, want %v", hosts, want)
	}
	// Everything before the refused request went through unchanged (the
	// stray empty line aside), nothing of it or after it.
	want := strings.Replace(reqs[:strings.Index(reqs, "GET /d")], "hello\r\nPUT", "helloPUT", 1)
	if out.String() != want {
		t.Fatalf("forwarded %q\nwant %q", out.String(), want)
	}

	// An upgraded stream is carried as it is after its request.
	out.Reset()
	up := "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	n := 0
	if err := forwardHTTP(bufio.NewReader(strings.NewReader(up)), &out, func(string) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if out.String() != up || n != 1 {
		t.Fatalf("upgrade: forwarded %q, judged %d", out.String(), n)
	}
	// Malformed: a bad chunk size, a header block without its end.
	for _, bad := range []string{
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n",
		"NOT-HTTP\r\n\r\n",
	} {
		if err := forwardHTTP(bufio.NewReader(strings.NewReader(bad)), io.Discard, func(string) bool { return true }); err == nil {
			t.Errorf("forwardHTTP(%q) = nil", bad)
		}
	}
}

// TestCloudMetadataRefused: in public mode, where any public address is
// reached (the control: 203.0.113.5), every cloud metadata address is
// refused as such, Azure's wireserver (a public address) included.
func TestCloudMetadataRefused(t *testing.T) {
	g, _ := testGateway(t, &policy.Network{Mode: "public"}, 0)
	if d, _ := g.checkConn(netip.MustParseAddrPort("203.0.113.5:80")); !d.ok {
		t.Fatalf("a public address refused in public mode: %+v", d)
	}
	for _, s := range []string{"169.254.169.254:80", "168.63.129.16:80", "168.63.129.16:32526", "100.100.100.200:80", "192.0.0.192:80", "169.254.170.2:80"} {
		if d, _ := g.checkConn(netip.MustParseAddrPort(s)); d.ok || !strings.Contains(d.rule, "cloud metadata") {
			t.Errorf("checkConn(%s) = %+v, want refused as cloud metadata", s, d)
		}
	}
}
