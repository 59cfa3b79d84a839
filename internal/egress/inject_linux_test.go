package egress

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestSecretThroughProxy: the proxied path (ServeProxy, for runtimes
// whose sandboxes reach the network through their agent's HTTP proxy)
// judges a proxied request as the TUN path does: the rule's header
// injected into an absolute-URL request to its host, the placeholder in
// another host's URL refused.
func TestSecretThroughProxy(t *testing.T) {
	w, rec := newSecretWorld(t)
	g, ev, _ := secretGateway(t, w, injecting())
	got := exchangeOn(proxyConn(t, g), "POST http://api.test/v1/chat HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n")
	if got[0] != "200 auth=Bearer "+realValue+" key=" {
		t.Fatalf("a proxied request to the rule's host: %q", got)
	}
	got = exchangeOn(proxyConn(t, g), "GET http://other.test/x?k=${secrets.openai} HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if !strings.HasPrefix(got[0], "403 "+codeMisdirected) {
		t.Fatalf("a placeholder in a proxied URL: %q", got)
	}
	if strings.Contains(rec.all(), "secrets.") {
		t.Fatalf("the server saw %q", rec.all())
	}
	if !ev.has("security_violation", "the request line") {
		t.Fatalf("no event: %+v", ev.evs)
	}
}

// TestSecretOverTLSThroughProxy: a CONNECT through the proxied path to a
// rule's host is terminated as on the TUN path.
func TestSecretOverTLSThroughProxy(t *testing.T) {
	w, _, roots := tlsWorld(t)
	ca, _ := NewCA()
	fs := &fakeSecrets{values: map[string]string{"openai": realValue}}
	g, _ := w.gateway(t, injecting(), 0, func(o *Options) { o.Secrets, o.Intercept = fs, &Intercept{CA: ca, Roots: roots} })
	c := proxyConn(t, g)
	io.WriteString(c, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", res, err)
	}
	tc := tls.Client(&bufConn{Conn: c, r: br}, &tls.Config{ServerName: "api.test", RootCAs: caPool(t, ca)})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("the handshake with the gateway's certificate: %v", err)
	}
	if got := exchangeOn(tc, post("api.test", "/v1/chat", "", "")); got[0] != "200 auth=Bearer "+realValue+" proto=HTTP/1.1" {
		t.Fatalf("through the proxy over TLS: %q", got)
	}
}

// bufConn reads c through r.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
