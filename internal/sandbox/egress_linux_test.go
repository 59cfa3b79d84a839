package sandbox_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// eventLog collects the events an engine emits.
type eventLog struct {
	mu  sync.Mutex
	all []events.Event
}

func (l *eventLog) Emit(e events.Event) {
	l.mu.Lock()
	l.all = append(l.all, e)
	l.mu.Unlock()
}

// find returns the events of sandbox id of type typ whose details have
// key == value.
func (l *eventLog) find(id string, typ events.Type, key, value string) []events.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []events.Event
	for _, e := range l.all {
		if e.SandboxID == id && e.Type == typ && fmt.Sprint(e.Details[key]) == value {
			out = append(out, e)
		}
	}
	return out
}

// loopbackServer serves h on 127.0.0.1 and returns its address.
func loopbackServer(t *testing.T, h http.Handler) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

// networkEngine is a runc engine whose gateway sees test: the names and
// routes of loopback servers.
func networkEngine(t *testing.T, test *egress.TestNet) (*sandbox.Manager, *eventLog) {
	log := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = log
		c.Egress.Test = test
	})
	return m, log
}

func allowlist(allow ...string) *policy.Policy {
	return &policy.Policy{Network: &policy.Network{Mode: policy.NetworkAllowlist, Allow: allow}}
}

// py runs Python code as a process and returns its stdout, failing the
// test if it exits non-zero.
func py(t *testing.T, s *sandbox.Sandbox, code string) string {
	t.Helper()
	res, out, errOut := runAs(t, s, "", "python3", "-c", code)
	if res.ExitCode != 0 {
		t.Fatalf("python exited %d: %s\n%s", res.ExitCode, out, errOut)
	}
	return strings.TrimSpace(out)
}

func TestEgressAllowlistHTTP(t *testing.T) {
	srv := loopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	}))
	api := netip.MustParseAddr("203.0.113.10")
	m, log := networkEngine(t, &egress.TestNet{
		Hosts:  map[string][]netip.Addr{"api.test": {api}, "other.test": {netip.MustParseAddr("203.0.113.11")}},
		Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 80): srv},
	})
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})

	got := py(t, s, `import urllib.request; print(urllib.request.urlopen("http://api.test/x", timeout=10).read().decode())`)
	if got != "hello from api.test" {
		t.Fatalf("allowed GET = %q", got)
	}
	if ev := log.find(s.ID, events.SecurityViolation, "kind", events.KindNetworkDenied); len(ev) != 0 {
		t.Errorf("allowed GET reported a violation: %+v", ev)
	}

	// A name outside the allowlist does not resolve, and says so.
	got = py(t, s, `
import socket
try:
    print(socket.getaddrinfo("other.test", 80))
except socket.gaierror as e:
    print("gaierror", e.errno == socket.EAI_NONAME)`)
	if got != "gaierror True" {
		t.Fatalf("denied name: %q", got)
	}
	if ev := log.find(s.ID, events.SecurityViolation, "target", "other.test"); len(ev) != 1 || ev[0].Details["kind"] != events.KindDNSDenied {
		t.Errorf("denied name events = %+v", ev)
	}
}

// A policy change reaches the gateway at once: mode none refuses the next
// connection, the allowlist back allows it; a sandbox made without a
// network cannot gain one.
func TestEgressPolicyChange(t *testing.T) {
	srv := loopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	api := netip.MustParseAddr("203.0.113.10")
	m, _ := networkEngine(t, &egress.TestNet{
		Hosts:  map[string][]netip.Addr{"api.test": {api}},
		Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 80): srv},
	})
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	get := netProbe + `
print(get("api.test"), end="")`
	steps := []struct {
		pol  *policy.Policy
		want string
	}{
		{allowlist("api.test"), "ok"},
		{&policy.Policy{Network: &policy.Network{Mode: policy.NetworkNone}}, "gaierror"},
		{allowlist("other.test"), "gaierror"},
		{allowlist("api.test"), "ok"},
	}
	for i, st := range steps {
		if _, err := s.SetPolicy(st.pol); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := py(t, s, get); got != st.want {
			t.Fatalf("step %d (%+v): %q, want %q", i, st.pol.Network, got, st.want)
		}
	}
	plain := newSandbox(t, m, sandbox.CreateOptions{})
	_, err := plain.SetPolicy(allowlist("api.test"))
	if apierr.From(err).Code != apierr.InvalidPolicy {
		t.Fatalf("gaining a network: %v, want ERR_INVALID_POLICY", err)
	}
	if _, err := m.Create(context.Background(), sandbox.CreateOptions{Policy: allowlist("bad host")}); apierr.From(err).Code != apierr.InvalidPolicy {
		t.Fatalf("bad allow entry: %v, want ERR_INVALID_POLICY", err)
	}
}

