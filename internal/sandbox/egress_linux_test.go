package sandbox_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
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

// A sandbox without a network policy has its loopback alone, as before.
func TestEgressNoneHasOnlyLoopback(t *testing.T) {
	m, _ := networkEngine(t, nil)
	for _, pol := range []*policy.Policy{nil, {Network: &policy.Network{Mode: policy.NetworkNone}}} {
		s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol})
		got := py(t, s, `import os, socket; print(sorted(os.listdir("/sys/class/net")))
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
