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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// replica is a second server over e's store and runtime: two replicas of
// one deployment, whose sandboxes outlive each (sandbox.Config.Shared).
type replica struct {
	*env
	close func() // shuts it down as `serve` does, leaving sandboxes running
}

func shared(c *sandbox.Config) { c.Shared = true }

// replicaKey is the preview key the replicas of these tests share (serve
// derives it from the agents' authority).
var replicaKey = []byte("0123456789abcdef0123456789abcdef")

func newReplica(t *testing.T, e *env, opts ...func(*server.Config)) *replica {
	t.Helper()
	var cfg server.Config
	for _, o := range opts {
		o(&cfg)
	}
	return newReplicaWith(t, e, cfg)
}

// newReplicaWith is newReplica with cfg (its Version, Events and
// PreviewKey are set here).
func newReplicaWith(t *testing.T, e *env, cfg server.Config) *replica {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
	m, err := sandbox.New(ctx, sandbox.Config{Runtime: e.rt, Logger: log, Events: bus, Shared: true,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version, cfg.Events, cfg.PreviewKey = "test", bus, replicaKey
	srv := server.New(cfg, st, m, log)
	hs := httptest.NewServer(srv)
	r := &replica{env: &env{t: t, srv: srv, url: hs.URL, store: st, dbPath: e.dbPath, engine: m, rt: e.rt, bus: bus,
		keyA: e.keyA, keyB: e.keyB}}
	var once bool
	r.close = func() {
		if once {
			return
		}
		once = true
		hs.Close()
		srv.Shutdown(ctx)
		if err := m.Close(ctx); err != nil {
			t.Error(err)
		}
		srv.Close(ctx)
		srv.RecordStopped(ctx)
		bus.Close()
		st.Close()
	}
	t.Cleanup(r.close)
	return r
}

// TestReplicasShareSandboxes: any replica serves any sandbox, with its
// state; a timeout set on one holds on the other; a kill on one is seen
// by the other; a replica that stops leaves its sandboxes to the rest.
func TestReplicasShareSandboxes(t *testing.T) {
	t.Parallel()
	a := newEnv(t, server.Config{PreviewKey: replicaKey}, shared)
	b := newReplica(t, a)

	id := a.create(a.keyA, map[string]any{"timeout": 60})
	want(t, a.do("POST", "/v1/sandboxes/"+id+"/execute", a.keyA, map[string]any{"code": "x = 41"}), http.StatusOK, "")
	r := b.do("POST", "/v1/sandboxes/"+id+"/execute", b.keyA, map[string]any{"code": "print(x + 1)"})
	want(t, r, http.StatusOK, "")
	if out := r.json(t)["stdout"]; out != "42\n" {
		t.Fatalf("on the other replica: stdout %q, want the first's state", out)
	}
	// Another owner does not see it on either.
	want(t, b.do("GET", "/v1/sandboxes/"+id, b.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	// A longer lifetime set on B holds on A, whose timer would end it.
	want(t, b.do("POST", "/v1/sandboxes/"+id+"/timeout", b.keyA, map[string]any{"timeout": 600}), http.StatusOK, "")
	got := a.do("GET", "/v1/sandboxes/"+id, a.keyA, nil).json(t)
	exp, _ := time.Parse(time.RFC3339Nano, got["expires_at"].(string))
	if d := time.Until(exp); d < 590*time.Second {
		t.Fatalf("replica A says it expires in %v; B extended it to 600s", d)
	}

	// Listed on both.
	for _, rp := range []*env{a, b.env} {
		l := rp.do("GET", "/v1/sandboxes", rp.keyA, nil).json(t)["sandboxes"].([]any)
		if len(l) != 1 || l[0].(map[string]any)["id"] != id || l[0].(map[string]any)["state"] != "running" {
			t.Fatalf("listing: %v", l)
		}
	}

	// Killed on B: A answers it stopped, and holds it no more.
	want(t, b.do("DELETE", "/v1/sandboxes/"+id, b.keyA, nil), http.StatusNoContent, "")
	r = a.do("POST", "/v1/sandboxes/"+id+"/execute", a.keyA, map[string]any{"code": "1"})
	want(t, r, http.StatusConflict, "ERR_SANDBOX_STATE")
	if _, err := a.engine.Get(id); err == nil {
		t.Fatal("replica A still holds a sandbox B killed")
	}
	if rec, _ := a.store.GetSandbox(context.Background(), id); rec.State != store.SandboxStopped || rec.StopReason != "killed" {
		t.Fatalf("record %+v", rec)
	}

	// A replica that stops leaves its sandboxes running: the other
	// serves them, state and all.
	id2 := b.create(b.keyA, map[string]any{"timeout": 60})
	want(t, b.do("POST", "/v1/sandboxes/"+id2+"/execute", b.keyA, map[string]any{"code": "y = 7"}), http.StatusOK, "")
	b.close()
	r = a.do("POST", "/v1/sandboxes/"+id2+"/execute", a.keyA, map[string]any{"code": "print(y * 6)"})
	want(t, r, http.StatusOK, "")
	if out := r.json(t)["stdout"]; out != "42\n" {
		t.Fatalf("after its creator stopped: stdout %q", out)
	}
	want(t, a.do("DELETE", "/v1/sandboxes/"+id2, a.keyA, nil), http.StatusNoContent, "")
	if ids, _ := a.rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("left in the runtime: %v", ids)
	}
}

// TestReplicasShareSandboxRateLimit: a sandbox's rate_limiting holds across
// replicas (its agent keeps the budget): three executions a minute in
// all, wherever they land, not three on each.
func TestReplicasShareSandboxRateLimit(t *testing.T) {
	t.Parallel()
	a := newEnv(t, server.Config{PreviewKey: replicaKey}, shared)
	b := newReplica(t, a)
	id := a.create(a.keyA, map[string]any{"security_policy": map[string]any{"rate_limiting": map[string]any{"requests_per_minute": 3}}})
	for _, rp := range []*env{a, b.env, b.env} {
		want(t, rp.do("POST", "/v1/sandboxes/"+id+"/execute", rp.keyA, map[string]any{"code": "1"}), http.StatusOK, "")
	}
	for _, rp := range []*env{a, b.env} {
		r := rp.do("POST", "/v1/sandboxes/"+id+"/execute", rp.keyA, map[string]any{"code": "1"})
		want(t, r, http.StatusTooManyRequests, "ERR_RATE_LIMITED")
		if r.header.Get("Retry-After") == "" {
			t.Fatal("a refused execution without Retry-After")
		}
	}
}

// TestReplicasCollector: the collector destroys what no record claims
// and ends records whose sandbox is gone; it spares creates in flight,
// warm pool members, and volumes' attendants within their lifetime
// (serving a long call through another replica), not past it nor ended.
func TestReplicasCollector(t *testing.T) {
	// The grace is an hour while nothing may happen, none once it has
	// passed: a create through the server takes more than any short grace
	// under -race on a loaded machine (200 ms failed 1 run in 30).
	defer server.SetCollectGrace(time.Hour)()
	a := newEnv(t, server.Config{CollectInterval: time.Hour, PreviewKey: replicaKey}, shared)
	ctx := context.Background()

	// A sandbox whose record is lost (its replica died between the two),
	// a pool member, and a recorded sandbox whose runtime lost it.
	if _, err := a.rt.Create(ctx, runtime.Spec{ID: "orphan0000000000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.rt.Create(ctx, runtime.Spec{ID: "warm00000000000", Pool: true}); err != nil {
		t.Fatal(err)
	}
	lost := a.create(a.keyA, map[string]any{"timeout": 60})
	if err := a.rt.Destroy(ctx, lost); err != nil {
		t.Fatal(err)
	}
	// A pool member whose replica died ended itself when its lease ran
	// out: collected at once, grace or not (its replica, gone, destroys
	// nothing; a Kubernetes CI run left one when the replicas stopped).
	if _, err := a.rt.Create(ctx, runtime.Spec{ID: "ended0000000000", Pool: true}); err != nil {
		t.Fatal(err)
	}
	a.rt.End("ended0000000000")
	// Volumes' attendants: one within its lifetime, one past it, one
	// within it whose agent ended. The short lifetime is still long
	// enough for the fake agent to listen before it ends (1 ms was not,
	// under load: "fake agent did not listen").
	const short = 300 * time.Millisecond
	for id, life := range map[string]time.Duration{"vfserving000000": time.Hour, "vfpast000000000": short, "vfended00000000": time.Hour} {
		if _, err := a.rt.Create(ctx, runtime.Spec{ID: id, Attendant: true, Lifetime: life}); err != nil {
			t.Fatal(err)
		}
	}
	a.rt.End("vfended00000000")
	past := time.Now().Add(short) // every lifetime began before now
	a.srv.Collect()               // the rest within the grace: nothing happens to them
	if ids, _ := a.rt.List(ctx); len(ids) != 5 || slices.Contains(ids, "ended0000000000") {
		t.Fatalf("within the grace the collector left: %v", ids)
	}
	server.SetCollectGrace(0) // the deferred restore puts back the default
	time.Sleep(time.Until(past.Add(10 * time.Millisecond)))
	a.srv.Collect()
	ids, _ := a.rt.List(ctx)
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"vfserving000000", "warm00000000000"}) {
		t.Fatalf("after the grace: %v left, want the pool member and the attendant within its lifetime", ids)
	}
	rec, err := a.store.GetSandbox(ctx, lost)
	if err != nil || rec.State != store.SandboxStopped || rec.StopReason == "" {
		t.Fatalf("record of the lost sandbox: %+v, %v", rec, err)
	}
	want(t, a.do("POST", "/v1/sandboxes/"+lost+"/execute", a.keyA, map[string]any{"code": "1"}), http.StatusConflict, "ERR_SANDBOX_STATE")
	for _, id := range ids {
		if err := a.rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplicasCollectAtShutdown: a replica that stops collects what ended
// since its last collection (a warm pool member of a dead replica, whose
// node reported it only now), so that the last replica to stop leaves
// nothing ended behind.
func TestReplicasCollectAtShutdown(t *testing.T) {
	a := newEnv(t, server.Config{CollectInterval: time.Hour, PreviewKey: replicaKey}, shared)
	ctx := context.Background()
	if _, err := a.rt.Create(ctx, runtime.Spec{ID: "ended0000000000", Pool: true}); err != nil {
		t.Fatal(err)
	}
	a.rt.End("ended0000000000")
	if ids, _ := a.rt.List(ctx); !slices.Contains(ids, "ended0000000000") {
		t.Fatalf("before the shutdown: %v", ids)
	}
	if err := a.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if ids, _ := a.rt.List(ctx); slices.Contains(ids, "ended0000000000") {
		t.Fatalf("the stopped replica left an ended pool member: %v", ids)
	}
}

// TestReplicasE2B: a sandbox made through E2B's control plane on one
// replica is served by the other with the same access token, signed URLs
// and template alias.
func TestReplicasE2B(t *testing.T) {
	t.Parallel()
	a := newEnv(t, server.Config{PreviewKey: replicaKey}, shared)
	b := newReplica(t, a)
	sb := a.e2bCreate(a.keyA, map[string]any{"templateID": "base"})

	// The access token works on B; a forged one does not.
	want(t, b.envd(sb, "POST", "/files?path=hello.txt", "from B", "Content-Type", "application/octet-stream"), http.StatusOK, "")
	forged := sb
	forged.Token = sb.Token[:len(sb.Token)-1] + "0"
	if forged.Token == sb.Token {
		forged.Token = sb.Token[:len(sb.Token)-1] + "1"
	}
	if r := b.envd(forged, "GET", "/files?path=hello.txt", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("a forged token on B: %d %s", r.status, r.body)
	}
	// A signed URL (no sandbox headers) made with A's token, on B.
	raw := "hello.txt:read::" + sb.Token
	sum := sha256.Sum256([]byte(raw))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	r := b.do("GET", "/files?path=hello.txt&signature="+url.QueryEscape(sig), "", nil)
	if r.status != http.StatusOK || string(r.body) != "from B" {
		t.Fatalf("a signed URL on the other replica: %d %s", r.status, r.body)
	}
	// B lists it with the alias it was created with.
	l := b.e2bDo("GET", "/sandboxes", b.keyA, nil)
	want(t, l, http.StatusOK, "")
	if !strings.Contains(string(l.body), `"templateID":"base"`) || !strings.Contains(string(l.body), sb.ID) {
		t.Fatalf("listing on B: %s", l.body)
	}
	// Previews on B follow E2B's traffic rules as A recorded them.
	app := startApp(t)
	port := strconv.Itoa(app.port)
	r = b.get("GET", "", "/x", "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", port)
	want(t, r, http.StatusOK, "")
	closed := a.e2bCreate(a.keyA, map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}})
	hdr := []string{"E2b-Sandbox-Id", closed.ID, "E2b-Sandbox-Port", port}
	if r := b.get("GET", "", "/", hdr...); r.status != http.StatusUnauthorized {
		t.Fatalf("a private sandbox's port on B without a token: %d", r.status)
	}
	want(t, b.get("GET", "", "/", append(hdr, "E2B-Traffic-Access-Token", closed.Traffic)...), http.StatusOK, "")

	// Killed on A, it is no longer listed on B, which held it.
	want(t, a.e2bDo("DELETE", "/sandboxes/"+sb.ID, a.keyA, nil), http.StatusNoContent, "")
	if l := b.e2bDo("GET", "/sandboxes", b.keyA, nil); strings.Contains(string(l.body), sb.ID) {
		t.Fatalf("B lists a sandbox A killed: %s", l.body)
	}
	// The SDK's isRunning on B, which held it: the sandbox is gone (502).
	if r := b.envd(sb, "GET", "/health", nil); r.status != http.StatusBadGateway {
		t.Fatalf("health on B of a sandbox A killed: %d %s", r.status, r.body)
	}
	want(t, b.e2bDo("DELETE", "/sandboxes/"+closed.ID, b.keyA, nil), http.StatusNoContent, "")
}

// TestReplicasEndExecutionsOfStoppedReplicas: the collector ends the
// executions a replica that died recorded as running, and never those of
// a live replica; a replica that stops ends its own at once.
func TestReplicasEndExecutionsOfStoppedReplicas(t *testing.T) {
	t.Parallel()
	a := newEnv(t, server.Config{CollectInterval: time.Hour, PreviewKey: replicaKey}, shared)
	b := newReplica(t, a)
	ctx := context.Background()
	if a.srv.Replica() == "" || a.srv.Replica() == b.srv.Replica() {
		t.Fatalf("replica names %q and %q", a.srv.Replica(), b.srv.Replica())
	}
	// One execution running on each replica, each in a sandbox of its own.
	long := map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}
	onA, onB := a.create(a.keyA, map[string]any{"timeout": 120}), b.create(b.keyA, map[string]any{"timeout": 120})
	restA := a.openNDJSON("POST", "/v1/sandboxes/"+onA+"/execute", long, stdoutHas("started"))
	restB := b.openNDJSON("POST", "/v1/sandboxes/"+onB+"/execute", long, stdoutHas("started"))
	record := func(sandbox string) store.Execution {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			l, err := a.store.ListExecutions(ctx, sandbox)
			if err != nil {
				t.Fatal(err)
			}
			if len(l) == 1 { // its first write is beside the execution
				return l[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("executions of %s: %+v", sandbox, l)
			}
		}
	}
	if ra, rb := record(onA), record(onB); ra.Status != store.ExecutionRunning || rb.Status != store.ExecutionRunning {
		t.Fatalf("records %+v, %+v; want both running", ra, rb)
	}
	// While both live, collecting ends nothing.
	a.srv.Collect()
	b.srv.Collect()
	if ra, rb := record(onA), record(onB); ra.Status != store.ExecutionRunning || rb.Status != store.ExecutionRunning {
		t.Fatalf("after collecting with both alive: %+v, %+v", ra, rb)
	}
	// B dies: its heartbeat lapses (its renewals are an hour apart). A's
	// collector ends B's execution, and not its own.
	if err := a.store.Heartbeat(ctx, b.srv.Replica(), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	a.srv.Collect()
	if rb := record(onB); rb.Status != store.ExecutionError || rb.ErrorCode != "ERR_INTERNAL" || rb.Error != "the server running it stopped" {
		t.Fatalf("the dead replica's execution: %+v", rb)
	}
	if ra := record(onA); ra.Status != store.ExecutionRunning {
		t.Fatalf("the live replica's execution: %+v", ra)
	}
	// A replica that stops ends what it still records as running.
	c := newReplica(t, a)
	if err := a.store.AddExecution(ctx, store.Execution{ID: "cut-by-stop", SandboxID: "sb-of-c", Owner: "o", Replica: c.srv.Replica(),
		Status: store.ExecutionRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	c.close()
	if rc := record("sb-of-c"); rc.Status != store.ExecutionError || rc.Error != "the server running it stopped" {
		t.Fatalf("the stopped replica's execution: %+v", rc)
	}
	if ra := record(onA); ra.Status != store.ExecutionRunning {
		t.Fatalf("the live replica's execution after another stopped: %+v", ra)
	}
	for _, id := range []string{onA, onB} {
		want(t, a.do("DELETE", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusNoContent, "")
	}
	for _, rest := range []<-chan ndjsonRest{restA, restB} {
		select {
		case <-rest:
		case <-time.After(15 * time.Second):
			t.Fatal("an execution's stream did not end with its sandbox")
		}
	}
}

// TestReplicasMeterOnce: a sandbox two replicas hold is metered once (its
// CPU-seconds and GB-seconds are not counted twice), and goes on being
// metered, from where its creator's last flush left it, when its creator
// dies; its last usage is counted when another replica kills it.
func TestReplicasMeterOnce(t *testing.T) {
	t.Parallel()
	mcfg := metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond}
	a := newEnv(t, server.Config{PreviewKey: replicaKey, Metering: mcfg}, shared)
	b := newReplicaWith(t, a, server.Config{Metering: mcfg})
	ctx := context.Background()
	const s = int64(time.Second)
	created := time.Now()
	id := b.create(b.keyA, map[string]any{"timeout": 120})
	want(t, a.do("GET", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusOK, "") // A adopts it
	stored := func() store.UsageRow {
		t.Helper()
		rows, err := a.store.QueryUsage(ctx, store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
		if err != nil || len(rows) > 1 {
			t.Fatalf("usage %+v, %v", rows, err)
		}
		if len(rows) == 0 {
			return store.UsageRow{}
		}
		return rows[0]
	}
	waitCPU := func(cpu int64) store.UsageRow {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if u := stored(); u.CPUNanos == cpu {
				return u
			} else if time.Now().After(deadline) {
				t.Fatalf("stored usage %+v; want %d CPU-ns", u, cpu)
			}
		}
	}
	// Wall time (and the GB-seconds reserved, its multiple) counted once
	// is at most the time since the create, and not much less.
	once := func(u store.UsageRow, elapsed time.Duration) {
		t.Helper()
		wall := time.Duration(u.WallNanos)
		if wall > elapsed || wall < elapsed-time.Second {
			t.Fatalf("%v of wall time metered in %v: %+v", wall, elapsed, u)
		}
		if gb := u.GBSecondsReserved / wall.Seconds(); gb <= 0 || gb > 64 {
			t.Fatalf("GB-seconds reserved %v for %v of wall time", u.GBSecondsReserved, wall)
		}
	}

	// Both hold it: its CPU counter's 10 s are counted once, however
	// many flushes both make.
	a.rt.SetUsed(runtime.Usage{CPUNanos: uint64(10 * s), MemoryBytes: 1 << 30})
	waitCPU(10 * s)
	waitFlushes(t, 3, a, b.env)
	u := waitCPU(10 * s)
	once(u, time.Since(created))
	gbPerSecond := u.GBSecondsReserved / time.Duration(u.WallNanos).Seconds()

	// B, its creator and meter, dies: it reaches the store no more (what
	// it sampled since its last flush is lost with it). A takes the lease
	// once it lapsed and meters from B's last flush on.
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}
	a.rt.SetUsed(runtime.Usage{CPUNanos: uint64(25 * s), MemoryBytes: 1 << 30})
	once(waitCPU(25*s), time.Since(created))
	b.close()
	a.rt.SetUsed(runtime.Usage{CPUNanos: uint64(30 * s), MemoryBytes: 1 << 30})
	waitCPU(30 * s)

	// Killed through A: its last sample is counted, nothing after.
	want(t, a.do("DELETE", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusNoContent, "")
	elapsed := time.Since(created)
	waitFlushes(t, 3, a)
	u = waitCPU(30 * s)
	once(u, elapsed)
	if gb := u.GBSecondsReserved / time.Duration(u.WallNanos).Seconds(); gb < gbPerSecond*0.999 || gb > gbPerSecond*1.001 {
		t.Fatalf("GB-seconds reserved per second: %v, then %v", gbPerSecond, gb)
	}
}

// TestReplicasMeterAfterStop: a replica that stops lets go of the meter
// leases of the sandboxes it held (they run on), and another goes on
// metering them from where it stopped.
func TestReplicasMeterAfterStop(t *testing.T) {
	t.Parallel()
	mcfg := metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond}
	a := newEnv(t, server.Config{PreviewKey: replicaKey, Metering: mcfg}, shared)
	b := newReplicaWith(t, a, server.Config{Metering: mcfg})
	ctx := context.Background()
	id := b.create(b.keyA, map[string]any{"timeout": 120})
	want(t, a.do("GET", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusOK, "")
	cpu := func(want uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			rows, err := a.store.QueryUsage(ctx, store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 1 && uint64(rows[0].CPUNanos) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("usage %+v; want %d CPU-ns", rows, want)
			}
		}
	}
	a.rt.SetUsed(runtime.Usage{CPUNanos: 3e9})
	cpu(3e9)
	b.close() // its sandbox runs on
	a.rt.SetUsed(runtime.Usage{CPUNanos: 7e9})
	cpu(7e9)
	want(t, a.do("DELETE", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusNoContent, "")
	cpu(7e9)
}

// TestReplicasMeterLeaseLost: a replica whose meter lease another took
// (it was too slow to renew it) writes nothing more of the sandbox, and
// the next holder goes on from the counters the lease holds.
func TestReplicasMeterLeaseLost(t *testing.T) {
	t.Parallel()
	mcfg := metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond}
	a := newEnv(t, server.Config{PreviewKey: replicaKey, Metering: mcfg}, shared)
	b := newReplicaWith(t, a, server.Config{Metering: mcfg})
	ctx := context.Background()
	id := b.create(b.keyA, map[string]any{"timeout": 120})
	want(t, a.do("GET", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusOK, "")
	stored := func() int64 {
		rows, err := a.store.QueryUsage(ctx, store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
		if err != nil || len(rows) > 1 {
			t.Fatalf("usage %+v, %v", rows, err)
		}
		if len(rows) == 0 {
			return 0
		}
		return rows[0].CPUNanos
	}
	a.rt.SetUsed(runtime.Usage{CPUNanos: 2e9})
	for deadline := time.Now().Add(10 * time.Second); stored() != 2e9; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stored CPU %d, want 2e9", stored())
		}
	}
	// A third party takes the lease as if its holder's had lapsed, for
	// three seconds: both replicas' samples of that time are not counted,
	// however many flushes they make meanwhile.
	until := time.Now().Add(3 * time.Second)
	l, held, err := a.store.TakeMeterLease(ctx, store.MeterLease{SandboxID: id, Replica: "thief", Until: until},
		time.Now().Add(time.Hour))
	if err != nil || !held || l.CPUNanos != 2e9 {
		t.Fatalf("take the lease: %+v, %v, %v", l, held, err)
	}
	a.rt.SetUsed(runtime.Usage{CPUNanos: 5e9})
	waitFlushes(t, 3, a, b.env)
	if cpu := stored(); cpu != 2e9 && time.Now().Before(until) {
		t.Fatalf("stored CPU %d while neither replica held the lease; want 2e9", cpu)
	} else if cpu != 2e9 {
		t.Fatalf("the replicas' flushes took past the taken lease (%v): the test proves nothing", time.Since(until))
	}
	// Once it lapsed, a replica takes it and counts from its counters.
	for deadline := time.Now().Add(10 * time.Second); stored() != 5e9; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stored CPU %d after the lease lapsed, want 5e9", stored())
		}
	}
	want(t, a.do("DELETE", "/v1/sandboxes/"+id, a.keyA, nil), http.StatusNoContent, "")
}