// A sandbox without a network policy has its loopback alone, as before.
func TestEgressNoneHasOnlyLoopback(t *testing.T) {
	m, _ := networkEngine(t, nil)
	for _, pol := range []*policy.Policy{nil, {Network: &policy.Network{Mode: policy.NetworkNone}}} {
		s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol})
		// The interfaces as the sandbox's kernel lists them (gVisor's
		// Sentry has no /sys/class/net).
		got := py(t, s, `import socket; print(sorted(n for _, n in socket.if_nameindex()))
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("203.0.113.10", 80)); print("connected")
except OSError as e:
    print(e.errno)`)
		if want := "['lo']\n101"; got != want { // ENETUNREACH: fails at once
			t.Errorf("policy %+v: %q, want %q", pol, got, want)
		}
	}
}

// netProbe is Python the egress tests run before their checks: each helper
// prints what happened rather than raising, so one run checks many cases.
const netProbe = `
import socket, ssl, struct, http.client, errno as E
def err(e):
    if isinstance(e, socket.gaierror): return "gaierror"
    if isinstance(e, ssl.SSLError): return "ssl"
    if isinstance(e, (socket.timeout, TimeoutError)): return "timeout"
    if isinstance(e, http.client.HTTPException): return "closed"
    if getattr(e, "errno", None): return E.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__
def tcp(host, port, data=b"ping\n"):
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(data)
        return s.recv(100).decode()
    except Exception as e:
        return err(e)
def get(host, port=80, path="/x", hdr=None):
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", path, headers={"Host": hdr or host})
        return c.getresponse().read().decode()
    except Exception as e:
        return err(e)
def tls(host, sni, port=443):
    try:
        ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
        ctx.check_hostname = False
        s = ctx.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=sni)
        s.sendall(("GET /x HTTP/1.0\r\nHost: %s\r\n\r\n" % sni).encode())
        return s.recv(4096).decode().split("\r\n\r\n", 1)[-1]
    except Exception as e:
        return err(e)
def dns(name, qtype=1):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, ("10.255.255.1", 53))
    r = s.recv(4096)
    return {0: "NOERROR", 3: "NXDOMAIN", 5: "REFUSED"}.get(r[3] & 15, str(r[3] & 15)) + "/%d" % struct.unpack(">H", r[6:8])[0]
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.connect((host, port)); s.send(b"x"); s.recv(10); return "answered"
    except Exception as e:
        return err(e)
def v6(host, port):
    try:
        socket.create_connection((host, port), timeout=5); return "connected"
    except Exception as e:
        return err(e)
`

// egressWorld is the loopback world of the egress tests: an HTTP and an
// HTTPS server playing api.test, a raw TCP echo server in an allowed
// CIDR, and a stand-in for the server's own listener.
type egressWorld struct {
	test    *egress.TestNet
	self    netip.AddrPort
	caPEM   []byte
	httpSrv netip.AddrPort
}

