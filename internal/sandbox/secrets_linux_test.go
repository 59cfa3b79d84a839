package sandbox_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// testSecrets is the server's store of secrets, for one sandbox.
type testSecrets struct {
	mu     sync.Mutex
	values map[string]string
}

func (s *testSecrets) Resolve(_ context.Context, _, name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.values[name]; ok {
		return []byte(v), nil
	}
	return nil, errors.New("not found")
}

func (s *testSecrets) Used(egress.SecretUse) {}

// lockedBuffer is a log's destination.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecretsThroughSandbox: a real sandbox whose env holds the
// placeholder (OPENAI_API_KEY=${secrets.openai}) and whose policy has a
// rule for api.test. Its code's request to api.test reaches the server
// with the value; the same placeholder towards other.test is refused
// (403 ERR_SECRET_MISDIRECTED, a secret_misdirected event); the value is
// nowhere in the sandbox (environment, files, the memory of its
// processes), in any event, or in the engine's log (at debug).
func TestSecretsThroughSandbox(t *testing.T) {
	const value = "sk-E2E-5a4b3c2d1e0f9a8b"
	var mu sync.Mutex
	var seen []string
	srv := loopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	api, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	logs := &lockedBuffer{}
	evs := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = evs
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Egress.Secrets = &testSecrets{values: map[string]string{"openai": value}}
		c.Egress.Test = &egress.TestNet{
			Hosts:  map[string][]netip.Addr{"api.test": {api}, "other.test": {other}},
			Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 80): srv, netip.AddrPortFrom(other, 80): srv},
		}
	})
	pol := allowlist("api.test", "other.test")
	pol.Network.Rules = []policy.NetworkRule{{Host: "api.test", Transform: &policy.Transform{
		Headers: map[string]string{"Authorization": "Bearer ${secrets.openai}"}}}}
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol, Env: map[string]string{"OPENAI_API_KEY": "${secrets.openai}"}})

	send := `
import os, urllib.request, urllib.error
def send(host):
    req = urllib.request.Request("http://%s/v1/chat" % host, data=b"{}", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip())
print(os.environ["OPENAI_API_KEY"], "|", send("api.test"), "|", send("other.test"))
`
	got := py(t, s, send)
	if !strings.HasPrefix(got, "${secrets.openai} | ok | 403 ERR_SECRET_MISDIRECTED") {
		t.Fatalf("the sandbox saw %q", got)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "api.test Bearer "+value {
		t.Fatalf("the server got %q", seen)
	}
	mu.Unlock()
	if len(evs.find(s.ID, events.SecurityViolation, "kind", events.KindSecretMisdirected)) == 0 {
		t.Fatal("no secret_misdirected event")
	}
	if len(evs.find(s.ID, events.SecretUsed, "outcome", egress.OutcomeInjected)) != 1 {
		t.Fatal("no secret.used event")
	}

	// The value is nowhere the sandbox's code can read (searchSandbox).
	// The control: the search finds what is there (the placeholder, in
	// the environment and so in memory).
	if ex := run(t, s, "python", searchSandbox("${secrets.openai}")); !strings.Contains(ex.Stdout, "'environ'") ||
		!strings.Contains(ex.Stdout, "'memory'") || !strings.Contains(ex.Stdout, "mappings: True") {
		t.Fatalf("the control search: %q %+v", ex.Stdout, ex.Error)
	}
	if ex := run(t, s, "python", searchSandbox(value)); strings.TrimSpace(ex.Stdout) != "found: [] mappings: True" {
		t.Fatalf("the value is in the sandbox: %q %+v", ex.Stdout, ex.Error)
	}
	evs.mu.Lock()
	for _, e := range evs.all {
		if strings.Contains(fmt.Sprint(e.Details), value) {
			t.Errorf("an event holds the value: %+v", e)
		}
	}
	evs.mu.Unlock()
	if strings.Contains(logs.String(), value) {
		t.Fatalf("the log holds the value:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "egress secrets injected") {
		t.Fatalf("the log did not capture the gateway's lines:\n%s", logs.String())
	}
}

// TestSecretsOverHTTPSThroughSandbox: a real sandbox whose policy has a
// rule for api.test, its trust stores carrying the server's CA
// (TrustEgressCA, egress.TrustEnv). Python's urllib (with the default
// context and with certifi's bundle) and requests, curl, Node's fetch,
// git and pip reach https://api.test through the gateway, which
// terminates their TLS, verifies the real host against its roots and
// injects the value. other.test has no rule: its TLS is carried as it is,
// so the sandbox sees the real host's certificate, which it does not
// trust (the control: nothing decrypted it).
func TestSecretsOverHTTPSThroughSandbox(t *testing.T) {
	const value = "sk-TLS-7f6e5d4c3b2a1908"
	var mu sync.Mutex
	var seen, agents []string
	certPEM, keyPEM := testCert(t, "api.test", "other.test")
	srv := loopbackTLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+" "+r.Header.Get("Authorization"))
		agents = append(agents, r.UserAgent())
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}), certPEM, keyPEM)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	api, other := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	evs := &eventLog{}
	m := runcEngine(t, func(c *sandbox.Config) {
		c.Events = evs
		c.Egress.Secrets = &testSecrets{values: map[string]string{"openai": value}}
		c.Egress.Intercept = &egress.Intercept{CA: ca, Roots: roots}
		c.Egress.Test = &egress.TestNet{
			Hosts:  map[string][]netip.Addr{"api.test": {api}, "other.test": {other}},
			Routes: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(api, 443): srv, netip.AddrPortFrom(other, 443): srv},
		}
	})
	pol := allowlist("api.test", "other.test")
	pol.Network.Rules = []policy.NetworkRule{{Host: "api.test", Transform: &policy.Transform{
		Headers: map[string]string{"Authorization": "Bearer ${secrets.openai}"}}}}
	env := egress.TrustEnv()
	env["OPENAI_API_KEY"] = "${secrets.openai}"
	s := newSandbox(t, m, sandbox.CreateOptions{Policy: pol, Env: env})
	if err := s.TrustEgressCA(context.Background(), ca.PEM()); err != nil {
		t.Fatal(err)
	}
	got := py(t, s, `
import os, ssl, urllib.request, urllib.error, requests, certifi
def via_urllib(host, ctx=None):
    req = urllib.request.Request("https://%s/v1/chat" % host, data=b"{}", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        return urllib.request.urlopen(req, timeout=10, context=ctx).read().decode()
    except urllib.error.URLError as e:
        return "failed: %s" % e.reason
certifi_ctx = ssl.create_default_context(cafile=certifi.where())
print(via_urllib("api.test"), "|", requests.post("https://api.test/v1/chat", json={}, timeout=10).text, "|", via_urllib("api.test", certifi_ctx), "|", via_urllib("other.test"))
`)
	if !strings.HasPrefix(got, "ok | ok | ok | failed: [SSL: CERTIFICATE_VERIFY_FAILED]") {
		t.Fatalf("python: %q", got)
	}
	res, out, errOut := runAs(t, s, "", "curl", "-sS", "-X", "POST", "https://api.test/v1/chat")
	if res.ExitCode != 0 || out != "ok" {
		t.Fatalf("curl: exit %d %q %q", res.ExitCode, out, errOut)
	}
	res, out, errOut = runAs(t, s, "", "node", "-e", `fetch("https://api.test/v1/chat", {method: "POST"}).then(r => r.text()).then(t => process.stdout.write(t))`)
	if res.ExitCode != 0 || out != "ok" {
		t.Fatalf("node: exit %d %q %q", res.ExitCode, out, errOut)
	}
	// git and pip trust the CA through the environment (GIT_SSL_CAINFO,
	// PIP_CERT): their requests reach api.test, which answers no
	// repository and no package. The control: towards other.test, whose
	// TLS is not terminated, both refuse the certificate.
	gitOut := func(host string) string {
		t.Helper()
		_, out, errOut := runAs(t, s, "", "git", "ls-remote", "https://"+host+"/repo.git")
		return out + errOut
	}
	if out := gitOut("api.test"); strings.Contains(out, "certificate") {
		t.Fatalf("git through the gateway: %q", out)
	}
	if out := gitOut("other.test"); !strings.Contains(out, "certificate") {
		t.Fatalf("git's control: %q", out)
	}
	pipOut := func(host string) string {
		t.Helper()
		res, out, errOut := runAs(t, s, "", "pip", "download", "--no-deps", "--retries", "0", "--timeout", "10",
			"--index-url", "https://"+host+"/simple/", "-d", "/tmp/pip-download", "sheepfold-no-such-package")
		if res.ExitCode == 0 {
			t.Fatalf("pip download from %s: exit 0", host)
		}
		return out + errOut
	}
	if out := pipOut("api.test"); strings.Contains(out, "CERTIFICATE_VERIFY_FAILED") || !strings.Contains(out, "No matching distribution") {
		t.Fatalf("pip through the gateway: %q", out)
	}
	if out := pipOut("other.test"); !strings.Contains(out, "CERTIFICATE_VERIFY_FAILED") {
		t.Fatalf("pip's control: %q", out)
	}
	mu.Lock()
	defer mu.Unlock()
	ua := strings.Join(agents, "\n")
	if len(seen) < 7 || !strings.Contains(ua, "git/") || !strings.Contains(ua, "pip/") {
		t.Fatalf("the server got %q from %q, want python's 3, curl's, node's, git's and pip's requests", seen, agents)
	}
	for _, s := range seen {
		if s != "api.test Bearer "+value {
			t.Fatalf("the server got %q", seen)
		}
	}
}

