package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// proxyGateway is a gateway whose api.test (203.0.113.10) and other.test
// (203.0.113.11) answer on port 80 through an HTTP server on the loopback
// that says which Host it was asked for.
func proxyGateway(t *testing.T, n *policy.Network, limit int64) (*Gateway, *sink) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host+" "+r.URL.RequestURI())
	}))
	t.Cleanup(up.Close)
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	pol, err := policy.CompileEgress(n)
	if err != nil {
		t.Fatal(err)
	}
	ev := &sink{}
	g, err := New(Options{Events: ev, Test: &TestNet{
		Hosts: map[string][]netip.Addr{
			"api.test":    {netip.MustParseAddr("203.0.113.10")},
			"other.test":  {netip.MustParseAddr("203.0.113.11")},
			"rebind.test": {netip.MustParseAddr("127.0.0.1")},
		},
		Routes: map[netip.AddrPort]netip.AddrPort{
			netip.MustParseAddrPort("203.0.113.10:80"): upAddr,
			netip.MustParseAddrPort("203.0.113.11:80"): upAddr,
		},
	}}, "sb1", pol, limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, ev
}

// proxyConn is the sandbox's end of a connection ServeProxy serves.
func proxyConn(t *testing.T, g *Gateway) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	go g.ServeProxy(s.(*net.TCPConn))
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func proxyGet(t *testing.T, g *Gateway, req string) (int, string, http.Header) {
	t.Helper()
	c := proxyConn(t, g)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

func TestServeProxy(t *testing.T) {
	t.Parallel()
	g, ev := proxyGateway(t, &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "rebind.test"}}, 0)

	// A plain request in absolute form goes on in origin form.
	if code, body, _ := proxyGet(t, g, "GET http://api.test/x?y=1 HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n"); code != 200 || body != "hello from api.test /x?y=1" {
		t.Fatalf("allowed GET: %d %q", code, body)
	}
	// CONNECT, then the tunnel carries what the client sends.
	c := proxyConn(t, g)
	io.WriteString(c, "CONNECT api.test:80 HTTP/1.1\r\nHost: api.test:80\r\nProxy-Connection: keep-alive\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", res, err)
	}
	io.WriteString(c, "GET /in HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if string(b) != "hello from api.test /in" {
		t.Fatalf("through the tunnel: %q", b)
	}

	// Refused: a name not allowed, a name rebound to the loopback, an
	// address, and in allowlist mode a Host the tunnel's name does not
	// allow.
	for _, req := range []string{
		"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"CONNECT other.test:443 HTTP/1.1\r\n\r\n",
		"GET http://rebind.test/ HTTP/1.1\r\nHost: rebind.test\r\n\r\n",
		"CONNECT 203.0.113.11:80 HTTP/1.1\r\n\r\n",
	} {
		code, body, h := proxyGet(t, g, req)
		if code != http.StatusForbidden || h.Get("X-Sheepfold-Error") != "ERR_NETWORK_RESTRICTED" || !strings.HasPrefix(body, "ERR_NETWORK_RESTRICTED: ") {
			t.Errorf("%q: %d %q", req, code, body)
		}
	}
	c = proxyConn(t, g)
	io.WriteString(c, "CONNECT api.test:80 HTTP/1.1\r\n\r\n")
	br = bufio.NewReader(c)
	if res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || res.StatusCode != 200 {
		t.Fatalf("CONNECT: %v", err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if res, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("a Host the allowlist does not name went through: %d", res.StatusCode)
	}
	var kinds []string
	ev.mu.Lock()
	for _, e := range ev.evs {
		if e.Type == events.SecurityViolation {
			kinds = append(kinds, e.Details["kind"].(string))
		}
	}
	ev.mu.Unlock()
	if len(kinds) < 4 {
		t.Fatalf("violations reported: %v", kinds)
	}

	// Not a proxy request.
	for _, req := range []string{"GET /relative HTTP/1.1\r\n\r\n", "hello\r\n", "GET https://api.test/ HTTP/1.1\r\n\r\n", "CONNECT api.test HTTP/1.1\r\n\r\n"} {
		if code, _, _ := proxyGet(t, g, req); code != http.StatusBadRequest {
			t.Errorf("%q: %d, want 400", req, code)
		}
	}
}

// TestServeProxyRequestLimit: network_requests bounds proxied
// connections as it bounds the TUN path's.
func TestServeProxyRequestLimit(t *testing.T) {
	t.Parallel()
	g, _ := proxyGateway(t, &policy.Network{Mode: "public"}, 2)
	for i := range 3 {
		code, _, _ := proxyGet(t, g, "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
		if want := map[bool]int{true: 200, false: http.StatusTooManyRequests}[i < 2]; code != want {
			t.Fatalf("request %d: %d, want %d", i+1, code, want)
		}
	}
	if g.Requests() != 2 {
		t.Fatalf("requests counted %d", g.Requests())
	}
}