var (
	apiAddr    = netip.MustParseAddr("203.0.113.10")
	evilAddr   = netip.MustParseAddr("203.0.113.30")
	selfAddr   = netip.MustParseAddr("203.0.113.20")
	cidrAddr   = netip.MustParseAddr("198.51.100.7")
	pypiAddr   = netip.MustParseAddr("203.0.113.40")
	loopbackGW = netip.MustParseAddr("127.0.0.1")
)

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	})
	mux := http.NewServeMux()
	mux.Handle("/", hello)
	wheelName, wheel := testWheel(t)
	sum := sha256.Sum256(wheel)
	mux.HandleFunc("/simple/tinypkg/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%x">%s</a></body></html>`, wheelName, sum, wheelName)
	})
	mux.HandleFunc("/files/"+wheelName, func(w http.ResponseWriter, r *http.Request) { w.Write(wheel) })
	mux.Handle("/repo.git/", http.StripPrefix("/repo.git/", http.FileServer(http.Dir(testRepo(t)))))
	httpSrv := loopbackServer(t, hello)
	certPEM, keyPEM := testCert(t, "api.test", "evil.test", "pypi.test")
	httpsSrv := loopbackTLSServer(t, mux, certPEM, keyPEM)
	echo := echoServer(t)
	self := loopbackServer(t, hello)
	return &egressWorld{
		self: self, caPEM: certPEM, httpSrv: httpSrv,
		test: &egress.TestNet{
			Hosts: map[string][]netip.Addr{
				"api.test":    {apiAddr},
				"evil.test":   {evilAddr},
				"self.test":   {selfAddr},
				"rebind.test": {loopbackGW},
				"meta.test":   {netip.MustParseAddr("169.254.169.254")},
				"mixed.test":  {netip.MustParseAddr("10.0.0.1"), apiAddr},
				"pypi.test":   {pypiAddr},
			},
			Routes: map[netip.AddrPort]netip.AddrPort{
				netip.AddrPortFrom(apiAddr, 80):    httpSrv,
				netip.AddrPortFrom(apiAddr, 443):   httpsSrv,
				netip.AddrPortFrom(evilAddr, 80):   httpSrv,
				netip.AddrPortFrom(cidrAddr, 9000): echo,
				netip.AddrPortFrom(selfAddr, 80):   self,
				netip.AddrPortFrom(pypiAddr, 443):  httpsSrv,
			},
		},
	}
}

// echoServer answers each line on a connection with "echo: " and the line.
func echoServer(t *testing.T) netip.AddrPort {
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
				b := make([]byte, 100)
				n, _ := c.Read(b)
				c.Write(append([]byte("echo: "), b[:n]...))
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

func (w *egressWorld) engine(t *testing.T) (*sandbox.Manager, *eventLog) {
	log := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = log
		c.Egress.Test = w.test
		c.Egress.Self = []netip.AddrPort{w.self}
	})
	return m, log
}

// sandboxWithCA creates a sandbox and writes the test CA to /tmp/ca.pem.
func (w *egressWorld) sandbox(t *testing.T, m *sandbox.Manager, opt sandbox.CreateOptions) *sandbox.Sandbox {
	s := newSandbox(t, m, opt)
	if _, err := s.WriteFile(context.Background(), "/tmp/ca.pem", bytes.NewReader(w.caPEM), 0o644, 1<<20); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEgressAttacks runs each way out of an allowlist sandbox next to its
// allowed twin (which shows the netProbe itself works), and checks the
// event each refusal emits.
func TestEgressAttacks(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist(
		"api.test", "rebind.test", "meta.test", "self.test", "mixed.test", "*.tunnel.test", "198.51.100.0/24")})

	cases := []struct {
		name, code, want string
		kind, target     string // the event expected ("" for none)
		rule             string // a part of its rule
	}{
		{"allowed http", `get("api.test")`, "hello from api.test", "", "", ""},
		{"allowed https", `tls("api.test", "api.test")`, "hello from api.test", "", "", ""},
		{"sni mismatch", `tls("api.test", "evil.test")`, "", events.KindNetworkDenied, "evil.test at 203.0.113.10:443", "tls name"},
		{"host mismatch", `get("api.test", hdr="evil.test")`, "", events.KindNetworkDenied, "evil.test at 203.0.113.10:80", "http name"},
		{"denied name", `dns("evil.test")`, "NXDOMAIN/0", events.KindDNSDenied, "evil.test", "not in allowlist"},
		{"allowed name", `dns("api.test")`, "NOERROR/1", "", "", ""},
		{"aaaa is empty", `dns("api.test", 28)`, "NOERROR/0", "", "", ""},
		{"ip literal", `tcp("203.0.113.99", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "203.0.113.99:80", "not resolved from an allowed name"},
		{"ip of a denied name", `tcp("203.0.113.30", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "203.0.113.30:80", "not resolved"},
		{"allowed cidr raw socket", `tcp("198.51.100.7", 9000)`, "echo: ping\n", "", "", ""},
		{"rebinding to loopback", `dns("rebind.test")`, "NXDOMAIN/0", events.KindDNSDenied, "rebind.test", "127.0.0.1 (loopback)"},
		{"rebinding via getaddrinfo", `get("rebind.test")`, "gaierror", "", "", ""},
		{"metadata name", `dns("meta.test")`, "NXDOMAIN/0", events.KindDNSDenied, "meta.test", "cloud metadata"},
		{"metadata address", `tcp("169.254.169.254", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "169.254.169.254:80", "cloud metadata"},
		{"private half of an answer dropped", `dns("mixed.test")`, "NOERROR/1", "", "", ""},
		{"private address", `tcp("10.0.0.1", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "10.0.0.1:80", "private"},
		{"the gateway itself", `tcp("10.255.255.1", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "10.255.255.1:80", "private"},
		{"cgnat", `tcp("100.64.0.1", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "100.64.0.1:80", "carrier-grade NAT"},
		{"ipv4-mapped", `v6("::ffff:10.0.0.2", 80)`, "ECONNREFUSED", events.KindNetworkDenied, "10.0.0.2:80", "private"},
		{"the server's own port", `get("self.test")`, "ECONNREFUSED", events.KindNetworkDenied, "203.0.113.20:80", "the server's own port"},
		{"dns tunnelling, long label", `dns("` + strings.Repeat("a1b2c3d4", 6) + `.tunnel.test")`, "REFUSED/0", events.KindDNSDenied, strings.Repeat("a1b2c3d4", 6) + ".tunnel.test", "dns tunnelling"},
		{"dns tunnelling, many labels", `[dns("q%d.tunnel.test" % i) for i in range(70)][-1]`, "REFUSED/0", events.KindDNSDenied, "q64.tunnel.test", "too many names"},
		{"udp", `udp("203.0.113.10", 9999)`, "ECONNREFUSED", events.KindNetworkDenied, "203.0.113.10:9999", "udp"},
		{"udp dns elsewhere", `udp("8.8.8.8", 53)`, "ECONNREFUSED", events.KindNetworkDenied, "8.8.8.8:53", "udp"},
		{"ipv6", `v6("2001:db8::1", 80)`, "ENETUNREACH", "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := py(t, s, netProbe+"\nprint("+c.code+", end='')"); got != strings.TrimSpace(c.want) && !(c.want == "" && isRefusal(got)) {
				t.Fatalf("%s = %q, want %q", c.code, got, c.want)
			}
			if c.kind == "" {
				return
			}
			evs := log.find(s.ID, events.SecurityViolation, "target", c.target)
			if len(evs) == 0 {
				t.Fatalf("no event for %s; all: %+v", c.target, log.all)
			}
			if k, rule := evs[0].Details["kind"], fmt.Sprint(evs[0].Details["rule"]); k != c.kind || !strings.Contains(rule, c.rule) {
				t.Fatalf("event %+v, want kind %s and a rule with %q", evs[0].Details, c.kind, c.rule)
			}
		})
	}
}

// TestEgressPublic: mode public reaches any public address, by any name
// or as a literal, and still refuses private, loopback (rebinding),
// metadata and the server's own addresses, with the rule in the event. A
// sandbox with mode none next to it reaches nothing (the control).
func TestEgressPublic(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{Network: &policy.Network{Mode: policy.NetworkPublic}}})
	none := w.sandbox(t, m, sandbox.CreateOptions{})
	cases := []struct {
		name, code, want string
		target, rule     string // the event expected ("" for none)
	}{
		{"any name", `get("evil.test")`, "hello from evil.test", "", ""},
		{"an ip literal", `get("203.0.113.30")`, "hello from 203.0.113.30", "", ""},
		{"https", `tls("api.test", "api.test")`, "hello from api.test", "", ""},
		{"private address", `tcp("10.0.0.1", 80)`, "ECONNREFUSED", "10.0.0.1:80", "private"},
		{"metadata address", `tcp("169.254.169.254", 80)`, "ECONNREFUSED", "169.254.169.254:80", "cloud metadata"},
		{"rebinding to loopback", `dns("rebind.test")`, "NXDOMAIN/0", "rebind.test", "127.0.0.1 (loopback)"},
		{"the server's own port", `get("self.test")`, "ECONNREFUSED", "203.0.113.20:80", "the server's own port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := py(t, s, netProbe+"\nprint("+c.code+", end='')"); got != c.want {
				t.Fatalf("%s = %q, want %q", c.code, got, c.want)
			}
			if c.target == "" {
				if got := py(t, none, netProbe+"\nprint("+c.code+", end='')"); got == c.want {
					t.Fatalf("without a network %s = %q too", c.code, got)
				}
				return
			}
			evs := log.find(s.ID, events.SecurityViolation, "target", c.target)
			if len(evs) == 0 || !strings.Contains(fmt.Sprint(evs[0].Details["rule"]), c.rule) {
				t.Fatalf("events for %s: %+v, want a rule with %q", c.target, evs, c.rule)
			}
		})
	}
}

// isRefusal accepts the ways a client sees a connection the gateway closed
// after reading its first message.
func isRefusal(got string) bool {
	switch got {
	case "ssl", "closed", "ECONNRESET", "EPIPE", "":
		return true
	}
	return false
}

func TestEgressRequestLimit(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	limit := int64(2)
	pol := allowlist("api.test")
	pol.ResourceLimits = &policy.ResourceLimits{NetworkRequests: &limit}
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: pol})
	got := py(t, s, netProbe+`
print([get("api.test") for _ in range(3)])`)
	if want := "['hello from api.test', 'hello from api.test', 'ECONNREFUSED']"; got != want {
		t.Fatalf("three GETs under a limit of 2: %s, want %s", got, want)
	}
	evs := log.find(s.ID, events.ResourceExceeded, "resource", events.ResourceNetworkRequests)
	if len(evs) != 1 || fmt.Sprint(evs[0].Details["limit"]) != "2" {
		t.Fatalf("resource_exceeded events = %+v", evs)
	}
	// What metering reads: the requests let through, not the refused one.
	if n := s.EgressRequests(); n != 2 {
		t.Fatalf("EgressRequests = %d, want 2", n)
	}
	// What a stalled connection's error would show.
	if d := s.EgressDiagnosis(); !strings.HasPrefix(d, "tcp: 3 asked, 2 carried, 1 refused, 0 dial failures, 0 handshake failures; link: 0 write errors; stack: ") {
		t.Fatalf("EgressDiagnosis = %q", d)
	}
}

// TestEgressClients checks clients that ignore proxies: each reaches an
// allowed name through the gateway with no configuration at all.
func TestEgressClients(t *testing.T) {
	w := newEgressWorld(t)
	m, _ := w.engine(t)
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	clients := []struct {
		name string
		cmd  string
		args []string
	}{
		{"node fetch", "node", []string{"-e", `fetch("http://api.test/x").then(r => r.text()).then(t => process.stdout.write(t))`}},
		{"python urllib https", "python3", []string{"-c", `import ssl, urllib.request as u; print(u.urlopen("https://api.test/x", context=ssl.create_default_context(cafile="/tmp/ca.pem")).read().decode(), end="")`}},
		{"curl https", "curl", []string{"-sS", "--cacert", "/tmp/ca.pem", "https://api.test/x"}},
		{"python requests", "python3", []string{"-c", `import requests; print(requests.get("https://api.test/x", verify="/tmp/ca.pem").text, end="")`}},
		{"git clone", "bash", []string{"-c", `GIT_SSL_CAINFO=/tmp/ca.pem git clone -q https://api.test/repo.git /tmp/repo && cat /tmp/repo/greeting`}},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "curl https" {
				requireInTemplate(t, "usr/bin/curl")
			}
			if c.name == "git clone" {
				requireInTemplate(t, "usr/bin/git")
			}
			if c.name == "python requests" {
				requireInTemplate(t, "usr/lib/python3/dist-packages/requests")
			}
			res, out, errOut := runAs(t, s, "", c.cmd, c.args...)
			if res.ExitCode != 0 || out != "hello from api.test" {
				t.Fatalf("%s: exit %d, %q, %s", c.name, res.ExitCode, out, errOut)
			}
		})
	}
}

