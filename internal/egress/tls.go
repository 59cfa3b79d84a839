package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// TLS terminated for the hosts that have rules (issue 33 item 3). A
// request over TLS can be rewritten only once decrypted: for a TLS flow
// whose SNI a rule of the policy covers (and whose address that name
// resolved to in this sandbox), the gateway ends the sandbox's TLS
// itself, with a certificate for that name signed by the server's CA
// (Options.Intercept), dials the real host over TLS verified against the
// host's system roots (or Intercept.Roots), and carries the decrypted
// requests as it carries plain HTTP: each judged, injected and scanned
// (inject.go). Only HTTP/1.1 is offered either way (ALPN). A flow whose
// SNI no rule covers is never decrypted: SNI-checked passthrough. The
// sandbox trusts the CA only if its trust stores carry it (TrustEnv, and
// the bundle the server writes into it: sandbox.Sandbox.TrustEgressCA).

// Intercept is what the gateway terminates TLS with.
type Intercept struct {
	CA *CA
	// Roots verify the real hosts' certificates; nil: the host's system
	// roots.
	Roots *x509.CertPool
}

// CA is the server's certificate authority for the sandboxes: it signs
// the certificates the gateway shows for the hosts it terminates TLS for.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte

	// mu guards leaves.
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// CAFileName is the CA's file under the data dir: its certificate and
// key in PEM, mode 0600.
const CAFileName = "egress-ca.pem"

// leafLife is how long a host's certificate is valid; it is made again
// past half of it.
const leafLife = 24 * time.Hour

// NewCA makes a CA with a new key.
func NewCA() (*CA, error) {
	key, serial, err := newKeySerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "Sheepfold egress gateway CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return parseCA(append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...))
}

// newKeySerial makes a certificate's key and a random serial number.
func newKeySerial() (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	return key, serial, nil
}

// LoadCA reads the CA of dir/CAFileName, making it (0600) at the first
// start. A file others may read is refused.
func LoadCA(dir string) (*CA, error) {
	path := filepath.Join(dir, CAFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		ca, err := NewCA()
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
		_, werr := f.Write(ca.all())
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, fmt.Errorf("egress CA: %w", werr)
		}
		return ca, nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("egress CA: %s may be read by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	ca, err := parseCA(b)
	if err != nil {
		return nil, fmt.Errorf("egress CA %s: %w", path, err)
	}
	return ca, nil
}

// all is the certificate and the key, PEM.
func (ca *CA) all() []byte {
	kder, _ := x509.MarshalECPrivateKey(ca.key.(*ecdsa.PrivateKey))
	return append(bytes.Clone(ca.pem), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
}

func parseCA(b []byte) (*CA, error) {
	ca := &CA{leaves: map[string]*tls.Certificate{}}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, err
			}
			ca.cert, ca.pem = c, pem.EncodeToMemory(blk)
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			ca.key = k
		}
	}
	if ca.cert == nil || ca.key == nil || !ca.cert.IsCA {
		return nil, errors.New("want a CA certificate and its EC private key in PEM")
	}
	return ca, nil
}

// PEM is the CA's certificate: what the sandboxes' trust stores carry.
func (ca *CA) PEM() []byte { return bytes.Clone(ca.pem) }

// maxLeaves bounds the certificates kept.
const maxLeaves = 1024

// leaf returns a certificate for name signed by the CA.
func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && time.Until(c.Leaf.NotAfter) > leafLife/2 {
		return c, nil
	}
	key, serial, err := newKeySerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(leafLife),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[name] = c
	return c, nil
}

// TrustEnv is the environment that points a sandbox's TLS clients at the
// bundle that carries the CA (TrustBundlePath): OpenSSL (Python's ssl,
// curl), requests, pip, git, and Node (which adds TrustCAPath to its own).
func TrustEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE": TrustBundlePath, "REQUESTS_CA_BUNDLE": TrustBundlePath, "CURL_CA_BUNDLE": TrustBundlePath,
		"PIP_CERT": TrustBundlePath, "GIT_SSL_CAINFO": TrustBundlePath, "NODE_EXTRA_CA_CERTS": TrustCAPath,
	}
}

