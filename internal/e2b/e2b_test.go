package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"maps"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func TestMetadataFilter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw  string
		want map[string]string
		bad  bool
	}{
		{raw: "", want: nil},
		// {k: v, "a b": "c=d"} after the SDK's encoding and one decoding by the HTTP server.
		{raw: "k%3Dv%26a%2520b%3Dc%253Dd", want: map[string]string{"k": "v", "a b": "c=d"}},
		{raw: "k%3D", want: map[string]string{"k": ""}},
		{raw: "%zz", bad: true},
	} {
		got, err := metadataFilter(tc.raw)
		if (err != nil) != tc.bad || !maps.Equal(got, tc.want) {
			t.Errorf("metadataFilter(%q) = %v, %v; want %v (error %v)", tc.raw, got, err, tc.want, tc.bad)
		}
	}
}

func TestUnquote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"'a b'": "a b", `"x"`: "x", "42": "42", "'": "'", `'a"`: `'a"`, "''": ""} {
		if got := unquote(in); got != want {
			t.Errorf("unquote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPageCursorRoundTrip(t *testing.T) {
	t.Parallel()
	c := pageCursor{Started: time.Date(2026, 12, 3, 7, 0, 0, 123, time.UTC), ID: "abc"}
	got, err := parseCursor(c.String())
	if err != nil || !got.Started.Equal(c.Started) || got.ID != c.ID {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "!!", "bm90LWEtdGltZV9faWQ"} {
		if _, err := parseCursor(bad); err == nil {
			t.Errorf("parseCursor(%q) accepted", bad)
		}
	}
}

func TestLanguage(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "python", " Python ": "python", "js": "javascript", "JavaScript": "javascript", "ts": "typescript", "bash": "bash",
		"r": "r", "java": "java"} { // E2B's runCode(language: 'r' | 'java')
		if got, err := lang.Canonical(in); err != nil || got != want {
			t.Errorf("lang.Canonical(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"cobol", "deno"} {
		if _, err := lang.Canonical(in); err == nil {
			t.Errorf("lang.Canonical(%q) accepted", in)
		}
	}
}

func TestSignatureAndUser(t *testing.T) {
	t.Parallel()
	h := New(Config{}, nil)
	tok := h.token("sbx", "key_a")
	if tok == h.token("other", "key_a") || tok == h.token("sbx", "key_b") || tok == h.trafficToken("sbx", "key_a") ||
		!valid(tok, h.token("sbx", "key_a")) || valid("", "") {
		t.Fatal("access tokens do not tell sandboxes, keys and purposes apart")
	}
	if h.ValidTrafficToken("sbx", "key_a."+strings.Repeat("0", 64)) || h.ValidTrafficToken("sbx", "garbage") ||
		h.ValidTrafficToken("sbx", tok) {
		t.Fatal("a forged token passed") // refused before the (nil) backend is asked
	}
	if k, ok := tokenKey("sbx", tok, h.token); !ok || k != "key_a" {
		t.Fatalf("tokenKey of a token: %q, %v", k, ok)
	}
	// The SDK's algorithm, for path "a.txt", read, no user, token "t":
	// base64(sha256("a.txt:read::t")) without padding (computed with node crypto).
	if got := sign("a.txt", "read", "", "t", ""); got != "v1_2v3RGodSIuQBfrhry7d92pL2eC/VztnPNAoPk2Ut/Ic" {
		t.Errorf("sign = %s", got)
	}
	r := httptest.NewRequest("GET", "/files?path=a.txt&signature="+url.QueryEscape(sign("a.txt", "read", "", tok, "")), nil)
	s, ok := signedOf(r)
	if by, _ := s.by(tok, nil); !ok || !by || s.expired() {
		t.Errorf("valid signature refused")
	}
	if by, _ := s.by(h.token("other", "key_a"), nil); by {
		t.Error("signature accepted for another sandbox")
	}
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	r = httptest.NewRequest("POST", "/files?path=a.txt&signature_expiration="+past+"&signature="+url.QueryEscape(sign("a.txt", "write", "", tok, past)), nil)
	if s, ok := signedOf(r); !ok || !s.expired() || !must(s.by(tok, nil)) {
		t.Error("an expired write signature: not made by its token, or not expired")
	}
	for in, want := range map[string]string{"": "Basic dXNlcjo=", "root": "Basic cm9vdDo="} {
		u, err := basicUser(want)
		if err != nil || (in == "" && u != defaultUser) || (in != "" && u != in) {
			t.Errorf("basicUser(%q) = %q, %v", want, u, err)
		}
	}
	if _, err := basicUser("Basic " + "bWFsbG9yeTo="); err == nil {
		t.Error("unknown user accepted")
	}
	if _, err := basicUser("Bearer x"); err == nil {
		t.Error("non-Basic authorization accepted")
	}
}

// liveBackend finds only the sandboxes in live (running ones, per the
// Backend contract); the other methods are not used here.
type liveBackend struct {
	Backend
	live map[string]bool
}

func (b liveBackend) Sandbox(_ context.Context, _, id string) (*sandbox.Sandbox, error) {
	if !b.live[id] {
		return nil, apierr.New(apierr.SandboxNotFound, "sandbox %q not found", id)
	}
	return &sandbox.Sandbox{ID: id}, nil
}

// TestPrune: what the handler keeps about sandboxes that stopped on their
// own (timeout, idle) goes; that of running ones stays.
func TestPrune(t *testing.T) {
	t.Parallel()
	h := New(Config{}, liveBackend{live: map[string]bool{"live": true}})
	for _, id := range []string{"live", "dead", "dead2"} {
		h.aliases[id] = "base"
	}
	h.issued["issued-only"] = map[string]string{"t": "x"}
	h.prune(context.Background())
	if len(h.aliases) != 1 || h.aliases["live"] != "base" || len(h.issued) != 0 {
		t.Fatalf("after prune: aliases %v, issued %v", h.aliases, h.issued)
	}
}

func must(ok bool, _ []byte) bool { return ok }

// sign computes a file URL signature as E2B clients do:
// v1_ + base64(sha256("path:operation:user:token[:expiration]")), unpadded.
func sign(p, operation, user, token, expiration string) string {
	raw := p + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}