// testCert returns a self-signed certificate (its own CA) for names, and
// its key, in PEM.
func testCert(t *testing.T, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// loopbackTLSServer serves h over TLS on 127.0.0.1.
func loopbackTLSServer(t *testing.T, h http.Handler, certPEM, keyPEM []byte) netip.AddrPort {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

// testWheel builds a minimal pure-Python wheel, tinypkg 0.1.
func testWheel(t *testing.T) (string, []byte) {
	t.Helper()
	files := [][2]string{
		{"tinypkg/__init__.py", "VALUE = 42\n"},
		{"tinypkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n"},
		{"tinypkg-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: sheepfold-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(name, body string) {
		f, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(f, body)
	}
	for _, f := range files {
		add(f[0], f[1])
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString("tinypkg-0.1.dist-info/RECORD,,\n")
	add("tinypkg-0.1.dist-info/RECORD", record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return "tinypkg-0.1-py3-none-any.whl", buf.Bytes()
}

// TestEgressPipDownload fetches a package from a loopback index through
// the gateway with pip, which knows nothing of it.
func TestEgressPipDownload(t *testing.T) {
	w := newEgressWorld(t)
	m, _ := w.engine(t)
	requireInTemplate(t, "usr/lib/python3/dist-packages/pip")
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("pypi.test:443")})
	res, out, errOut := runAs(t, s, "", "python3", "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
		"--cert", "/tmp/ca.pem", "--index-url", "https://pypi.test/simple/", "-d", "/tmp/dl", "tinypkg")
	if res.ExitCode != 0 {
		t.Fatalf("pip download: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	got := py(t, s, `import zipfile; print(zipfile.ZipFile("/tmp/dl/tinypkg-0.1-py3-none-any.whl").read("tinypkg/__init__.py").decode(), end="")`)
	if got != "VALUE = 42" {
		t.Fatalf("downloaded wheel holds %q", got)
	}
}

// requireInTemplate fails t if the python template lacks a path (a
// template built before its definition gained curl, pip and requests).
func requireInTemplate(t *testing.T, rel string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(testutil.TemplateRootFS(t, "python"), rel)); err != nil {
		t.Fatalf("the python template lacks /%s: rebuild it (sheepfold template build --force python): %v", rel, err)
	}
}

// TestEgressKeepAlive: on one keep-alive connection each HTTP request
// counts against network_requests and must name an allowed Host.
func TestEgressKeepAlive(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	limit := int64(2)
	limited := allowlist("api.test")
	limited.ResourceLimits = &policy.ResourceLimits{NetworkRequests: &limit}
	reuse := netProbe + `
c = http.client.HTTPConnection("api.test", 80, timeout=10)
out = []
for h in HOSTS:
    try:
        c.request("GET", "/x", headers={"Host": h})
        out.append(c.getresponse().read().decode())
    except Exception as e:
        out.append(err(e))
print("|".join(out), end="")`
	cases := []struct {
		name  string
		pol   *policy.Policy
		hosts string
		want  string // the answers but the refused last one
		typ   events.Type
		key   string
		value string
	}{
		{"counted", limited, `["api.test"] * 3`, "hello from api.test|hello from api.test|",
			events.ResourceExceeded, "resource", events.ResourceNetworkRequests},
		{"host of a later request", allowlist("api.test"), `["api.test", "evil.test"]`, "hello from api.test|",
			events.SecurityViolation, "target", "evil.test at 203.0.113.10:80"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := w.sandbox(t, m, sandbox.CreateOptions{Policy: c.pol})
			got := py(t, s, strings.Replace(reuse, "HOSTS", c.hosts, 1))
			last := got[strings.LastIndex(got, "|")+1:]
			if !strings.HasPrefix(got, c.want) || !isRefusal(last) {
				t.Fatalf("answers %q, want %q and a refusal", got, c.want)
			}
			if evs := log.find(s.ID, c.typ, c.key, c.value); len(evs) != 1 {
				t.Fatalf("%s events with %s=%s: %+v", c.typ, c.key, c.value, evs)
			}
		})
	}
}

// TestEgressKeepAliveTLS: requests inside TLS are not visible to the
// gateway, so a kept-alive HTTPS connection counts once against
// network_requests however many requests it carries; a second connection
// counts again.
func TestEgressKeepAliveTLS(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	limit := int64(2)
	pol := allowlist("api.test")
	pol.ResourceLimits = &policy.ResourceLimits{NetworkRequests: &limit}
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: pol})
	got := py(t, s, netProbe+`
def conn(n):
    out = []
    try:
        c = http.client.HTTPSConnection("api.test", 443, timeout=10, context=ssl.create_default_context(cafile="/tmp/ca.pem"))
        for _ in range(n):
            c.request("GET", "/x")
            out.append(c.getresponse().read().decode())
    except Exception as e:
        out.append(err(e))
    return out
print("|".join(conn(5) + conn(1) + conn(1)), end="")`)
	answers := strings.Split(got, "|")
	want := strings.Repeat("hello from api.test|", 6)
	if len(answers) != 7 || !strings.HasPrefix(got, want) || answers[6] != "ECONNREFUSED" {
		t.Fatalf("five requests on one TLS connection, then two connections, under a limit of 2: %q", got)
	}
	if n := s.EgressRequests(); n != 2 {
		t.Fatalf("EgressRequests = %d, want 2", n)
	}
	if evs := log.find(s.ID, events.ResourceExceeded, "resource", events.ResourceNetworkRequests); len(evs) != 1 {
		t.Fatalf("resource_exceeded events %+v", evs)
	}
}

// testRepo makes a bare git repository served by dumb HTTP, whose one
// file "greeting" says "hello from api.test".
func testRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	work, bare := filepath.Join(dir, "work"), filepath.Join(dir, "repo.git")
	steps := [][]string{
		{"init", "-q", work},
		{"-C", work, "add", "greeting"},
		{"-C", work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"},
		{"clone", "-q", "--bare", work, bare},
		{"-C", bare, "update-server-info"},
	}
	for i, args := range steps {
		if i == 1 {
			if err := os.WriteFile(filepath.Join(work, "greeting"), []byte("hello from api.test"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	return bare
}

// TestEgressEveryRequest: from inside an allowlist sandbox, each way of
// getting a refused Host served on a connection to an allowed name is
// refused: after an Upgrade the server declined, with a lower-case
// method, inside TLS without SNI, and bytes that are no request at all.
// The same code in a public sandbox reaches evil.test's page (the
// control: the attack works where no name is required).
func TestEgressEveryRequest(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	pub := w.sandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{Network: &policy.Network{Mode: policy.NetworkPublic}}})
	probe := netProbe + `
def raw(port, *reqs, sni=False):
    try:
        s = socket.create_connection(("api.test", port), timeout=10)
        if port == 443:
            ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
            ctx.check_hostname = False
            s = ctx.wrap_socket(s, server_hostname="api.test" if sni else None)
        f = s.makefile("rb")
        out = []
        for r in reqs:
            s.sendall(r.encode())
            if not f.readline():
                out.append("closed")
                break
            n = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.lower() == "content-length":
                    n = int(v)
            out.append(f.read(n).decode())
        return "|".join(out)
    except Exception as e:
        return err(e)
`
	cases := []struct {
		name, code, allowed string
		rule                string // a part of the refusal's rule
	}{
		{"upgrade declined", `raw(80, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")`,
			"hello from api.test|", `http name "evil.test"`},
		{"lower-case method", `raw(80, "get / HTTP/1.1\r\nHost: evil2.test\r\n\r\n")`, "", `http name "evil2.test"`},
		{"tls without sni", `raw(443, "GET / HTTP/1.1\r\nHost: evil3.test\r\n\r\n")`, "", "TLS without SNI"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code := probe + "\nprint(" + c.code + ", end='')"
			if got := py(t, pub, code); !strings.Contains(got, "hello from evil") {
				t.Fatalf("the control, in a public sandbox: %q", got)
			}
			since := log.len()
			got := py(t, s, code)
			if !strings.HasPrefix(got, c.allowed) || !isRefusal(strings.TrimPrefix(got, c.allowed)) {
				t.Fatalf("in an allowlist sandbox: %q, want %q and a refusal", got, c.allowed)
			}
			if !hasRule(log, s.ID, c.rule, since) {
				t.Fatalf("no security_violation with a rule holding %q", c.rule)
			}
		})
	}
	// Bytes that are no request, to a destination allowed by name.
	since := log.len()
	if got := py(t, s, netProbe+`
print(tcp("api.test", 80, b"hello\n"), end="")`); !isRefusal(got) {
		t.Fatalf("raw bytes to api.test:80: %q", got)
	}
	if !hasRule(log, s.ID, "neither a TLS ClientHello nor an HTTP/1 request", since) {
		t.Fatal("no event for raw bytes")
	}
	// A lower-case method does not hide a connection's requests from
	// network_requests either (in public mode, where no name is checked).
	limit := int64(2)
	counted := w.sandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{
		Network:        &policy.Network{Mode: policy.NetworkPublic},
		ResourceLimits: &policy.ResourceLimits{NetworkRequests: &limit}}})
	get := `"get / HTTP/1.1\r\nHost: api.test\r\n\r\n"`
	if got := py(t, counted, probe+"\nprint(raw(80, "+get+", "+get+", "+get+"), end='')"); got != "hello from api.test|hello from api.test|closed" {
		t.Fatalf("three requests under network_requests 2: %q", got)
	}
}

