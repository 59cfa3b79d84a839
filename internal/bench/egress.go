package bench

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Names of the egress scenarios.
const (
	benchHTTPSHost    = "HTTPS GET 1 KiB from the host"
	benchHTTPSGateway = "HTTPS GET 1 KiB through the egress gateway"
	benchHTTPNoRule   = "HTTP GET 1 KiB through the egress gateway, no rule"
	benchHTTPInject   = "HTTP GET 1 KiB through the egress gateway, a rule injecting a secret"
	benchHTTPSInject  = "HTTPS GET 1 KiB through the egress gateway, a rule injecting a secret (TLS terminated)"
)

// benchSecret is the secret the injecting rule puts into requests.
const benchSecret = "sk-bench-0123456789abcdef"

// benchSecrets resolves benchSecret: an in-memory store, so that the
// figure is the gateway's own cost (the server's store adds a read of
// the sealed value: BenchmarkEgressSecretsResolve in internal/server).
type benchSecrets struct{}

func (benchSecrets) Resolve(context.Context, string, string) ([]byte, error) {
	return []byte(benchSecret), nil
}

func (benchSecrets) Used(egress.SecretUse) {}

// getScript times n GETs of /file from name:port, each on a new
// connection (TCP and, when a CA file is given, TLS handshakes
// included), after two unmeasured ones, checks that the answer ends with
// 1 KiB of want (the server answers x to a request carrying the secret,
// y to one without), and prints the milliseconds as JSON. The same
// script runs on the host and in a sandbox, so both sides pay the same
// client costs; the address is resolved once (given on the host, where
// name has none). Arguments: name port ca|"" n want [ip].
const getScript = `
import json, socket, ssl, sys, time
name, port, ca, n, want = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5].encode()
ip = sys.argv[6] if len(sys.argv) > 6 else socket.gethostbyname(name)
ctx = ssl.create_default_context(cafile=ca) if ca else None
req = ("GET /file HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name).encode()
out = []
for i in range(n + 2):
    t = time.perf_counter()
    s = socket.create_connection((ip, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as curl does; else Nagle meets delayed ACKs
    if ctx:
        s = ctx.wrap_socket(s, server_hostname=name)
    s.sendall(req)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    assert data.endswith(want * 1024), data[:200]
    if i >= 2:
        out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
`

