package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// The TLS tests: a loopback HTTPS server plays api.test and other.test
// (port 443) with a certificate for both from a test root, which the
// gateway's Intercept.Roots trusts in place of the system's.

// testRoot makes a root and a server certificate for names.
func testRoot(t *testing.T, names ...string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	rkey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rt := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	rder, err := x509.CreateCertificate(rand.Reader, rt, rt, &rkey.PublicKey, rkey)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(rder)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, lt, root, &key.PublicKey, rkey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsWorld is newSecretWorld's server over TLS at port 443.
func tlsWorld(t *testing.T) (*flowWorld, *outside, *x509.CertPool) {
	t.Helper()
	w, rec := newSecretWorld(t)
	roots, cert := testRoot(t, "api.test", "other.test")
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.seen = append(rec.seen, fmt.Sprintf("%s %s host=%s auth=%s\n%s", r.Method, r.RequestURI, r.Host, r.Header.Get("Authorization"), b))
		rec.mu.Unlock()
		fmt.Fprintf(rw, "auth=%s proto=%s", r.Header.Get("Authorization"), r.Proto)
	}))
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)
	to := netip.MustParseAddrPort(hs.Listener.Addr().String())
	w.test.Routes[netip.AddrPortFrom(apiIP, 443)] = to
	w.test.Routes[netip.AddrPortFrom(otherIP, 443)] = to
	return w, rec, roots
}

// tlsDial is the sandbox's TLS client to name through g, trusting roots.
func tlsDial(t *testing.T, g *Gateway, dst, name string, roots *x509.CertPool) (*tls.Conn, error) {
	t.Helper()
	c := dialFlow(t, g, dst)
	if c == nil {
		t.Fatalf("the gateway refused %s", dst)
	}
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
	return tc, tc.Handshake()
}

func caPool(t *testing.T, ca *CA) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(ca.PEM()) {
		t.Fatal("the CA's PEM")
	}
	return p
}

// TestSecretOverTLS: the gateway terminates TLS for the host a rule
// names (the sandbox sees a certificate from the server's CA, HTTP/1.1),
// verifies the real host, injects the header and refuses a placeholder
// in the body as on plain HTTP. A host no rule names is never decrypted:
// the sandbox sees the real host's certificate. The control: without
// Intercept, the rule's host is carried through too, nothing injected.
func TestSecretOverTLS(t *testing.T) {
	w, rec, roots := tlsWorld(t)
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeSecrets{values: map[string]string{"openai": realValue}}
	g, ev := w.gateway(t, injecting(), 0, func(o *Options) { o.Secrets, o.Intercept = fs, &Intercept{CA: ca, Roots: roots} })

	c, err := tlsDial(t, g, "203.0.113.10:443", "api.test", caPool(t, ca))
	if err != nil {
		t.Fatalf("the handshake with the gateway's certificate: %v", err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Fatalf("ALPN %q", p)
	}
	got := exchangeOn(c, post("api.test", "/v1/chat", "", "{}"), post("api.test", "/v1/chat", "", `{"k":"${secrets.openai}"}`))
	if len(got) != 2 || got[0] != "200 auth=Bearer "+realValue+" proto=HTTP/1.1" || !strings.HasPrefix(got[1], "403 "+codeMisdirected) {
		t.Fatalf("over terminated TLS: %q\n%s", got, rec.all())
	}
	if !ev.has(events.SecurityViolation, "the body") {
		t.Fatalf("no secret_misdirected event: %+v", ev.evs)
	}
	// After the refusal the TLS connection ends cleanly: nothing but TLS
	// records came after the answer.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the refusal: %v, want EOF", err)
	}

	// other.test has no rule: not decrypted, the real certificate.
	if _, err := tlsDial(t, g, "203.0.113.11:443", "other.test", caPool(t, ca)); err == nil {
		t.Fatal("a host without a rule was decrypted")
	}
	oc, err := tlsDial(t, g, "203.0.113.11:443", "other.test", roots)
	if err != nil {
		t.Fatalf("passthrough: %v", err)
	}
	if p := oc.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("passthrough negotiated %q, want the real server's h2", p)
	}

	// The control: no Intercept, the rule's host goes through as it is.
	g0, _ := w.gateway(t, injecting(), 0, func(o *Options) { o.Secrets = fs })
	if _, err := tlsDial(t, g0, "203.0.113.10:443", "api.test", roots); err != nil {
		t.Fatalf("without Intercept: %v", err)
	}
	if strings.Contains(rec.all(), "secrets.") {
		t.Fatalf("the server saw a placeholder: %q", rec.all())
	}
}

// TestSecretTLSUpstreamVerified: the gateway verifies the real host: a
// certificate the roots do not trust ends the flow (network_denied),
// and no request is sent.
func TestSecretTLSUpstreamVerified(t *testing.T) {
	w, rec, _ := tlsWorld(t)
	ca, _ := NewCA()
	fs := &fakeSecrets{values: map[string]string{"openai": realValue}}
	g, ev := w.gateway(t, injecting(), 0, func(o *Options) {
		o.Secrets, o.Intercept = fs, &Intercept{CA: ca, Roots: x509.NewCertPool()}
	})
	c, err := tlsDial(t, g, "203.0.113.10:443", "api.test", caPool(t, ca))
	if err == nil {
		if got := exchangeOn(c, post("api.test", "/v1/chat", "", "")); got[0] != "refused" {
			t.Fatalf("an unverified host answered %q", got)
		}
	}
	if !ev.has(events.SecurityViolation, "did not verify") {
		t.Fatalf("no event: %+v", ev.evs)
	}
	if s := rec.all(); s != "" {
		t.Fatalf("the server got %q", s)
	}
}

// TestLoadCA: made at the first start (0600), the same after; a file
// others may read is refused.
func TestLoadCA(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadCA(dir)
	if err != nil || string(a.PEM()) != string(b.PEM()) {
		t.Fatalf("loaded again: %v", err)
	}
	fi, _ := os.Stat(filepath.Join(dir, CAFileName))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	os.Chmod(filepath.Join(dir, CAFileName), 0o644)
	if _, err := LoadCA(dir); err == nil {
		t.Fatal("a readable CA file was accepted")
	}
	if strings.Contains(string(a.PEM()), "PRIVATE") {
		t.Fatal("the CA's PEM holds its key")
	}
	var _ net.Conn = (*tls.Conn)(nil)
	_ = policy.NetworkAllowlist
}