// len returns how many events the log holds.
func (l *eventLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.all)
}

// hasRule reports whether sandbox id emitted, from the since'th event on,
// a security_violation whose rule holds part.
func hasRule(l *eventLog, id, part string, since int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.all[since:] {
		if e.SandboxID == id && e.Type == events.SecurityViolation && strings.Contains(fmt.Sprint(e.Details["rule"]), part) {
			return true
		}
	}
	return false
}

// TestEgressPolicyClosesFlows: a kept-alive HTTPS connection (whose
// later requests the gateway cannot see) opened in one execution is
// closed when a policy change refuses its name, and goes on when the
// change refuses nothing it claimed (the control).
func TestEgressPolicyClosesFlows(t *testing.T) {
	w := newEgressWorld(t)
	m, _ := w.engine(t)
	open := netProbe + `
c = http.client.HTTPSConnection("api.test", 443, timeout=10, context=ssl.create_default_context(cafile="/tmp/ca.pem"))
c.request("GET", "/x")
print(c.getresponse().read().decode(), end="")`
	again := netProbe + `
try:
    c.request("GET", "/x")
    print(c.getresponse().read().decode(), end="")
except Exception as e:
    print(err(e), end="")`
	for _, tc := range []struct {
		name string
		to   *policy.Policy
		want string
	}{
		{"a change that keeps it", allowlist("api.test", "other.test"), "hello from api.test"},
		{"a change that refuses it", allowlist("other.test"), "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
			if ex := run(t, s, "python", open); ex.Stdout != "hello from api.test" {
				t.Fatalf("first request: %+v", ex)
			}
			if _, err := s.SetPolicy(tc.to); err != nil {
				t.Fatal(err)
			}
			got := run(t, s, "python", again).Stdout
			if tc.want == "refused" && isRefusal(got) || got == tc.want {
				return
			}
			t.Fatalf("the kept-alive connection after %s: %q, want %s", tc.name, got, tc.want)
		})
	}
}

