package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// agentBin is the agent the fake runtime runs: cmd/sheepfold-agent, built
// for these tests. A build failure fails the tests: there is no stand-in.
var agentBin string

func TestMain(m *testing.M) {
	if spec := os.Getenv(floodClientEnv); spec != "" {
		os.Exit(runFloodClient(spec))
	}
	var err error
	if agentBin, err = testutil.BuildAgent(); err != nil {
		fmt.Fprintf(os.Stderr, "build the agent: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// env is one server over the fake runtime with two owners' keys.
type env struct {
	t       testing.TB
	srv     *server.Server
	url     string
	store   *sqlite.DB
	dbPath  string
	engine  *sandbox.Manager
	keyA    string // owner A
	keyB    string // owner B
	revoked string
	rt      *fake.Runtime
	bus     *events.Bus
}

// newEnv starts a server; opts adjust the engine's Config.
func newEnv(t testing.TB, cfg server.Config, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvLog(t, cfg, testLog(t), opts...)
}

// newEnvLog is newEnv with the server's, the engine's and the bus's log
// going to log.
func newEnvLog(t testing.TB, cfg server.Config, log *slog.Logger, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvStore(t, cfg, log, nil, opts...)
}

// newEnvStore is newEnvLog with the server's store wrapped by wrap (when
// not nil), e.g. to count its writes.
func newEnvStore(t testing.TB, cfg server.Config, log *slog.Logger, wrap func(*sqlite.DB) store.Store, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "sheepfold.db")
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	rt := &fake.Runtime{AgentBin: agentBin, Dir: testutil.ShortTempDir(t)}
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	cfg.Events = bus
	scfg := sandbox.Config{Runtime: rt, Logger: log, Events: bus,
		Templates: sandbox.TemplatesFunc(func(name string) (string, error) {
			if name != "python" {
				return "", os.ErrNotExist
			}
			return "/", nil
		})}
	for _, o := range opts {
		o(&scfg)
	}
	m, err := sandbox.New(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Version == "" {
		cfg.Version = "test"
	}
	var sst store.Store = st
	if wrap != nil {
		sst = wrap(st)
	}
	srv := server.New(cfg, sst, m, log)
	hs := httptest.NewServer(srv)
	e := &env{t: t, srv: srv, url: hs.URL, store: st, dbPath: dbPath, engine: m, rt: rt, bus: bus}
	for _, p := range []*string{&e.keyA, &e.keyB, &e.revoked} {
		k, secret, err := auth.Create(ctx, st, auth.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		*p = secret
		if p == &e.revoked {
			st.RevokeKey(ctx, k.ID, time.Now())
		}
	}
	t.Cleanup(func() {
		hs.Close()
		srv.Shutdown(ctx)
		if err := m.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
		srv.RecordStopped(ctx)
		bus.Close()
		st.Close()
	})
	return e
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d is not a JSON object: %v\n%s", r.status, err, r.body)
	}
	return m
}

// errCode returns the error code of an error response.
func (r resp) errCode(t testing.TB) string {
	t.Helper()
	m := r.json(t)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %s", r.body)
	}
	if e["request_id"] == "" || e["request_id"] != r.header.Get("X-Request-Id") {
		t.Fatalf("error request_id %v, header %q", e["request_id"], r.header.Get("X-Request-Id"))
	}
	if e["message"] == "" {
		t.Fatalf("error without message: %s", r.body)
	}
	return e["code"].(string)
}

// do sends a request; body may be nil, a string/[]byte (raw) or anything
// else (JSON). hdr are extra header pairs.
func (e *env) do(method, path, key string, body any, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// want fails unless r has the status (and, for errors, the code).
func want(t testing.TB, r resp, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if code != "" {
		if got := r.errCode(t); got != code {
			t.Fatalf("code %s, want %s: %s", got, code, r.body)
		}
	}
}

// create makes a sandbox for key and returns its id.
func (e *env) create(key string, body any) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes", key, body)
	want(e.t, r, http.StatusCreated, "")
	id, _ := r.json(e.t)["id"].(string)
	if id == "" {
		e.t.Fatalf("no id: %s", r.body)
	}
	return id
}

// home is the host directory of a sandbox's /home/user under the fake
// runtime, for checking from outside what commands did there.
func (e *env) home(id string) string {
	return filepath.Join(e.rt.Dir, id, "root", "home", "user")
}

// testLog is the tests' logger: everything on stderr with -v, else a
// failureLog.
func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return failureLog(t)
}

// failureLog is a logger of warnings and errors that the test prints
// (their last 64 KiB) only if it fails: a failure in CI then says what
// the server and the engine saw, where a quiet run prints nothing.
func failureLog(t testing.TB) *slog.Logger {
	var mu sync.Mutex
	var buf []byte
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		buf = append(buf, p...)
		if n := len(buf) - 64<<10; n > 0 {
			buf = append(buf[:0], buf[n:]...)
		}
		return len(p), nil
	})
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("the server's and the engine's warnings and errors (the last 64 KiB):\n%s", buf)
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// testInstance names a test's runtime instance: name and this process's
// id. An engine lists the sandboxes in its instance's cgroup as its own at
// start and destroys them as left over, so two test processes (two
// checkouts' suites at once) must never share one.
func testInstance(name string) string { return name + "-" + strconv.Itoa(os.Getpid()) }
