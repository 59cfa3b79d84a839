package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// The secret-injection tests: a loopback HTTP server plays api.test and
// other.test (port 80) and records every request it receives whole; a
// fake Secrets stands in for the server's store.

const realValue = "sk-REAL-9f8e7d6c5b4a"

// fakeSecrets maps names to values and records uses.
type fakeSecrets struct {
	mu     sync.Mutex
	values map[string]string
	uses   []SecretUse
}

func (s *fakeSecrets) Resolve(_ context.Context, sandboxID, name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[name]
	if !ok || sandboxID != "sb1" {
		return nil, errors.New("secret not found")
	}
	return []byte(v), nil
}

func (s *fakeSecrets) Used(u SecretUse) {
	s.mu.Lock()
	s.uses = append(s.uses, u)
	s.mu.Unlock()
}

func (s *fakeSecrets) set(name, v string) {
	s.mu.Lock()
	s.values[name] = v
	s.mu.Unlock()
}

func (s *fakeSecrets) outcomes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, u := range s.uses {
		out = append(out, u.Secret+" "+u.Outcome+" "+u.Method+" "+u.Host+u.Path)
	}
	return out
}

// outside is the world: it answers each request with the
// Authorization and X-Key it carried, and keeps every request it got.
type outside struct {
	mu     sync.Mutex
	seen   []string
	closed chan struct{} // a connection closed
}

// waitClosed waits until a connection to the server closed: what the
// gateway sent of a refused request has been read and recorded.
func (r *outside) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-r.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway kept the server's connection open")
	}
}

func (r *outside) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.seen, "\n----\n")
}

func newSecretWorld(t *testing.T) (*flowWorld, *outside) {
	t.Helper()
	rec := &outside{closed: make(chan struct{}, 64)}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s %s host=%s\n", r.Method, r.RequestURI, r.Host)
		r.Header.Write(&sb)
		sb.Write(b)
		rec.mu.Lock()
		rec.seen = append(rec.seen, sb.String())
		rec.mu.Unlock()
		fmt.Fprintf(w, "auth=%s key=%s", r.Header.Get("Authorization"), r.Header.Get("X-Key"))
	}))
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case rec.closed <- struct{}{}:
			default:
			}
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	to := netip.MustParseAddrPort(hs.Listener.Addr().String())
	return &flowWorld{test: &TestNet{
		Hosts: map[string][]netip.Addr{"api.test": {apiIP}, "other.test": {otherIP}},
		Routes: map[netip.AddrPort]netip.AddrPort{
			netip.AddrPortFrom(apiIP, 80): to, netip.AddrPortFrom(otherIP, 80): to,
		},
	}}, rec
}

// injecting is the policy of the tests: api.test's POSTs under /v1 get
// Authorization from the secret openai.
func injecting() *policy.Network {
	return &policy.Network{Mode: "allowlist", Allow: []string{"api.test", "other.test"}, Rules: []policy.NetworkRule{{
		Host: "api.test", Methods: []string{"POST"}, PathPrefix: "/v1",
		Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${secrets.openai}"}},
	}}}
}

func secretGateway(t *testing.T, w *flowWorld, n *policy.Network) (*Gateway, *sink, *fakeSecrets) {
	t.Helper()
	fs := &fakeSecrets{values: map[string]string{"openai": realValue, "other": "sk-OTHER-1234567890"}}
	g, ev := w.gateway(t, n, 0, func(o *Options) { o.Secrets = fs })
	return g, ev, fs
}

func post(host, path, headers, body string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n%s", path, host, headers, len(body), body)
}