// TestEgressFlowBounds: a sandbox holds at most MaxFlows connections at
// once (the next is refused, with a resource_exceeded event), each closed
// after IdleTimeout without traffic; the bytes are counted.
func TestEgressFlowBounds(t *testing.T) {
	w := newEgressWorld(t)
	log := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = log
		c.Egress.Test = w.test
		c.Egress.MaxFlows = 3
		c.Egress.IdleTimeout = 500 * time.Millisecond
	})
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("198.51.100.0/24")})
	got := py(t, s, netProbe+`
import time
held = [socket.create_connection(("198.51.100.7", 9000), timeout=10) for _ in range(3)]
out = [tcp("198.51.100.7", 9000)]
# Idle past the timeout: the gateway closes them, and a new one works.
start = time.time()
for h in held:
    h.settimeout(10)
    out.append(repr(h.recv(10)))
out.append("idle closed after %.1fs" % (time.time() - start) if time.time() - start < 8 else "not closed")
out.append(tcp("198.51.100.7", 9000))
print("|".join(out), end="")`)
	if want := "ECONNREFUSED|b''|b''|b''|idle closed after"; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "|echo: ping") {
		t.Fatalf("%q, want %q... and an echo", got, want)
	}
	if evs := log.find(s.ID, events.ResourceExceeded, "resource", events.ResourceNetworkFlows); len(evs) != 1 {
		t.Fatalf("resource_exceeded network_flows events: %+v", evs)
	}
	if in, out := s.EgressBytes(); in != int64(len("echo: ping\n")) || out != int64(len("ping\n")) {
		t.Fatalf("EgressBytes = %d in, %d out", in, out)
	}
}