// searchSandbox is Python that lists where in the sandbox needle is:
// every process's environment and command line, every readable mapping
// of the memory of every process it can read (the kernel that runs the
// search, at least), and the files. The needle is given in two halves,
// never joined, so that the search itself does not hold it.
func searchSandbox(needle string) string {
	return fmt.Sprintf(`
import os, re
a, b = %q.encode(), %q.encode()
def holds(data):
    i = data.find(a)
    while i >= 0:
        if data[i + len(a):i + len(a) + len(b)] == b: return True
        i = data.find(a, i + 1)
    return False
found, scanned = [], 0
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for f in ("environ", "cmdline"):
        try:
            if holds(open("/proc/%%s/%%s" %% (pid, f), "rb").read()): found.append(pid + " " + f)
        except OSError: pass
    try:
        maps = open("/proc/%%s/maps" %% pid).read().splitlines()
        mem = open("/proc/%%s/mem" %% pid, "rb", 0)
    except OSError: continue
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m or "[vvar]" in line or "[vsyscall]" in line: continue
        x, y = int(m.group(1), 16), int(m.group(2), 16)
        try:
            mem.seek(x)
            data = mem.read(y - x)
            scanned += 1
            if holds(data): found.append(pid + " memory")
        except (OSError, ValueError, OverflowError): pass
for top in ("/tmp", "/home", "/root", "/etc", "/work", "/var", "/opt"):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if holds(open(os.path.join(d, f), "rb").read()): found.append(os.path.join(d, f))
            except OSError: pass
print("found:", sorted(set(x.split(" ", 1)[-1] for x in found)), "mappings:", scanned > 0)
`, needle[:6], needle[6:])
}