// TestSecretInjected: a request that matches the rule gets the header
// with the value; a placeholder the sandbox puts in its own header of
// such a request is replaced; requests the rule does not cover (another
// method, path, host, or Host spoofed towards another address) get
// nothing; every use is recorded and emitted.
func TestSecretInjected(t *testing.T) {
	w, rec := newSecretWorld(t)
	g, ev, fs := secretGateway(t, w, injecting())
	api, other := "203.0.113.10:80", "203.0.113.11:80"
	defer func() {
		if strings.Contains(rec.all(), "secrets.") {
			t.Errorf("a placeholder reached the server: %q", rec.all())
		}
	}()
	got := exchangeOn(dialFlow(t, g, api),
		post("api.test", "/v1/chat", "Authorization: Bearer ${secrets.openai}\r\n", "{}"),
		post("api.test", "/v1", "X-Key: k=${secrets.openai}\r\n", ""),
		post("api.test", "/v1", "X-Key: k=${e2b.secrets.OpenAI}\r\n", ""),
		"GET /v1/models HTTP/1.1\r\nHost: api.test\r\n\r\n",
		post("api.test", "/v10", "", ""),
		post("api.test", "/v1/../admin", "", ""),
	)
	want := []string{
		"200 auth=Bearer " + realValue + " key=",
		"200 auth=Bearer " + realValue + " key=k=" + realValue,
		"200 auth=Bearer " + realValue + " key=k=" + realValue,
		"200 auth= key=", "200 auth= key=", "200 auth= key=",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("answers %q, want %q", got, want)
	}
	// Host: api.test sent to other.test's address matches no rule.
	if got := exchangeOn(dialFlow(t, g, other), post("api.test", "/v1/chat", "", "")); got[0] != "200 auth= key=" {
		t.Fatalf("a spoofed Host got %q", got)
	}
	if got, want := strings.Join(fs.outcomes(), "|"), "openai injected POST api.test/v1/chat|openai injected POST api.test/v1|openai injected POST api.test/v1"; got != want {
		t.Fatalf("uses %q, want %q", got, want)
	}
	n := 0
	ev.mu.Lock()
	for _, e := range ev.evs {
		if e.Type == events.SecretUsed && e.Details["outcome"] == OutcomeInjected && e.Details["secret"] == "openai" {
			n++
		}
		if strings.Contains(fmt.Sprint(e.Details), realValue) {
			t.Errorf("an event holds the value: %+v", e)
		}
	}
	ev.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d secret.used events, want 3", n)
	}
}

