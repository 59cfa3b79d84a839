package server_test

import (
	"context"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
)

// usageRuntime is the fake runtime with cgroup counters the test sets.
type usageRuntime struct {
	runtime.Runtime
	mu  sync.Mutex
	cpu map[string]uint64
}

func (u *usageRuntime) set(id string, cpu uint64) {
	u.mu.Lock()
	u.cpu[id] = cpu
	u.mu.Unlock()
}

func (u *usageRuntime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	us, err := u.Runtime.Usage(ctx, id)
	if err != nil {
		return us, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	us.CPUNanos = u.cpu[id]
	us.MemoryBytes = 256 << 20
	us.DiskBytes = 3 << 20
	return us, nil
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestUsage(t *testing.T) {
	urt := &usageRuntime{cpu: map[string]uint64{}}
	prices := metering.Prices{CPUSecond: 10, GBSecond: 1, Execution: 100}
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}},
		func(c *sandbox.Config) { urt.Runtime = c.Runtime; c.Runtime = urt })
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 1024}})
	// The counter starts where the cgroup's does: a sandbox not from the
	// pool is metered from zero.
	urt.set(id, 1_500_000_000)
	for i := 0; i < 2; i++ {
		want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1"}), http.StatusOK, "")
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/commands", e.keyA, map[string]any{"cmd": "true"}), http.StatusOK, "")
	r := e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	u := r.json(t)
	if u["live"] != true || u["cpu_seconds"] != 1.5 || u["executions"] != 2.0 || u["commands"] != 1.0 || u["disk_peak_bytes"] != float64(3<<20) {
		t.Fatalf("live usage %s", r.body)
	}
	wall := u["sandbox_seconds"].(float64)
	if !near(u["gb_seconds_reserved"].(float64), wall, 1e-9) || !near(u["gb_seconds_used"].(float64), wall/4, 0.01) {
		t.Fatalf("GB-seconds: 1 GiB reserved and 256 MiB used for %g s: %s", wall, r.body)
	}
	want(t, e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	// The last sample is taken as the sandbox stops.
	urt.set(id, 2_000_000_000)
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	r = e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	final := r.json(t)
	if final["live"] != false || final["cpu_seconds"] != 2.0 || final["executions"] != 2.0 {
		t.Fatalf("usage after stop %s", r.body)
	}
	// It reaches the store (the flush at stop): read it back once the
	// tracker is gone, and it is the same.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows := e.do("GET", "/v1/account/usage?group_by=sandbox", e.keyA, nil).json(t)
		groups := rows["groups"].([]any)
		// A flush before the stop may have stored the sandbox's earlier
		// figures: wait for the last one's. (The account's storage is in
		// no sandbox's group.)
		if len(groups) == 1 && groups[0].(map[string]any)["cpu_seconds"] == 2.0 {
			g := groups[0].(map[string]any)
			if g["sandbox_id"] != id || g["cpu_seconds"] != 2.0 || g["sandbox_seconds"] != final["sandbox_seconds"] || g["template"] != "python" {
				t.Fatalf("by sandbox %v", rows)
			}
			cost := 2.0*10 + g["gb_seconds_reserved"].(float64)*1 + 2*100
			if !near(g["cost_micros"].(float64), math.Round(cost), 0) {
				t.Fatalf("cost %v, want %v", g["cost_micros"], cost)
			}
			tot := rows["total"].(map[string]any)
			if tot["cpu_seconds"] != 2.0 || tot["cost_micros"] != g["cost_micros"] { // storage is free here
				t.Fatalf("total %v", tot)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage never reached the report: %v", rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The report adds the deltas not yet flushed (Meter.Pending): the
	// flush the stop asked for reaches the store on the meter's loop.
	var rows []store.UsageRow
	waitFor(t, "the stop's flush", func() bool {
		var err error
		rows, err = e.store.QueryUsage(context.Background(), storeFilter(id))
		return err == nil && len(rows) == 1 && rows[0].CPUNanos == 2e9
	})
	if rows[0].Executions != 2 || rows[0].Commands != 1 {
		t.Fatalf("stored %+v", rows)
	}
	// Other accounts see nothing; bad parameters name themselves.
	if g := e.do("GET", "/v1/account/usage?group_by=template", e.keyB, nil).json(t)["groups"].([]any); len(g) != 0 {
		t.Fatalf("another account's usage: %v", g)
	}
	wantMsg(t, e.do("GET", "/v1/account/usage?group_by=week", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST", "group_by must be")
	wantMsg(t, e.do("GET", "/v1/account/usage?from=yesterday", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST", "from must be")
	wantMsg(t, e.do("GET", "/v1/account/usage?from=2026-01-02&to=2026-01-01", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST", "from must be before to")
	day := e.do("GET", "/v1/account/usage?group_by=day&from=2020-01-01", e.keyA, nil).json(t)
	if g := day["groups"].([]any); len(g) != 1 || g[0].(map[string]any)["key"] != time.Now().UTC().Format(time.DateOnly) {
		t.Fatalf("by day %v", day)
	}
}

// TestUsageStorage: what an account keeps in the database is metered at
// every flush: the report shows it as its storage, in its total, and by
// day in the groups (by sandbox in none of them), in GB-seconds of what
// the store counts the account keeps, at the operator's price, and the
// cost reaches the ledger; another account, which keeps nothing, is
// charged nothing.
func TestUsageStorage(t *testing.T) {
	t.Parallel()
	prices := metering.Prices{StorageGBSecond: 1e9} // large, so that a few KB over a second cost micro-units
	// Before the server's first metering.
	began := time.Now()
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}})
	id := e.create(e.keyA, nil)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "'x' * 100"}), http.StatusOK, "")
	owner := func(secret string) string {
		k, err := e.store.KeyByHash(context.Background(), auth.Hash(secret))
		if err != nil {
			t.Fatal(err)
		}
		return k.Owner
	}
	kept, err := e.store.Stored(context.Background(), owner(e.keyA))
	if err != nil || kept.Total().Bytes == 0 {
		t.Fatalf("A keeps %+v (%v)", kept, err)
	}
	// Wait for a second of storage metered.
	start := time.Now()
	var rep map[string]any
	var storage map[string]any
	for deadline := start.Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rep = e.do("GET", "/v1/account/usage?group_by=sandbox", e.keyA, nil).json(t)
		storage = rep["storage"].(map[string]any)
		// At least a second's worth of what A keeps (it only grows).
		if storage["gb_seconds"].(float64) >= float64(kept.Total().Bytes)/(1<<30) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("storage never metered a second: %v", rep)
		}
	}
	gbs := storage["gb_seconds"].(float64)
	// No more than what A keeps now (it only grows here) over the time
	// since the server started (on a loaded host, its start and the
	// sandbox's may take more than the second waited for above).
	now, err := e.store.Stored(context.Background(), owner(e.keyA))
	if err != nil {
		t.Fatal(err)
	}
	if most := float64(now.Total().Bytes) / (1 << 30) * time.Since(began).Seconds(); gbs > most {
		t.Fatalf("%g GB-seconds of storage metered, more than %d bytes over %v", gbs, now.Total().Bytes, time.Since(began))
	}
	cost := math.Round(gbs * 1e9)
	tot := rep["total"].(map[string]any)
	if !near(storage["cost_micros"].(float64), cost, 1) || tot["storage_gb_seconds"] != gbs || !near(tot["cost_micros"].(float64), cost, 1) {
		t.Fatalf("storage %v, total %v: want %g GB-s costing %v", storage, tot, gbs, cost)
	}
	for _, g := range rep["groups"].([]any) {
		if g := g.(map[string]any); g["sandbox_id"] != id || g["storage_gb_seconds"] != 0.0 {
			t.Fatalf("a group by sandbox %v", g)
		}
	}
	day := e.do("GET", "/v1/account/usage?group_by=day", e.keyA, nil).json(t)
	if g := day["groups"].([]any); len(g) != 1 || g[0].(map[string]any)["storage_gb_seconds"].(float64) < gbs ||
		day["prices"].(map[string]any)["storage_gb_second_micros"] != 1e9 {
		t.Fatalf("by day %v", day)
	}
	// The cost reaches the ledger with the flushes.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c := e.do("GET", "/v1/account/credits", e.keyA, nil).json(t)
		if c["spent_micros"].(float64) >= cost-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger never took the storage's cost %v: %v", cost, c)
		}
	}
	if r := e.do("GET", "/v1/account/usage", e.keyB, nil).json(t); r["storage"].(map[string]any)["gb_seconds"] != 0.0 {
		t.Fatalf("B, which keeps nothing: %v", r)
	}
}

