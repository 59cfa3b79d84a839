package egress

import (
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