// TestSecretMisdirected: a placeholder sent where it is not substituted
// is refused before any byte of it goes on, the sandbox is told why
// (403 ERR_SECRET_MISDIRECTED) and a secret_misdirected event says where.
// The control: the same requests through a gateway whose policy has no
// rules reach the server, placeholder and all.
func TestSecretMisdirected(t *testing.T) {
	api, other := "203.0.113.10:80", "203.0.113.11:80"
	chunked := "POST /v1/x HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\nkey=$\r\n4\r\n{sec\r\n9\r\nrets.open\r\n4\r\nai}&\r\n0\r\n\r\n"
	chunkedE2B := "POST /v1/x HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\nkey=$\r\n3\r\n{e2\r\n7\r\nb.secre\r\n9\r\nts.openai\r\n2\r\n}&\r\n0\r\n\r\n"
	cases := []struct {
		name, dst, req, where string
		injected              bool // the rule's header went on before the body was refused
	}{
		{"header to another host", other, post("other.test", "/v1/chat", "Authorization: Bearer ${secrets.openai}\r\n", ""), "a header", false},
		{"header, method not covered", api, "PUT /v1/chat HTTP/1.1\r\nHost: api.test\r\nX-Key: ${secrets.openai}\r\nContent-Length: 0\r\n\r\n", "a header", false},
		{"another secret to the rule's host", api, post("api.test", "/v1/chat", "X-Key: ${secrets.other}\r\n", ""), "rule 0 does not name", false},
		{"URL of the rule's host", api, post("api.test", "/v1/chat?key=${secrets.openai}", "", ""), "the request line", false},
		{"URL percent-encoded", other, post("other.test", "/x?key=%24%7Bsecrets.openai%7D", "", ""), "the request line", false},
		{"Host spoofed to another address", other, post("api.test", "/v1/chat", "X-Key: ${secrets.openai}\r\n", ""), "a header", false},
		{"body to another host", other, post("other.test", "/upload", "", `{"key":"${secrets.openai}"}`), "the body", false},
		{"body of the rule's host", api, post("api.test", "/v1/chat", "", `{"key":"${secrets.openai}"}`), "the body", true},
		{"body form-encoded", other, post("other.test", "/upload", "", `key=%24%7bsecrets.openai%7d`), "the body", false},
		{"body chunked, split", other, chunked, "the body", false},
		// E2B's form (Secret.fill): ${e2b.secrets.NAME}.
		{"E2B form to another host", other, post("other.test", "/v1/chat", "Authorization: Bearer ${e2b.secrets.openai}\r\n", ""), "a header", false},
		{"E2B form in the URL, percent-encoded", other, post("other.test", "/x?key=%24%7Be2b.secrets.openai%7D", "", ""), "the request line", false},
		{"E2B form in the body, upper case", other, post("other.test", "/upload", "", `{"key":"${E2B.secrets.OpenAI}"}`), "the body", false},
		{"E2B form, body chunked, split", other, chunkedE2B, "the body", false},
		{"E2B form, a hyphenated secret the rule does not name", api, post("api.test", "/v1/chat", "X-Key: ${e2b.secrets.gh-token}\r\n", ""), `"gh-token"`, false},
		{"E2B form of the rule's secret in the URL", api, post("api.test", "/v1/chat?k=${e2b.secrets.openai}", "", ""), "the request line", false},
		{"E2B workload token form to another host", other, post("other.test", "/v1/chat", "X-Token: ${e2b.identity.tokens.aws}\r\n", ""), "a header", false},
		{"E2B workload token form to the rule's host", api, post("api.test", "/v1/chat", "X-Token: ${e2b.identity.tokens.aws}\r\n", ""), "are substituted", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, rec := newSecretWorld(t)
			plain := injecting()
			plain.Rules = nil
			g0, _, _ := secretGateway(t, w, plain)
			placeholder := func(s string) bool { return strings.Contains(s, "secrets.") || strings.Contains(s, "identity.") }
			if got := exchangeOn(dialFlow(t, g0, c.dst), c.req); !strings.HasPrefix(got[0], "200 ") ||
				!placeholder(rec.all()) {
				t.Fatalf("the control: %q; the server saw %q", got, rec.all())
			}
			w, rec = newSecretWorld(t)
			g, ev, fs := secretGateway(t, w, injecting())
			got := exchangeOn(dialFlow(t, g, c.dst), c.req)
			if len(got) != 1 || !strings.HasPrefix(got[0], "403 "+codeMisdirected) || !strings.Contains(got[0], c.where) {
				t.Fatalf("through the gateway %q, want 403 %s naming %q", got, codeMisdirected, c.where)
			}
			g.Close()
			rec.waitClosed(t)
			if s := rec.all(); placeholder(s) || strings.Contains(s, "%7B") || strings.Contains(s, "%7b") || strings.Contains(s, realValue) != c.injected {
				t.Fatalf("the server saw %q", s)
			}
			if !ev.has(events.SecurityViolation, "placeholder of secret") {
				t.Fatalf("no secret_misdirected event: %+v", ev.evs)
			}
			ev.mu.Lock()
			for _, e := range ev.evs {
				if e.Type == events.SecurityViolation && e.Details["kind"] != events.KindSecretMisdirected {
					t.Errorf("kind %v", e.Details["kind"])
				}
			}
			ev.mu.Unlock()
			if o := fs.outcomes(); len(o) == 0 || !strings.Contains(o[len(o)-1], OutcomeMisdirected) || len(o) == 2 != c.injected {
				t.Fatalf("uses %q", o)
			}
		})
	}
}

// TestSecretRotation: a new value applies to the next request, on the
// same connection.
func TestSecretRotation(t *testing.T) {
	w, _ := newSecretWorld(t)
	g, _, fs := secretGateway(t, w, injecting())
	c := dialFlow(t, g, "203.0.113.10:80")
	req := post("api.test", "/v1/chat", "", "")
	first := exchangeOn(c, req)
	fs.set("openai", "sk-ROTATED-000111")
	second := exchangeOn(c, req)
	if first[0] != "200 auth=Bearer "+realValue+" key=" || second[0] != "200 auth=Bearer sk-ROTATED-000111 key=" {
		t.Fatalf("before and after rotation: %q %q", first, second)
	}
}

