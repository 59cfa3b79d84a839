package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestPooledSnapshot keeps two sandboxes restored ahead from a snapshot:
// creates from it take them (sandboxes the runtime held before the
// creates, each with the snapshot's variable, each its own: a variable
// set in one is not in the other, and their ids differ), the pool is
// refilled, another account can neither size nor start from it (404),
// the account's bound holds, and the snapshot's delete leaves no
// container behind. The control of the claim: without a pool a create
// restores a sandbox the runtime did not hold before.
func TestPooledSnapshot(t *testing.T) {
	var rt runtime.Runtime
	e := runcEnvWith(t, server.Config{MaxSnapshotPoolPerAccount: 2}, func(c *sandbox.Config) { rt = c.Runtime })
	ids := func() []string {
		l, err := rt.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	id := e.create(e.keyA, map[string]any{})
	e.execIn(e.keyA, id, `x = 42`)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "p"}), http.StatusCreated, "")

	// The control: no pool, the create restores on its path.
	before := ids()
	cold := e.create(e.keyA, map[string]any{"snapshot": "p"})
	if slices.Contains(before, cold) {
		t.Fatalf("without a pool, the create got a sandbox the runtime held before: %s", cold)
	}

	want(t, e.do("POST", "/v1/snapshots/p/pool", e.keyB, map[string]any{"size": 1}), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", "/v1/snapshots/p/pool", e.keyA, map[string]any{"size": -1}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/snapshots/p/pool", e.keyA, map[string]any{"size": 3}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	want(t, e.do("POST", "/v1/snapshots/p/pool", e.keyA, map[string]any{"size": 2}), http.StatusOK, "")
	ready := func() int {
		r := e.do("GET", "/v1/snapshots/p/pool", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		return int(r.json(t)["ready"].(float64))
	}
	waitFor(t, "two members ready", func() bool { return ready() == 2 })
	want(t, e.do("GET", "/v1/snapshots/p/pool", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes", e.keyB, map[string]any{"snapshot": "p"}), http.StatusNotFound, "ERR_NOT_FOUND")
	if n := ready(); n != 2 {
		t.Fatalf("B's attempts took from A's pool: %d ready", n)
	}

	before = ids()
	c1 := e.create(e.keyA, map[string]any{"snapshot": "p"})
	c2 := e.create(e.keyA, map[string]any{"snapshot": "p"})
	if c1 == c2 || !slices.Contains(before, c1) || !slices.Contains(before, c2) {
		t.Fatalf("two creates from the pooled snapshot got %s and %s; the pool held %v", c1, c2, before)
	}
	for _, c := range []string{c1, c2} {
		if got := e.execIn(e.keyA, c, `print(x)`); got != "42\n" {
			t.Fatalf("a sandbox from the pool: %q, want the snapshot's variable", got)
		}
	}
	e.execIn(e.keyA, c1, `y = "c1's"`)
	if got := e.execIn(e.keyA, c2, `print("y" in globals())`); got != "False\n" {
		t.Fatalf("the second claim sees the first's variable: %q", got)
	}
	want(t, e.do("GET", "/v1/sandboxes/"+c1, e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	waitFor(t, "the pool refilled", func() bool { return ready() == 2 })

	for _, sb := range []string{id, cold, c1, c2} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, e.keyA, nil), http.StatusNoContent, "")
	}
	want(t, e.do("DELETE", "/v1/snapshots/p", e.keyA, nil), http.StatusNoContent, "")
	if left := ids(); len(left) != 0 {
		t.Fatalf("after the snapshot's delete the runtime still holds %v", left)
	}
	want(t, e.do("GET", "/v1/snapshots/p/pool", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")

	// The shutdown: a pool's members go with the engine.
	id = e.create(e.keyA, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "q"}), http.StatusCreated, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("POST", "/v1/snapshots/q/pool", e.keyA, map[string]any{"size": 1}), http.StatusOK, "")
	waitFor(t, "a member of q's pool ready", func() bool {
		return e.do("GET", "/v1/snapshots/q/pool", e.keyA, nil).json(t)["ready"].(float64) == 1
	})
	if len(ids()) != 1 {
		t.Fatalf("the runtime holds %v, want q's pool's member", ids())
	}
	if err := e.engine.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := ids(); len(left) != 0 {
		t.Fatalf("after the engine's close the runtime still holds %v", left)
	}
}

// TestSnapshotPoolHoldsSlots: a snapshot pool's members count against
// their account's concurrent sandboxes and the server's slots, as the
// sandboxes they stand for: a pool the account has no room for is
// refused, and so is a create once running sandboxes and pooled members
// fill the account's cap or the server's slots; shrinking the pool (the
// control) lets the same creates through, and its delete gives its
// slots back.
func TestSnapshotPoolHoldsSlots(t *testing.T) {
	e := runcEnvWith(t, server.Config{MaxSnapshotPoolPerAccount: 4, MaxSandboxes: 4})
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "team", "limits": map[string]any{"max_sandboxes": 3}}), http.StatusCreated, "")
	r := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "team"})
	want(t, r, http.StatusCreated, "")
	key := r.json(t)["key"].(string)

	id := e.create(key, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", key, map[string]any{"name": "p"}), http.StatusCreated, "")
	// One running: a pool of three would hold four of the account's three.
	want(t, e.do("POST", "/v1/snapshots/p/pool", key, map[string]any{"size": 3}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	want(t, e.do("POST", "/v1/snapshots/p/pool", key, map[string]any{"size": 2}), http.StatusOK, "")
	// Resized only once full: a resize during a member's restore cuts
	// that restore short (not what this test is about).
	full := func(n float64) {
		waitFor(t, "the pool full", func() bool {
			return e.do("GET", "/v1/snapshots/p/pool", key, nil).json(t)["ready"].(float64) == n
		})
	}
	full(2)
	// One running and two pooled fill the account's three.
	want(t, e.do("POST", "/v1/sandboxes", key, map[string]any{}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	// Another account's sandbox takes the server's last slot of four.
	other := e.create(e.keyA, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{}), http.StatusServiceUnavailable, "ERR_CAPACITY")

	// The control: a pool of one leaves room for one more of each.
	want(t, e.do("POST", "/v1/snapshots/p/pool", key, map[string]any{"size": 1}), http.StatusOK, "")
	full(1)
	mine := e.create(key, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes", key, map[string]any{}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	// Its delete (size 0) gives its slot back.
	want(t, e.do("POST", "/v1/snapshots/p/pool", key, map[string]any{"size": 0}), http.StatusOK, "")
	third := e.create(key, map[string]any{})
	for _, sb := range []string{id, mine, third} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, key, nil), http.StatusNoContent, "")
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+other, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/snapshots/p", key, nil), http.StatusNoContent, "")
}

// TestSnapshotPoolAfterServerRestart: a snapshot pool's size outlives
// the server: after a shutdown and a start over the same database and
// data dir the pool is reported with its size, its members are restored
// again, and a create from the snapshot takes one (Sheepfold-Pool: hit)
// with the snapshot's variable. The control: a snapshot whose pool was
// emptied before the restart has none after it, and its create misses.
// A start whose bound no longer admits the pool does not keep it, nor
// its record.
func TestSnapshotPoolAfterServerRestart(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: snapshots are refused (TestGVisorSandbox)")
	rootfs, st, key := restartStore(t)
	data := traversableDir(t)
	rcfg := oci.Config{RuntimePath: testutil.Runc(t), StateDir: filepath.Join(data, "run"), AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: testInstance("srvsnappool")}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(maxPool int) (*env, func()) {
		return serveWith(t, server.Config{Version: "test", MaxSnapshotPoolPerAccount: maxPool}, st, key, rcfg,
			sandbox.Config{CheckpointDir: filepath.Join(data, "checkpoints"),
				Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}, log, false)
	}
	pool := func(e *env, name string) (size, ready int) {
		r := e.do("GET", "/v1/snapshots/"+name+"/pool", key, nil)
		want(t, r, http.StatusOK, "")
		j := r.json(t)
		return int(j["size"].(float64)), int(j["ready"].(float64))
	}
	e, stop := start(2)
	id := e.create(key, map[string]any{})
	e.execIn(key, id, `x = "pooled"`)
	for _, name := range []string{"kept", "emptied"} {
		want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", key, map[string]any{"name": name}), http.StatusCreated, "")
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, key, nil), http.StatusNoContent, "")
	want(t, e.do("POST", "/v1/snapshots/kept/pool", key, map[string]any{"size": 1}), http.StatusOK, "")
	want(t, e.do("POST", "/v1/snapshots/emptied/pool", key, map[string]any{"size": 1}), http.StatusOK, "")
	want(t, e.do("POST", "/v1/snapshots/emptied/pool", key, map[string]any{"size": 0}), http.StatusOK, "")
	waitFor(t, "kept's member ready", func() bool { _, n := pool(e, "kept"); return n == 1 })
	stop()

	e, stop = start(2)
	if size, _ := pool(e, "kept"); size != 1 {
		t.Fatalf("after the restart kept's pool has size %d, want 1", size)
	}
	if size, ready := pool(e, "emptied"); size != 0 || ready != 0 {
		t.Fatalf("after the restart the emptied pool has size %d, %d ready; want none", size, ready)
	}
	waitFor(t, "kept's member restored again", func() bool { _, n := pool(e, "kept"); return n == 1 })
	for _, c := range []struct{ name, hit string }{{"kept", "hit"}, {"emptied", "miss"}} {
		r := e.do("POST", "/v1/sandboxes", key, map[string]any{"snapshot": c.name})
		want(t, r, http.StatusCreated, "")
		if got := r.header.Get("Sheepfold-Pool"); got != c.hit {
			t.Errorf("a create from %s after the restart: Sheepfold-Pool %q, want %q", c.name, got, c.hit)
		}
		sb := r.json(t)["id"].(string)
		if got := e.execIn(key, sb, `print(x)`); got != "pooled\n" {
			t.Fatalf("a sandbox from %s after the restart: %q", c.name, got)
		}
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, key, nil), http.StatusNoContent, "")
	}
	stop()

	// A server that keeps no pools does not keep this one, nor its record.
	e, stop = start(0)
	if size, ready := pool(e, "kept"); size != 0 || ready != 0 {
		t.Fatalf("a server with no pools: kept's pool has size %d, %d ready", size, ready)
	}
	stop()
	e, stop = start(2)
	defer stop()
	if size, _ := pool(e, "kept"); size != 0 {
		t.Fatalf("a pool not kept by one start came back at the next: size %d", size)
	}
	for _, name := range []string{"kept", "emptied"} {
		want(t, e.do("DELETE", "/v1/snapshots/"+name, key, nil), http.StatusNoContent, "")
	}
}
