package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// countingStore counts the look-ups of sandboxes and keys a server makes.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingStore) count(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[name]++
}

// took returns the look-ups so far and forgets them.
func (c *countingStore) took() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.calls
	c.calls = map[string]int{}
	return m
}

func (c *countingStore) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	c.count("GetSandbox")
	return c.Store.GetSandbox(ctx, id)
}

func (c *countingStore) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	c.count("ListSandboxes")
	return c.Store.ListSandboxes(ctx, f)
}

func (c *countingStore) ListKeys(ctx context.Context) ([]store.Key, error) {
	c.count("ListKeys")
	return c.Store.ListKeys(ctx)
}

func (c *countingStore) KeyByID(ctx context.Context, id string) (store.Key, error) {
	c.count("KeyByID")
	return c.Store.KeyByID(ctx, id)
}

func (c *countingStore) KeyByHash(ctx context.Context, hash string) (store.Key, error) {
	c.count("KeyByHash")
	return c.Store.KeyByHash(ctx, hash)
}

// newCountedReplica is newReplica over a store that counts look-ups, with
// its collector left idle (it would look sandboxes up on its own).
func newCountedReplica(t *testing.T, e *env) (*replica, *countingStore) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: db, calls: map[string]int{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	m, err := sandbox.New(ctx, sandbox.Config{Runtime: e.rt, Logger: log, Events: bus, Shared: true,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Version: "test", Events: bus, PreviewKey: replicaKey, CollectInterval: time.Hour}, st, m, log)
	hs := httptest.NewServer(srv)
	r := &replica{env: &env{t: t, srv: srv, url: hs.URL, store: db, dbPath: e.dbPath, engine: m, rt: e.rt, bus: bus,
		keyA: e.keyA, keyB: e.keyB}}
	r.close = func() {
		hs.Close()
		srv.Shutdown(ctx)
		if err := m.Close(ctx); err != nil {
			t.Error(err)
		}
		srv.Close(ctx)
		bus.Close()
		db.Close()
	}
	t.Cleanup(r.close)
	return r, st
}

// TestReplicasE2BAuthBeforeWork: on a replica that does not hold a
// sandbox, E2B data-plane requests without a valid credential (no token,
// a forged one, a bogus signature, named or not) are refused with no
// look-up of the sandbox and without adopting it; bogus signatures make
// the replica learn the others' tokens once, not once each. Controls: a
// signature made with the creating replica's token is found (that one
// learning), and a valid token adopts the sandbox.
func TestReplicasE2BAuthBeforeWork(t *testing.T) {
	defer server.SetE2BLearnInterval(time.Hour)()
	a := newEnv(t, server.Config{PreviewKey: replicaKey}, shared)
	b, st := newCountedReplica(t, a)
	sb := a.e2bCreate(a.keyA, map[string]any{"templateID": "base"})
	want(t, a.envd(sb, "POST", "/files?path=hello.txt", "hello", "Content-Type", "application/octet-stream"), http.StatusOK, "")
	st.took()

	adopted := func() bool {
		_, err := b.engine.Get(sb.ID)
		return err == nil
	}
	forged := sb
	keyID, _, _ := strings.Cut(sb.Token, ".")
	forged.Token = keyID + "." + strings.Repeat("0", 64)
	bogus := "signature=" + url.QueryEscape("v1_"+strings.Repeat("A", 43))
	envd := []string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49983"}
	interp := []string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49999"}
	for _, c := range []struct {
		name string
		r    func() resp
	}{
		{"health without a token", func() resp { return b.do("GET", "/health", "", nil, envd...) }},
		{"an RPC without a token", func() resp {
			return b.do("POST", "/filesystem.Filesystem/Stat", "", `{"path":"hello.txt"}`, append(envd, "Content-Type", "application/json")...)
		}},
		{"a forged token", func() resp { return b.envd(forged, "GET", "/files?path=hello.txt", nil) }},
		{"the interpreter without tokens", func() resp { return b.do("GET", "/contexts", "", nil, interp...) }},
		{"the interpreter with a forged traffic token", func() resp {
			return b.do("GET", "/contexts", "", nil, append(interp, "E2B-Traffic-Access-Token", forged.Token)...)
		}},
		{"a bogus signature naming the sandbox", func() resp { return b.do("GET", "/files?path=hello.txt&"+bogus, "", nil, envd...) }},
		{"a bogus signature", func() resp { return b.do("GET", "/files?path=hello.txt&"+bogus, "", nil) }},
		{"another bogus signature", func() resp { return b.do("GET", "/files?path=hello.txt&"+bogus, "", nil) }},
	} {
		if r := c.r(); r.status != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s, want 401", c.name, r.status, r.body)
		}
		if adopted() {
			t.Fatalf("%s: the replica adopted the sandbox", c.name)
		}
	}
	calls := st.took()
	if calls["GetSandbox"] != 0 || calls["KeyByID"] != 0 || calls["KeyByHash"] != 0 || calls["ListSandboxes"] > 1 || calls["ListKeys"] > 1 {
		t.Fatalf("unauthenticated requests made the replica look up %v; want one learning at most", calls)
	}
	// What the replica learned for signed URLs is not a list of its
	// own sandboxes: another owner's listing and create (which prunes
	// what the E2B surface keeps) adopt nothing.
	want(t, b.e2bDo("GET", "/v2/sandboxes", b.keyB, nil), http.StatusOK, "")
	other := b.e2bCreate(b.keyB, map[string]any{"templateID": "base"})
	if adopted() {
		t.Fatal("another owner's listing or create adopted the sandbox")
	}
	want(t, b.e2bDo("DELETE", "/sandboxes/"+other.ID, b.keyB, nil), http.StatusNoContent, "")
	st.took()

	// /v1 and E2B's control plane: every route without a key, with a
	// malformed one and with an unknown one is refused after one look-up
	// of the key by its hash at most, and nothing else.
	unknown := "sf_" + strings.Repeat("0", 40)
	for _, pat := range b.srv.Routes() {
		method, path, _ := strings.Cut(pat, " ")
		switch pat {
		case "GET /healthz", "GET /readyz", "GET /v1/openapi.json", "GET /.well-known/openid-configuration", "GET /.well-known/jwks.json", "POST /ui/login", "POST /ui/logout":
			continue // anonymous by design
		}
		target := fill(path, map[string]string{"id": sb.ID, "ctx": "c", "pid": "1", "port": "8080", "account": "a"})
		for _, key := range []string{"", "garbage", unknown} {
			if r := b.do(method, target, key, "{}"); r.status != http.StatusUnauthorized {
				t.Fatalf("%s with key %q: %d %s", pat, key, r.status, r.body)
			}
			if calls := st.took(); len(calls) > 1 || calls["KeyByHash"] > 1 || key != unknown && len(calls) > 0 {
				t.Fatalf("%s with key %q looked up %v", pat, key, calls)
			}
		}
	}
	for _, route := range b.srv.E2BRoutes() {
		method, path, _ := strings.Cut(route, " ")
		if !strings.HasPrefix(path, "/") || path == "/files" {
			continue // the data planes ("49983 POST /..."), and signed URLs above
		}
		target := fill(path, map[string]string{"id": sb.ID})
		for _, key := range []string{"", "garbage", "e2b_" + strings.Repeat("0", 40)} {
			if r := b.do(method, target, "", "{}", "X-API-Key", key); r.status != http.StatusUnauthorized {
				t.Fatalf("E2B %s with key %q: %d %s", route, key, r.status, r.body)
			}
			if calls := st.took(); len(calls) > 1 || calls["KeyByHash"] > 1 {
				t.Fatalf("E2B %s with key %q looked up %v", route, key, calls)
			}
		}
	}
	if adopted() {
		t.Fatal("requests without a valid key adopted the sandbox")
	}

	// Controls. A URL signed with the token A issued (no sandbox header)
	// is found on B, through that one learning, and serves the file.
	sum := sha256.Sum256([]byte("hello.txt:read::" + sb.Token))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if r := b.do("GET", "/files?path=hello.txt&signature="+url.QueryEscape(sig), "", nil); r.status != http.StatusOK || string(r.body) != "hello" {
		t.Fatalf("a signed URL on B: %d %s", r.status, r.body)
	}
	if calls := st.took(); calls["ListSandboxes"]+calls["ListKeys"] != 0 {
		t.Fatalf("a signed URL after the learning looked up %v", calls)
	}
	if !adopted() {
		t.Fatal("a valid signed URL did not adopt the sandbox: the adoption check above proves nothing")
	}
	// A valid token works on B.
	if r := b.envd(sb, "GET", "/health", nil); r.status != http.StatusNoContent {
		t.Fatalf("health with the token on B: %d %s", r.status, r.body)
	}
}