// TestEgressPortReuse: a connection from a source port whose previous
// connection the outside closed first (the gateway's end then went to
// TIME_WAIT, the sandbox's to nothing) connects at once. The gateway
// used to drop such a SYN for 60 s: the sandbox's kernel reuses such
// ports, and a connect timed out (the symptom the egress bench once met
// in CI). The control: the same two connections from one port straight
// from the host.
func TestEgressPortReuse(t *testing.T) {
	w := newEgressWorld(t)
	m, _ := w.engine(t)
	twice := func(dial func(port int) (net.Conn, error)) string {
		var out []string
		port := 40000 + int(time.Now().UnixNano()%10000)
		for i := range 2 {
			c, err := dial(port)
			// The first connection's port may be another socket's on a
			// busy host (it is in the ephemeral range): another port.
			for tries := 0; i == 0 && errors.Is(err, syscall.EADDRINUSE) && tries < 50; tries++ {
				port = 40000 + (port-40000+7919)%10000
				c, err = dial(port)
			}
			if err != nil {
				return err.Error()
			}
			io.WriteString(c, "GET / HTTP/1.0\r\nHost: api.test\r\n\r\n") // the server closes first
			b, _ := io.ReadAll(c)
			c.Close()
			out = append(out, string(b[bytes.LastIndex(b, []byte("\r\n"))+2:]))
		}
		return strings.Join(out, "|")
	}
	if got := twice(func(port int) (net.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
			Control: reuseAddr}
		// The host's end of the first connection may still be closing
		// (LAST_ACK) when the second is made: its tuple is then still
		// taken (EADDRNOTAVAIL) until that end is gone.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			c, err := d.Dial("tcp", w.httpSrv.String())
			if !errors.Is(err, syscall.EADDRNOTAVAIL) || time.Now().After(deadline) {
				return c, err
			}
		}
	}); got != "hello from api.test|hello from api.test" {
		t.Fatalf("the control, from the host: %q", got)
	}
	s := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	got := py(t, s, `
import errno, random, socket, time
port = random.randrange(40000, 50000)
out = []
for _ in range(2):
    # As on the host: the sandbox's end of the first connection may still
    # be closing (LAST_ACK, until the gateway acknowledges its FIN) when
    # the second is made, and its tuple is taken (EADDRNOTAVAIL) until it
    # is gone; a SYN the gateway drops times out instead.
    deadline = time.time() + 5
    while True:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind(("", port))
        c.settimeout(5)
        try:
            c.connect(("api.test", 80))
            break
        except OSError as e:
            c.close()
            if e.errno != errno.EADDRNOTAVAIL or time.time() > deadline:
                out.append("connect: %s" % e)
                break
            time.sleep(0.01)
    if out and out[-1].startswith("connect: "):
        break
    c.sendall(b"GET / HTTP/1.0\r\nHost: api.test\r\n\r\n")  # the server closes first
    data = b""
    while True:
        b = c.recv(4096)
        if not b:
            break
        data += b
    c.close()
    out.append(data.split(b"\r\n\r\n", 1)[-1].decode())
print("|".join(out), end="")`)
	if got != "hello from api.test|hello from api.test" {
		t.Fatalf("two connections from one source port: %q", got)
	}
}

// reuseAddr sets SO_REUSEADDR on a dialer's socket.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}
