package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestForkBaselineMetered: a fork group's baseline (the copy of the
// parent's files its diff compares against) is its account's storage
// while kept: charged as storage.snapshots_gb_seconds (the other account,
// without forks, is charged none), bounded by
// --max-snapshot-mb-per-account (a fork whose baseline holds a 64 MiB
// file past the 48 MiB bound is refused and leaves no fork; the control,
// a fork without the file, is made), and charged no more once its forks
// have stopped.
func TestForkBaselineMetered(t *testing.T) {
	const limit = 48 << 20
	prices := metering.Prices{StorageGBSecond: 1e6}
	e := runcEnvWith(t, server.Config{MaxSnapshotBytesPerAccount: limit,
		Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}})
	parent := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 256}})
	e.execIn(e.keyA, parent, `import os; f = open("/home/user/big", "wb"); [f.write(os.urandom(1 << 20)) for _ in range(64)]; f.close()`)
	count := func() int {
		r := e.do("GET", "/v1/sandboxes", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		return len(r.json(t)["sandboxes"].([]any))
	}
	want(t, e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": 1}), http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	if n := count(); n != 1 {
		t.Fatalf("a refused fork left sandboxes: %d listed, want the parent alone", n)
	}

	// The control: without the file the baseline fits, and is metered.
	e.execIn(e.keyA, parent, `os.remove("/home/user/big"); open("/home/user/small", "wb").write(os.urandom(4 << 20))`)
	r := e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": 1})
	want(t, r, http.StatusCreated, "")
	fork := r.json(t)["sandboxes"].([]any)[0].(map[string]any)["id"].(string)
	usage := func(key string) float64 {
		return e.do("GET", "/v1/account/usage", key, nil).json(t)["storage"].(map[string]any)["snapshots_gb_seconds"].(float64)
	}
	second := float64(4<<20) / (1 << 30) // at least the file's bytes for a second
	for deadline := time.Now().Add(20 * time.Second); usage(e.keyA) < second; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fork's baseline was never metered: %g GB-seconds", usage(e.keyA))
		}
	}
	if b := usage(e.keyB); b != 0 {
		t.Fatalf("B, without forks: %g GB-seconds", b)
	}

	// Its fork stopped, the baseline is charged no more.
	want(t, e.do("DELETE", "/v1/sandboxes/"+fork, e.keyA, nil), http.StatusNoContent, "")
	for n := e.srv.MeterFlushes() + 2; e.srv.MeterFlushes() < n; time.Sleep(20 * time.Millisecond) {
	}
	before := usage(e.keyA)
	for n := e.srv.MeterFlushes() + 2; e.srv.MeterFlushes() < n; time.Sleep(20 * time.Millisecond) {
	}
	if after := usage(e.keyA); after != before {
		t.Fatalf("a fork group whose forks stopped is charged on: %g, then %g", before, after)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+parent, e.keyA, nil), http.StatusNoContent, "")
}
