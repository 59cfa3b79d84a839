package server_test

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestDevicesInSandbox, over runc and a CDI spec of two test devices: a
// sandbox asking for a GPU (the test class) gets the first device's node
// and environment, and its device cgroup lets the node through (ENXIO:
// no driver); a sandbox asking for none has neither. A sandbox with a
// device cannot be paused, snapshotted or forked, and its end frees the
// device.
func TestDevicesInSandbox(t *testing.T) {
	specDir, names := testutil.CDIDevices(t, 2)
	e := runcEnvOCI(t, func(c *oci.Config) { c.CDISpecDirs = []string{specDir} }, server.Config{},
		func(c *sandbox.Config) { c.GPUClass = testutil.TestDeviceClass })
	const probe = `import os, stat
print([d for d in sorted(os.listdir("/dev")) if d.startswith("sftest")], os.environ.get("SF_TEST_DEVICE"))
try:
    os.open("/dev/sftest0", os.O_RDWR)
except OSError as e:
    print(e.strerror)`
	run := func(id string) string {
		t.Helper()
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": probe})
		want(t, r, http.StatusOK, "")
		return r.json(t)["stdout"].(string)
	}
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"gpu": 1}})
	want(t, r, http.StatusCreated, "")
	with := r.json(t)
	id := with["id"].(string)
	if devs := with["resources"].(map[string]any)["devices"]; !reflect.DeepEqual(devs, []any{names[0]}) {
		t.Fatalf("the sandbox holds %v", devs)
	}
	if out := run(id); out != "['sftest0'] 0\nNo such device or address\n" {
		t.Errorf("the sandbox with the device sees:\n%s", out)
	}
	other := e.create(e.keyA, map[string]any{})
	if out := run(other); out != "[] None\nNo such file or directory\n" {
		t.Errorf("the sandbox without devices sees:\n%s", out)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "dev"}), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/fork", e.keyA, map[string]any{"count": 1}), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	if out := run(id); out != "['sftest0'] 0\nNo such device or address\n" {
		t.Errorf("after the refusals, the sandbox sees:\n%s", out)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"devices": []string{names[0]}}})
	want(t, r, http.StatusCreated, "")
}

// TestAccountDeviceLimitInSandbox, over runc and the CDI spec of two test
// devices: an account whose max_devices is 1 holding one is refused the
// second (429 ERR_SESSION_QUOTA_EXCEEDED) while it is free, which another
// account then gets (the control); once its holder ends, the account
// gets one again.
func TestAccountDeviceLimitInSandbox(t *testing.T) {
	specDir, _ := testutil.CDIDevices(t, 2)
	e := runcEnvOCI(t, func(c *oci.Config) { c.CDISpecDirs = []string{specDir} }, server.Config{},
		func(c *sandbox.Config) { c.GPUClass = testutil.TestDeviceClass })
	e.setMaxDevices(t, e.adminKey(), e.keyA, 1)
	gpu := map[string]any{"resources": map[string]any{"gpu": 1}}
	held := e.create(e.keyA, gpu)
	wantMsg(t, e.do("POST", "/v1/sandboxes", e.keyA, gpu), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED", "device limit of 1")
	other := e.create(e.keyB, gpu)
	want(t, e.do("DELETE", "/v1/sandboxes/"+other, e.keyB, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+held, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+e.create(e.keyA, gpu), e.keyA, nil), http.StatusNoContent, "")
}