// Where a sandbox's trust stores are: the system bundle, which
// TrustBundlePath is, with the CA added, and the CA alone.
const (
	TrustBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	TrustCAPath     = "/usr/local/share/ca-certificates/sheepfold-egress-ca.crt"
)

// interceptRule returns the rule whose host covers the TLS flow's SNI,
// where the gateway terminates TLS: the address dialled is one a name the
// rule covers resolved to in this sandbox.
func (g *Gateway) interceptRule(pol *policy.Egress, dst netip.Addr, sni string) *policy.InjectRule {
	if g.opt.Intercept == nil || !pol.Injects() || sni == "" {
		return nil
	}
	name, ok := policy.NormalizeName(sni)
	if !ok {
		return nil
	}
	for i := range pol.Inject {
		r := &pol.Inject[i]
		if !r.MatchName(name) {
			continue
		}
		for _, n := range g.namesOf(dst) {
			if r.MatchName(n) {
				return r
			}
		}
	}
	return nil
}

// helloConn is the sandbox's end with the bytes sniffed already read
// again first.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (c *helloConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// handshakeTimeout bounds each TLS handshake of a terminated flow.
const handshakeTimeout = 10 * time.Second

// terminate carries a TLS flow the gateway decrypts: the sandbox's TLS
// ended with a certificate for name, the real host's verified, the
// requests between carried as plain HTTP's are (carryHTTP). hello is
// what was read of the sandbox's ClientHello. It returns when the flow
// is done: false if refused.
func (f *flow) terminate(in net.Conn, up net.Conn, hello []byte, name string) bool {
	g := f.g
	if !f.takeUp() {
		g.report(deny(events.KindNetworkDenied, "tls: the server spoke before the client"), protoTLS, name+" at "+f.target)
		return false
	}
	f.sni, _ = policy.NormalizeName(name)
	ca := g.opt.Intercept.CA
	sc := tls.Server(&helloConn{Conn: in, r: io.MultiReader(bytes.NewReader(hello), in)}, &tls.Config{
		MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.leaf(name) },
	})
	ctx, cancel := context.WithTimeout(f.ctx, handshakeTimeout)
	defer cancel()
	if err := sc.HandshakeContext(ctx); err != nil {
		g.seen.handshakeFailed.Add(1)
		g.log.Info("egress tls: the sandbox's handshake failed (does it trust the CA?)", "target", name+" at "+f.target, "err", err)
		return false
	}
	uc := tls.Client(up, &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}, ServerName: name,
		RootCAs: g.opt.Intercept.Roots})
	if err := uc.HandshakeContext(ctx); err != nil {
		g.seen.handshakeFailed.Add(1)
		g.report(deny(events.KindNetworkDenied, "tls: the real host's certificate did not verify: "+err.Error()), protoTLS, name+" at "+f.target)
		_ = sc.Close()
		return false
	}
	cancel()
	g.log.Info("egress tls terminated", "target", name+" at "+f.target)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.answers(sc, uc)
		if f.reply.Load() == nil {
			_ = sc.CloseWrite()
		}
	}()
	ok := f.carryHTTP(bufio.NewReaderSize(sc, 16<<10), uc)
	if ok {
		_ = uc.CloseWrite()
		select {
		case <-done:
		case <-f.ctx.Done():
		}
		return true
	}
	f.replyAfter(done, sc, func() { uc.Close() })
	_ = sc.CloseWrite() // close_notify after the answer, over the TLS that carried it
	return false
}

// takeUp takes the outside end from the answers that splice follows
// before the flow is judged, so that the TLS client can read it: false
// if the server spoke first (its bytes went on to the sandbox already).
func (f *flow) takeUp() bool {
	f.mu.Lock()
	f.takeover = true
	raw, done := f.up, f.answering
	f.mu.Unlock()
	if raw == nil || done == nil {
		return false
	}
	_ = raw.SetReadDeadline(time.Now())
	select {
	case <-done:
	case <-f.ctx.Done():
		return false
	}
	_ = raw.SetReadDeadline(time.Time{})
	return !f.spoke.Load()
}
