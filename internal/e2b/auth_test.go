package e2b

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// countingBackend counts every call of the E2B surface to its backend:
// the work a request makes the server do. Keys key_a and key_b act for
// owner "o"; sandbox "sbx" is o's (found, though not running: the zero
// Sandbox); signers are what SignerKeys answers (another replica's
// sandboxes and their owners' keys).
type countingBackend struct {
	Backend
	signers map[string][]string

	mu    sync.Mutex
	calls map[string]int
}

func (b *countingBackend) count(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls == nil {
		b.calls = map[string]int{}
	}
	b.calls[name]++
}

// took returns the calls so far and forgets them.
func (b *countingBackend) took() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.calls
	b.calls = nil
	return c
}

func (b *countingBackend) KeyOwner(_ context.Context, keyID string) (string, error) {
	b.count("KeyOwner")
	if keyID == "key_a" || keyID == "key_b" {
		return "o", nil
	}
	return "", apierr.New(apierr.AuthenticationFailed, "unknown key")
}

func (b *countingBackend) Sandbox(_ context.Context, owner, id string) (*sandbox.Sandbox, error) {
	b.count("Sandbox")
	if id != "sbx" || owner != "o" && owner != "" {
		return nil, apierr.New(apierr.SandboxNotFound, "no sandbox %s", id)
	}
	return &sandbox.Sandbox{ID: id}, nil
}

func (b *countingBackend) Sandboxes(context.Context, string) []*sandbox.Sandbox {
	b.count("Sandboxes")
	return nil
}

func (b *countingBackend) SignerKeys(context.Context) map[string][]string {
	b.count("SignerKeys")
	return b.signers
}

func (b *countingBackend) Authenticate(context.Context, string) (string, string, error) {
	b.count("Authenticate")
	return "", "", apierr.New(apierr.AuthenticationFailed, "no")
}

// request sends one request to h and returns its status.
func request(h http.Handler, method, target string, hdr ...string) int {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestAuthBeforeWork: a data-plane request without a valid credential is
// refused before the backend is asked anything, by at most one HMAC; a
// bogus signature is matched against the tokens known here (SHA-256s),
// and makes the handler learn the other replicas' tokens at most once
// per LearnInterval however many arrive. Controls: a valid token and a
// signature made with a learned token do reach the backend (the counts
// see work where there is some).
func TestAuthBeforeWork(t *testing.T) {
	t.Parallel()
	b := &countingBackend{signers: map[string][]string{"sbx": {"key_a", "key_b"}}}
	h := New(Config{LearnInterval: time.Hour}, b)
	forged := "key_a." + strings.Repeat("0", 64)
	envd := []string{"E2b-Sandbox-Id", "sbx", "E2b-Sandbox-Port", EnvdPort}
	interp := []string{"E2b-Sandbox-Id", "sbx", "E2b-Sandbox-Port", InterpreterPort}
	bogus := "signature=" + url.QueryEscape("v1_"+strings.Repeat("A", 43))

	for _, c := range []struct {
		name         string
		method, path string
		hdr          []string
		macs         int64
	}{
		{"envd health without a token", "GET", "/health", envd, 0},
		{"envd RPC without a token", "POST", "/filesystem.Filesystem/Stat", envd, 0},
		{"envd RPC with a garbage token", "POST", "/process.Process/List", append(envd, "X-Access-Token", "garbage"), 0},
		{"envd RPC with a forged token", "POST", "/process.Process/List", append(envd, "X-Access-Token", forged), 1},
		{"envd RPC with another sandbox's token", "POST", "/process.Process/List", append(envd, "X-Access-Token", h.token("other", "key_a")), 1},
		{"envd files without a token", "GET", "/files?path=a", envd, 0},
		{"envd files with a forged token", "GET", "/files?path=a", append(envd, "X-Access-Token", forged), 1},
		{"interpreter without tokens", "POST", "/execute", interp, 0},
		{"interpreter with a forged access token", "POST", "/execute", append(interp, "X-Access-Token", forged), 1},
		{"interpreter with a forged traffic token", "GET", "/contexts", append(interp, "E2B-Traffic-Access-Token", forged), 1},
		{"control plane files without a signature", "GET", "/files?path=a", nil, 0},
		{"a signature no SHA-256 made", "GET", "/files?path=a&signature=v1_garbage", nil, 0},
		{"a signature no SHA-256 made, naming the sandbox", "POST", "/files?path=a&signature=v1_", envd, 0},
	} {
		h.macs.Store(0)
		if st := request(h, c.method, c.path, c.hdr...); st != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", c.name, st)
		}
		if calls := b.took(); len(calls) != 0 {
			t.Errorf("%s: the backend was asked %v before the credential was checked", c.name, calls)
		}
		if n := h.macs.Load(); n != c.macs {
			t.Errorf("%s: %d HMACs, want %d", c.name, n, c.macs)
		}
	}

	// Bogus signatures, with and without the sandbox named: the first
	// learns the other replicas' tokens (one HMAC per sandbox and key),
	// the rest cost no HMAC and no call at all.
	h.macs.Store(0)
	for i := range 50 {
		hdr := envd
		if i%2 == 0 {
			hdr = nil // a plain fetch of a signed URL
		}
		if st := request(h, "GET", "/files?path=a&"+bogus, hdr...); st != http.StatusUnauthorized {
			t.Fatalf("a bogus signature: %d, want 401", st)
		}
	}
	if calls := b.took(); len(calls) != 1 || calls["SignerKeys"] != 1 {
		t.Fatalf("50 bogus signatures asked the backend %v, want SignerKeys once", calls)
	}
	if n := h.macs.Load(); n != 2 {
		t.Fatalf("50 bogus signatures cost %d HMACs, want 2 (one learning: a sandbox, two keys)", n)
	}

	// Controls: a valid token reaches its key's owner and the sandbox
	// (not running here: 502); so does a signature made with a token
	// this handler never issued but learned.
	if st := request(h, "GET", "/health", append(envd, "X-Access-Token", h.token("sbx", "key_b"))...); st != http.StatusBadGateway {
		t.Fatalf("a valid token: %d, want 502 (the sandbox is not running)", st)
	}
	if calls := b.took(); calls["KeyOwner"] != 1 || calls["Sandbox"] != 1 {
		t.Fatalf("a valid token asked the backend %v", calls)
	}
	sig := "signature=" + url.QueryEscape(sign("a", "read", "", h.token("sbx", "key_b"), ""))
	if st := request(h, "GET", "/files?path=a&"+sig); st != http.StatusBadGateway {
		t.Fatalf("a signature of a learned token: %d, want 502 (the sandbox is not running)", st)
	}
	if calls := b.took(); calls["KeyOwner"] != 1 || calls["Sandbox"] != 1 || calls["SignerKeys"] != 0 {
		t.Fatalf("a signature of a learned token asked the backend %v", calls)
	}
}