func storeFilter(id string) store.UsageFilter {
	return store.UsageFilter{SandboxID: id, GroupBy: store.GroupSandbox}
}

// TestMeterSlowSandbox: a sandbox whose usage cannot be read holds up no
// other: while the meter waits on it, creates, kills and usage reports of
// other sandboxes go on, and it is itself killed at once.
func TestMeterSlowSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond}})
	slow := e.create(e.keyA, nil)
	other := e.create(e.keyA, nil)
	stalled, release := e.rt.HangUsage(slow)
	t.Cleanup(release) // before the env's own cleanup
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the meter never read the sandbox")
	}
	// Unbounded, a hung reading would hold these for as long as it
	// hangs (the test's end); the bound is far above what they take.
	var rs [4]resp
	within(t, 10*time.Second, "a create, a usage report and two kills while one sandbox's reading hangs", func() {
		rs[0] = e.do("POST", "/v1/sandboxes", e.keyA, nil)
		rs[1] = e.do("GET", "/v1/sandboxes/"+other+"/usage", e.keyA, nil)
		rs[2] = e.do("DELETE", "/v1/sandboxes/"+other, e.keyA, nil)
		rs[3] = e.do("DELETE", "/v1/sandboxes/"+slow, e.keyA, nil) // waits at most one bounded reading
	})
	want(t, rs[0], http.StatusCreated, "")
	want(t, rs[1], http.StatusOK, "")
	want(t, rs[2], http.StatusNoContent, "")
	want(t, rs[3], http.StatusNoContent, "")
}

// within fails the test if f has not returned after d (f goes on, to
// return once the test's cleanup frees what it waits on). f must not
// end the test (t.Fatal): it runs on a goroutine of its own.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
	}
}