// TestReplicasPreviewAuthBeforeWork: an anonymous preview request on a
// replica that does not hold the sandbox is refused without adopting it,
// unless its traffic is public (E2B's allowPublicTraffic, from its
// record). Controls: the sandbox's preview token adopts it (and reaches
// the port: nothing listens, 502), and so does a public E2B sandbox's
// anonymous request.
func TestReplicasPreviewAuthBeforeWork(t *testing.T) {
	t.Parallel()
	a := newEnv(t, server.Config{PreviewKey: replicaKey}, shared)
	b := newReplica(t, a)
	id := a.create(a.keyA, nil)
	private := a.e2bCreate(a.keyA, map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}})
	public := a.e2bCreate(a.keyA, map[string]any{"templateID": "base"})
	held := func(id string) bool {
		_, err := b.engine.Get(id)
		return err == nil
	}
	port := strconv.Itoa(closedPort(t))
	if r := b.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+"/"); r.status != http.StatusUnauthorized || held(id) {
		t.Fatalf("an anonymous preview on B: %d, adopted %v", r.status, held(id))
	}
	if r := b.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+"/", "Sheepfold-Preview-Token", "sfp_"+strings.Repeat("0", 40)); r.status != http.StatusUnauthorized || held(id) {
		t.Fatalf("a forged preview token on B: %d, adopted %v", r.status, held(id))
	}
	if r := b.get("GET", "", "/", "E2b-Sandbox-Id", private.ID, "E2b-Sandbox-Port", port); r.status != http.StatusUnauthorized || held(private.ID) {
		t.Fatalf("an anonymous request to a private E2B sandbox's port on B: %d, adopted %v", r.status, held(private.ID))
	}

	ports := a.do("GET", "/v1/sandboxes/"+id+"/ports", a.keyA, nil)
	want(t, ports, http.StatusOK, "")
	tok, _ := ports.json(t)["token"].(string)
	if r := b.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+"/", "Sheepfold-Preview-Token", tok); r.status != http.StatusBadGateway || !held(id) {
		t.Fatalf("the preview token on B: %d, adopted %v; want 502 (nothing listens) from the adopted sandbox", r.status, held(id))
	}
	if r := b.get("GET", "", "/", "E2b-Sandbox-Id", public.ID, "E2b-Sandbox-Port", port); r.status != http.StatusBadGateway || !held(public.ID) {
		t.Fatalf("an anonymous request to a public E2B sandbox's port on B: %d, adopted %v; want 502 from the adopted sandbox", r.status, held(public.ID))
	}
}