// TestLearnAlone: a server alone (SignerKeys answers nothing) searches its
// own tokens once per signature and learns nothing, and a signature of a
// token it issued is found without asking the backend.
func TestLearnAlone(t *testing.T) {
	t.Parallel()
	b := &countingBackend{}
	h := New(Config{LearnInterval: time.Nanosecond}, b)
	tok := h.issue("sbx", "key_a")
	h.macs.Store(0)
	bogus := "signature=" + url.QueryEscape("v1_"+strings.Repeat("A", 43))
	for range 5 {
		if st := request(h, "GET", "/files?path=a&"+bogus); st != http.StatusUnauthorized {
			t.Fatalf("a bogus signature: %d", st)
		}
	}
	if calls := b.took(); calls["SignerKeys"] > 5 || len(calls) > 1 {
		t.Fatalf("bogus signatures asked the backend %v", calls)
	}
	if h.macs.Load() != 0 {
		t.Fatalf("bogus signatures cost %d HMACs on a server alone", h.macs.Load())
	}
	sig := "signature=" + url.QueryEscape(sign("a", "read", "", tok, ""))
	if st := request(h, "GET", "/files?path=a&"+sig); st != http.StatusBadGateway {
		t.Fatalf("a signature of an issued token: %d, want 502 (the sandbox is not running)", st)
	}
	if calls := b.took(); calls["SignerKeys"] != 0 || calls["KeyOwner"] != 1 {
		t.Fatalf("a signature of an issued token asked the backend %v", calls)
	}
}

// BenchmarkBogusSignature is what an anonymous signed URL that matches
// nothing costs a handler that knows 1000 tokens (no sandbox named): one
// SHA-256 each, no HMAC, no call.
func BenchmarkBogusSignature(b *testing.B) {
	h := New(Config{LearnInterval: time.Hour}, &countingBackend{})
	for i := range 1000 {
		h.issue(fmt.Sprintf("sbx%04d", i), "key_a")
	}
	h.learnedAt = time.Now()
	r := httptest.NewRequest("GET", "/files?path=a&signature="+url.QueryEscape("v1_"+strings.Repeat("A", 43)), nil)
	s, _ := signedOf(r)
	b.ResetTimer()
	for b.Loop() {
		if _, _, msg := h.signer(context.Background(), "", s); msg != "invalid signature" {
			b.Fatal(msg)
		}
	}
}