// egressBench measures an HTTPS GET of a small file from a loopback server,
// once from the host and once from a sandbox through the egress gateway.
// The gateway's test network (never reachable from the API) maps the
// sandbox's allowed name to the loopback server.
func egressBench(ctx context.Context, cfg config.Config, n int, res *benchResults) error {
	dir, err := os.MkdirTemp("", "sheepfold-bench-egress-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	certPEM, cert, err := benchCert("files.bench")
	if err != nil {
		return err
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, certPEM, 0o644); err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	file := bytes.Repeat([]byte("x"), 1024)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write(file)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	addr := netip.MustParseAddrPort(ln.Addr().String())

	// The plain HTTP server of the injection scenarios: x for a request
	// that carries the secret, y for one that does not.
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	other := bytes.Repeat([]byte("y"), 1024)
	hsrv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+benchSecret {
			w.Write(file)
			return
		}
		w.Write(other)
	})}
	go hsrv.Serve(hln)
	defer hsrv.Close()

	// From a sandbox, through the gateway.
	virtual, api := netip.MustParseAddr("203.0.113.80"), netip.MustParseAddr("203.0.113.81")
	test := &egress.TestNet{
		Hosts: map[string][]netip.Addr{"files.bench": {virtual}, "api.bench": {api}},
		Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(virtual, 443): addr,
			netip.AddrPortFrom(api, 80): netip.MustParseAddrPort(hln.Addr().String())},
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ca, err := egress.NewCA()
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	eng, err := engine.Open(ctx, cfg, fmt.Sprintf("bench-egress-%d", os.Getpid()), 0, quiet, func(c *sandbox.Config) {
		c.Egress.Test = test
		c.Egress.Secrets = benchSecrets{}
		c.Egress.Intercept = &egress.Intercept{CA: ca, Roots: roots}
	})
	if err != nil {
		return err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	sb, err := eng.Create(ctx, sandbox.CreateOptions{Policy: &policy.Policy{
		Network: &policy.Network{Mode: policy.NetworkAllowlist, Allow: []string{"files.bench:443"}}}})
	if err != nil {
		return err
	}
	if _, err := sb.WriteFile(ctx, "/tmp/ca.pem", bytes.NewReader(certPEM), 0o644, 1<<20); err != nil {
		return err
	}
	// The same GETs from a sandbox whose rule injects a secret into them:
	// the gateway terminates their TLS with its CA, which the sandbox
	// trusts, and verifies the server's certificate.
	tlsRule := &policy.Network{Mode: policy.NetworkAllowlist, Allow: []string{"files.bench:443"}, Rules: []policy.NetworkRule{{
		Host: "files.bench", Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${secrets.bench}"}}}}}
	sbTLS, err := eng.Create(ctx, sandbox.CreateOptions{Policy: &policy.Policy{Network: tlsRule}})
	if err != nil {
		return err
	}
	if _, err := sbTLS.WriteFile(ctx, "/tmp/ca.pem", bytes.NewReader(ca.PEM()), 0o644, 1<<20); err != nil {
		return err
	}
	// Rounds alternate between the host and the sandboxes, so that all
	// see the same load on a shared machine.
	const perRound = 5
	var hostMS, gwMS, tlsMS []float64
	for len(gwMS) < n {
		m := min(perRound, n-len(gwMS))
		h, err := hostGets(ctx, addr, caFile, m)
		if err != nil {
			return err
		}
		g, err := sandboxGets(ctx, sb, m)
		if err != nil {
			return err
		}
		i, err := sandboxGets(ctx, sbTLS, m)
		if err != nil {
			return err
		}
		hostMS, gwMS, tlsMS = append(hostMS, h...), append(gwMS, g...), append(tlsMS, i...)
	}
	res.Scenarios[benchHTTPSHost] = summarize(hostMS)
	res.Scenarios[benchHTTPSGateway] = summarize(gwMS)
	res.Scenarios[benchHTTPSInject] = summarize(tlsMS)
	res.order = append(res.order, benchHTTPSHost, benchHTTPSGateway, benchHTTPSInject)
	return injectBench(ctx, eng, n, res)
}

// injectBench measures the same plain HTTP GETs from two sandboxes, one
// whose policy has no rule and one whose rule puts a secret into every
// request (internal/egress, inject.go), in alternating rounds.
func injectBench(ctx context.Context, eng *engine.Engine, n int, res *benchResults) error {
	plain := &policy.Network{Mode: policy.NetworkAllowlist, Allow: []string{"api.bench:80"}}
	ruled := *plain
	ruled.Rules = []policy.NetworkRule{{Host: "api.bench", Methods: []string{"GET"}, PathPrefix: "/",
		Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${secrets.bench}"}}}}
	sbPlain, err := eng.Create(ctx, sandbox.CreateOptions{Policy: &policy.Policy{Network: plain}})
	if err != nil {
		return err
	}
	sbRule, err := eng.Create(ctx, sandbox.CreateOptions{Policy: &policy.Policy{Network: &ruled}})
	if err != nil {
		return err
	}
	const perRound = 5
	var plainMS, ruleMS []float64
	for len(ruleMS) < n {
		m := min(perRound, n-len(ruleMS))
		p, err := sandboxScript(ctx, sbPlain, "api.bench", "80", "", fmt.Sprint(m), "y")
		if err != nil {
			return err
		}
		r, err := sandboxScript(ctx, sbRule, "api.bench", "80", "", fmt.Sprint(m), "x")
		if err != nil {
			return err
		}
		plainMS, ruleMS = append(plainMS, p...), append(ruleMS, r...)
	}
	res.Scenarios[benchHTTPNoRule] = summarize(plainMS)
	res.Scenarios[benchHTTPInject] = summarize(ruleMS)
	res.order = append(res.order, benchHTTPNoRule, benchHTTPInject)
	return nil
}

// hostGets runs the GETs from the host, straight to the loopback server.
func hostGets(ctx context.Context, addr netip.AddrPort, ca string, n int) ([]float64, error) {
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", getScript,
		"files.bench", fmt.Sprint(addr.Port()), ca, fmt.Sprint(n), "x", addr.Addr().String()).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("host GET: %v: %s", err, out)
	}
	var ms []float64
	if err := json.Unmarshal(out, &ms); err != nil {
		return nil, fmt.Errorf("host GET: %v: %s", err, out)
	}
	return ms, nil
}

// sandboxGets runs the GETs in sb, through the gateway.
func sandboxGets(ctx context.Context, sb *sandbox.Sandbox, n int) ([]float64, error) {
	return sandboxScript(ctx, sb, "files.bench", "443", "/tmp/ca.pem", fmt.Sprint(n), "x")
}

// sandboxScript runs getScript in sb with args and returns the
// milliseconds it printed.
func sandboxScript(ctx context.Context, sb *sandbox.Sandbox, args ...string) ([]float64, error) {
	var stdout, stderr bytes.Buffer
	r, err := sb.Run(ctx, sandbox.ProcessSpec{Cmd: "python3", Args: append([]string{"-c", getScript}, args...),
		TimeoutMS: 120_000}, func(ev agentproto.Event) {
		switch ev.Type {
		case agentproto.EventStdout:
			stdout.Write(ev.Data)
		case agentproto.EventStderr:
			stderr.Write(ev.Data)
		}
	})
	if err != nil {
		return nil, err
	}
	var ms []float64
	if r.ExitCode != 0 || json.Unmarshal(stdout.Bytes(), &ms) != nil {
		return nil, fmt.Errorf("sandbox GET: exit %d: %s %s\ngateway: %s", r.ExitCode, stdout.String(), stderr.String(), sb.EgressDiagnosis())
	}
	return ms, nil
}

// benchCert makes a self-signed certificate for name.
func benchCert(name string) ([]byte, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return certPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
