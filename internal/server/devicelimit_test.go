package server_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/server"
)

// fourGPUs is a host of four GPUs for the fake runtime.
func fourGPUs() []runtime.Device {
	var out []runtime.Device
	for i := range 4 {
		out = append(out, runtime.Device{Name: fmt.Sprintf("nvidia.com/gpu=%d", i), Class: "nvidia.com/gpu"})
	}
	return out
}

// setMaxDevices sets an account's max_devices through the admin API and
// checks that it is stored (the account shows it).
func (e *env) setMaxDevices(t *testing.T, admin, key string, n int) {
	t.Helper()
	id := e.do("GET", "/v1/account", key, nil).json(t)["id"].(string)
	want(t, e.do("POST", "/v1/admin/accounts/"+id+"/limits", admin, map[string]any{"max_devices": n}), http.StatusOK, "")
	r := e.do("GET", "/v1/account", key, nil)
	if got := r.json(t)["limits"].(map[string]any)["max_devices"]; got != float64(n) {
		t.Fatalf("max_devices after setting %d: %v (%s)", n, got, r.body)
	}
}

// TestAccountDeviceLimit: an account's max_devices bounds the devices
// its live sandboxes hold at once: a create past it is 429
// ERR_SESSION_QUOTA_EXCEEDED while the host has devices free (another
// account gets them: the control), passes again once a holder ends, and
// a create asking for more than the limit ever allows is 400.
func TestAccountDeviceLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	e.rt.DeviceList = fourGPUs()
	e.setMaxDevices(t, e.adminKey(), e.keyA, 2)
	gpu := func(n int) map[string]any { return map[string]any{"resources": map[string]any{"gpu": n}} }
	a1 := e.create(e.keyA, gpu(1))
	e.create(e.keyA, gpu(1))
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, gpu(1)), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "device limit of 2")
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"devices": []string{"nvidia.com/gpu=3"}}}),
		http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "device limit of 2")
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, gpu(3)), http.StatusBadRequest, "ERR_BAD_REQUEST", "max_devices of 2")
	e.create(e.keyA, map[string]any{}) // a sandbox without devices is not counted
	// Control: the host has two GPUs free, and an account without the
	// limit takes them.
	e.create(e.keyB, gpu(2))
	want(t, e.do("DELETE", "/v1/sandboxes/"+a1, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+e.create(e.keyB, gpu(0)), e.keyB, nil), http.StatusNoContent, "")
	e.create(e.keyA, gpu(1))
}

// TestBatchDeviceLimit: a batch whose items ask for a GPU runs no more of
// them at once than its account's max_devices (the items wait, and the
// batch ends done); one whose items each ask for more than the limit
// fails at once with 400, no item run. Control: without the limit, more
// items hold GPUs at once.
func TestBatchDeviceLimit(t *testing.T) {
	t.Parallel()
	code := concurrentHandler
	most := func(t *testing.T, limit int) int {
		e := newEnv(t, server.Config{})
		e.rt.DeviceList = fourGPUs()
		admin := e.adminKey()
		if limit > 0 {
			e.setMaxDevices(t, admin, e.keyA, limit)
			want(t, e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code(t.TempDir()), "inputs": lenInputs(2),
				"resources": map[string]any{"gpu": limit + 1}}), http.StatusBadRequest, "ERR_BAD_REQUEST")
		}
		dir := t.TempDir()
		r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code(dir), "inputs": lenInputs(8), "concurrency": 4,
			"resources": map[string]any{"gpu": 1}})
		want(t, r, http.StatusCreated, "")
		id := r.json(t)["id"].(string)
		b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
		if b["status"] != "done" || b["done"] != float64(8) {
			t.Fatalf("limit %d: batch %v", limit, b)
		}
		m := 0
		for _, res := range e.batchResults(t, e.keyA, id, 100) {
			if n, ok := res["result"].(float64); ok && int(n) > m {
				m = int(n)
			}
		}
		return m
	}
	if m := most(t, 1); m != 1 {
		t.Fatalf("max_devices 1: %d items held a GPU at once", m)
	}
	if m := most(t, 0); m <= 1 {
		t.Fatalf("control: without the limit at most %d at once; the measure sees no concurrency", m)
	}
}
