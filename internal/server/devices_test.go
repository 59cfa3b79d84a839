package server_test

import (
	"math"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestDevicesAPI: resources.gpu draws free devices of the GPU class and
// resources.devices names them; the answer lists what the sandbox holds,
// and the runtime is given exactly those. A held device is refused to
// anyone else (ERR_DEVICE_IN_USE) until its sandbox ends; a device the
// host has not, or more GPUs than it has, is ERR_DEVICE_NOT_FOUND; a
// malformed name or count is ERR_BAD_REQUEST.
func TestDevicesAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	e.rt.DeviceList = []runtime.Device{{Name: "example.com/fpga=a", Class: "example.com/fpga"},
		{Name: "nvidia.com/gpu=0", Class: "nvidia.com/gpu"}, {Name: "nvidia.com/gpu=1", Class: "nvidia.com/gpu"}}
	create := func(key string, res map[string]any, status int, code string) (string, []string) {
		t.Helper()
		r := e.do("POST", "/v1/sandboxes", key, map[string]any{"resources": res})
		want(t, r, status, code)
		if status != http.StatusCreated {
			return "", nil
		}
		m := r.json(t)
		var devs []string
		for _, d := range m["resources"].(map[string]any)["devices"].([]any) {
			devs = append(devs, d.(string))
		}
		return m["id"].(string), devs
	}
	a, devs := create(e.keyA, map[string]any{"gpu": 1}, http.StatusCreated, "")
	if !reflect.DeepEqual(devs, []string{"nvidia.com/gpu=0"}) || !reflect.DeepEqual(e.rt.Spec(a).Devices, devs) {
		t.Fatalf("gpu 1 holds %v; the runtime was given %v", devs, e.rt.Spec(a).Devices)
	}
	b, devs := create(e.keyB, map[string]any{"gpu": 1, "devices": []string{"example.com/fpga=a"}}, http.StatusCreated, "")
	if !reflect.DeepEqual(devs, []string{"example.com/fpga=a", "nvidia.com/gpu=1"}) {
		t.Fatalf("B holds %v", devs)
	}
	create(e.keyA, map[string]any{"gpu": 1}, http.StatusConflict, "ERR_DEVICE_IN_USE")
	create(e.keyA, map[string]any{"devices": []string{"nvidia.com/gpu=0"}}, http.StatusConflict, "ERR_DEVICE_IN_USE")
	create(e.keyA, map[string]any{"gpu": 3}, http.StatusNotFound, "ERR_DEVICE_NOT_FOUND")
	create(e.keyA, map[string]any{"devices": []string{"example.com/fpga=b"}}, http.StatusNotFound, "ERR_DEVICE_NOT_FOUND")
	create(e.keyA, map[string]any{"devices": []string{"no name"}}, http.StatusBadRequest, "ERR_BAD_REQUEST")
	create(e.keyA, map[string]any{"devices": []string{"example.com/fpga=a", "example.com/fpga=a"}}, http.StatusBadRequest, "ERR_BAD_REQUEST")
	create(e.keyA, map[string]any{"gpu": -1}, http.StatusBadRequest, "ERR_BAD_REQUEST")
	if r := e.do("GET", "/v1/sandboxes/"+a, e.keyA, nil); r.status != http.StatusOK ||
		!reflect.DeepEqual(r.json(t)["resources"].(map[string]any)["devices"], []any{"nvidia.com/gpu=0"}) {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	// A sandbox's end frees its devices.
	want(t, e.do("DELETE", "/v1/sandboxes/"+a, e.keyA, nil), http.StatusNoContent, "")
	if _, devs := create(e.keyA, map[string]any{"gpu": 1}, http.StatusCreated, ""); !reflect.DeepEqual(devs, []string{"nvidia.com/gpu=0"}) {
		t.Fatalf("after the kill, gpu 1 holds %v", devs)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+b, e.keyB, nil), http.StatusNoContent, "")
}

// TestSharedDevices: with ShareDevices, live sandboxes hold the same
// device, a GPU request taking the least held.
func TestSharedDevices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) { c.ShareDevices = true })
	e.rt.DeviceList = []runtime.Device{{Name: "nvidia.com/gpu=0", Class: "nvidia.com/gpu"}, {Name: "nvidia.com/gpu=1", Class: "nvidia.com/gpu"}}
	var got []any
	for range 3 {
		r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"gpu": 1}})
		want(t, r, http.StatusCreated, "")
		got = append(got, r.json(t)["resources"].(map[string]any)["devices"].([]any)...)
	}
	if !reflect.DeepEqual(got, []any{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=0"}) {
		t.Fatalf("three sandboxes sharing two GPUs hold %v", got)
	}
}

// gpuScheduler plays a runtime whose cluster chooses GPUs (Kubernetes).
type gpuScheduler struct{ *fake.Runtime }

func (gpuScheduler) GPUResource() string { return "nvidia.com/gpu" }

// TestGPUsByNumber: on a runtime whose cluster chooses GPUs, a create's
// resources.gpu reaches the runtime as a number, shown in the answer,
// and devices by name are refused (501).
func TestGPUsByNumber(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) { c.Runtime = gpuScheduler{c.Runtime.(*fake.Runtime)} })
	r := e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"gpu": 2}})
	want(t, r, http.StatusCreated, "")
	m := r.json(t)
	res := m["resources"].(map[string]any)
	if sp := e.rt.Spec(m["id"].(string)); res["gpu"] != float64(2) || res["devices"] != nil || sp.GPUs != 2 || sp.Devices != nil {
		t.Fatalf("answer %v; the runtime got %d GPUs and devices %v", res, sp.GPUs, sp.Devices)
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"resources": map[string]any{"devices": []string{"nvidia.com/gpu=0"}}}),
		http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
}

// TestDeviceSeconds: a sandbox holding devices is metered their seconds,
// summed over its devices and charged at the device price, from its
// start to its end; a sandbox without devices is metered none.
func TestDeviceSeconds(t *testing.T) {
	t.Parallel()
	prices := metering.Prices{DeviceSecond: 1000}
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}})
	e.rt.DeviceList = []runtime.Device{{Name: "nvidia.com/gpu=0", Class: "nvidia.com/gpu"}, {Name: "nvidia.com/gpu=1", Class: "nvidia.com/gpu"}}
	two := e.create(e.keyA, map[string]any{"resources": map[string]any{"gpu": 2}})
	none := e.create(e.keyA, map[string]any{})
	for _, id := range []string{two, none} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
	usage := func(id string) map[string]any {
		r := e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		return r.json(t)
	}
	u := usage(two)
	wall, dev := u["sandbox_seconds"].(float64), u["device_seconds"].(float64)
	if wall <= 0 || !near(dev, 2*wall, 1e-9) || u["cost_micros"].(float64) != math.Round(dev*1000) {
		t.Fatalf("two GPUs for %g s: %v device-seconds, cost %v", wall, dev, u["cost_micros"])
	}
	if u := usage(none); u["device_seconds"] != 0.0 {
		t.Fatalf("no devices: %v device-seconds", u["device_seconds"])
	}
}
