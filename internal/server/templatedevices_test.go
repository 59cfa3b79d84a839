package server_test

import (
	"context"
	"net/http"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// deviceTemplates are the test's templates: "python", and "gpu", which
// asks for one GPU (sandbox.TemplateDevices).
type deviceTemplates struct{}

func (deviceTemplates) RootFS(name string) (string, error) {
	if name != "python" && name != "gpu" {
		return "", os.ErrNotExist
	}
	return "/", nil
}

func (deviceTemplates) Devices(name string) (int, []string) {
	if name == "gpu" {
		return 1, nil
	}
	return 0, nil
}

// TestTemplateDevices: a sandbox of a template that asks for a GPU gets
// one when its create names no devices, never from the warm pool (which
// warms the template, and whose members hold no device); a create that
// names its own devices, or none ("devices": []), gets those. Reverted,
// the first sandbox had no device.
func TestTemplateDevices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) {
		c.Templates = deviceTemplates{}
		c.PoolSize, c.PoolTemplates = 1, []string{"python", "gpu"}
	})
	e.rt.DeviceList = []runtime.Device{{Name: "nvidia.com/gpu=0", Class: "nvidia.com/gpu"}, {Name: "nvidia.com/gpu=1", Class: "nvidia.com/gpu"}}
	deadline := time.Now().Add(30 * time.Second)
	for e.engine.PoolStats().Ready < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", e.engine.PoolStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	create := func(body map[string]any, pool string) (string, []any) {
		t.Helper()
		r := e.do("POST", "/v1/sandboxes", e.keyA, body)
		want(t, r, http.StatusCreated, "")
		if got := r.header.Get("Sheepfold-Pool"); pool != "" && got != pool {
			t.Fatalf("Sheepfold-Pool %q, want %q", got, pool)
		}
		m := r.json(t)
		devs, _ := m["resources"].(map[string]any)["devices"].([]any)
		return m["id"].(string), devs
	}
	mine := map[string]bool{}
	id, devs := create(map[string]any{"template": "gpu"}, "miss")
	mine[id] = true
	if !reflect.DeepEqual(devs, []any{"nvidia.com/gpu=0"}) || !reflect.DeepEqual(e.rt.Spec(id).Devices, []string{"nvidia.com/gpu=0"}) {
		t.Fatalf("the template's sandbox holds %v; the runtime was given %v", devs, e.rt.Spec(id).Devices)
	}
	id, devs = create(map[string]any{"template": "gpu", "resources": map[string]any{"devices": []string{}}}, "hit")
	if devs != nil || e.rt.Spec(id).Devices != nil {
		t.Fatalf(`"devices": [] holds %v`, devs)
	}
	id, devs = create(map[string]any{"template": "gpu", "resources": map[string]any{"devices": []string{"nvidia.com/gpu=1"}}}, "miss")
	mine[id] = true
	if !reflect.DeepEqual(devs, []any{"nvidia.com/gpu=1"}) {
		t.Fatalf("a named device: %v", devs)
	}
	if _, devs := create(map[string]any{"template": "python"}, ""); devs != nil {
		t.Fatalf("python's sandbox holds %v", devs)
	}
	// No pool member, past or present, was given a device.
	ids, err := e.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if sp := e.rt.Spec(id); !mine[id] && sp.Devices != nil {
			t.Fatalf("sandbox %s of %s holds %v", id, sp.Template, sp.Devices)
		}
	}
}