// TestSecretRevoked: a request whose secret cannot be resolved (deleted,
// or a value that cannot be a header's) is refused, 502
// ERR_SECRET_UNAVAILABLE: neither the placeholder nor anything else is
// sent.
func TestSecretRevoked(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*fakeSecrets)
	}{
		{"deleted", func(fs *fakeSecrets) { fs.mu.Lock(); delete(fs.values, "openai"); fs.mu.Unlock() }},
		{"header injection in the value", func(fs *fakeSecrets) { fs.set("openai", "x\r\nX-Evil: 1") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, rec := newSecretWorld(t)
			g, _, fs := secretGateway(t, w, injecting())
			c.change(fs)
			got := exchangeOn(dialFlow(t, g, "203.0.113.10:80"), post("api.test", "/v1/chat", "X-Key: ${secrets.openai}\r\n", ""))
			if !strings.HasPrefix(got[0], "502 "+codeUnavailable) {
				t.Fatalf("got %q", got)
			}
			if s := rec.all(); s != "" {
				t.Fatalf("the server saw %q", s)
			}
			if o := fs.outcomes(); len(o) != 1 || !strings.Contains(o[0], OutcomeUnavailable) {
				t.Fatalf("uses %q", o)
			}
		})
	}
}

// TestSecretPipelinedRefusal: a refusal after answered requests on one
// connection comes after their answers, whole.
func TestSecretPipelinedRefusal(t *testing.T) {
	w, _ := newSecretWorld(t)
	g, _, _ := secretGateway(t, w, injecting())
	c := dialFlow(t, g, "203.0.113.11:80")
	ok := post("other.test", "/a", "", "x")
	io.WriteString(c, ok+ok+post("other.test", "/b", "X-Key: ${secrets.openai}\r\n", ""))
	br := bufio.NewReader(c)
	var got []int
	for {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.Copy(io.Discard, res.Body)
		got = append(got, res.StatusCode)
	}
	if fmt.Sprint(got) != "[200 200 403]" {
		t.Fatalf("answers %v", got)
	}
}

// FuzzScanWriter: the body scanner refuses a body, however it is cut
// into writes, exactly when the whole body holds a placeholder, and
// otherwise forwards it unchanged.
func FuzzScanWriter(f *testing.F) {
	f.Add([]byte(`{"k":"${secrets.openai}"}`), uint8(9), uint8(3))
	f.Add([]byte(`a=%24%7bsecrets.x%7d`), uint8(4), uint8(1))
	f.Add([]byte(`$%7Bsecrets.`), uint8(1), uint8(1))
	f.Add([]byte(`{"k":"%24%7Be2b.secrets.gh-token%7D"}`), uint8(2), uint8(5))
	f.Add([]byte(`no placeholder here: secrets.txt ${other}`), uint8(5), uint8(7))
	f.Fuzz(func(t *testing.T, body []byte, a, b uint8) {
		var out strings.Builder
		refused := false
		sw := &scanWriter{w: &out, bad: func(string) error { refused = true; return errors.New("refused") }}
		for rest := body; len(rest) > 0 && !refused; {
			n := min(len(rest), int(a%32)+1)
			a, b = b, a+b+1
			if _, err := sw.Write(rest[:n]); err != nil {
				break
			}
			rest = rest[n:]
		}
		if !refused {
			if err := sw.end(); err != nil {
				t.Fatal(err)
			}
		}
		i, _ := findPlaceholder(body)
		if refused != (i >= 0) {
			t.Fatalf("refused %v, whole body has a placeholder at %d: %q", refused, i, body)
		}
		if !refused && out.String() != string(body) {
			t.Fatalf("forwarded %q, want %q", out.String(), body)
		}
		if refused && (out.Len() > i || !strings.HasPrefix(string(body), out.String())) {
			t.Fatalf("forwarded %q, past the placeholder at %d of %q", out.String(), i, body)
		}
	})
}

// TestSecretRulesFollowPolicy: a policy change reaches the next request
// of an open connection: rules removed, nothing is injected; rules back,
// the value is.
func TestSecretRulesFollowPolicy(t *testing.T) {
	w, _ := newSecretWorld(t)
	g, _, _ := secretGateway(t, w, injecting())
	c := dialFlow(t, g, "203.0.113.10:80")
	req := post("api.test", "/v1/chat", "", "")
	set := func(n *policy.Network) {
		pol, err := policy.CompileEgress(n)
		if err != nil {
			t.Fatal(err)
		}
		g.SetPolicy(pol, 0)
	}
	first := exchangeOn(c, req)
	plain := injecting()
	plain.Rules = nil
	set(plain)
	second := exchangeOn(c, req)
	set(injecting())
	third := exchangeOn(c, req)
	with, without := "200 auth=Bearer "+realValue+" key=", "200 auth= key="
	if first[0] != with || second[0] != without || third[0] != with {
		t.Fatalf("with, without, with rules: %q %q %q", first, second, third)
	}
}
