package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestCDIDevices: the runtime lists the devices its CDI specs describe; a
// sandbox given one sees its node and environment, and opening the node
// reaches the kernel (ENXIO: no driver claims the test major), so the
// device cgroup lets it through; it does not see the device it was not
// given, and the cgroup allows that one neither (cgroup v1: read from the
// host). A sandbox given none sees neither. A device no spec describes is
// ErrDeviceNotFound; the create leaves nothing.
func TestCDIDevices(t *testing.T) {
	cfg := testConfig(t, "cdi")
	specDir, names := testutil.CDIDevices(t, 2)
	cfg.CDISpecDirs = []string{specDir}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	devs, err := o.Devices()
	want := []runtime.Device{{Name: names[0], Class: testutil.TestDeviceClass}, {Name: names[1], Class: testutil.TestDeviceClass}}
	if err != nil || !reflect.DeepEqual(devs, want) {
		t.Fatalf("Devices = %+v, %v; want %+v", devs, err, want)
	}
	rootfs := testutil.TemplateRootFS(t, "python")
	limits := runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 16 << 20}
	with, err := o.Create(ctx, runtime.Spec{ID: "cdi-with", RootFS: rootfs, Limits: limits, Devices: names[:1]})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Destroy(ctx, "cdi-with")
	without, err := o.Create(ctx, runtime.Spec{ID: "cdi-without", RootFS: rootfs, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Destroy(ctx, "cdi-without")

	const probe = `for d in 0 1; do if [ -c /dev/sftest$d ]; then echo "node $d"; fi; done; echo "env ${SF_TEST_DEVICE:-none}"; ` +
		`python3 -c 'import os
try:
    os.open("/dev/sftest0", os.O_RDWR)
except OSError as e:
    print("open", e.strerror)'`
	if out, code := shell(t, with.Socket, "", probe); code != 0 || out != "node 0\nenv 0\nopen No such device or address\n" {
		t.Errorf("the sandbox given device 0 sees (exit %d):\n%s", code, out)
	}
	if out, code := shell(t, without.Socket, "", probe); code != 0 || out != "env none\nopen No such file or directory\n" {
		t.Errorf("the sandbox given none sees (exit %d):\n%s", code, out)
	}
	if !o.cg.v2 {
		allowed := func(id string) string {
			b, err := os.ReadFile(filepath.Join(o.cg.controller(id, "devices"), "devices.list"))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		if l := allowed("cdi-with"); !strings.Contains(l, "c 240:0 rw") || strings.Contains(l, "c 240:1") || strings.Contains(l, "a *:*") {
			t.Errorf("the device cgroup of the sandbox given device 0 allows:\n%s", l)
		}
		if l := allowed("cdi-without"); strings.Contains(l, "c 240:") {
			t.Errorf("the device cgroup of the sandbox given none allows:\n%s", l)
		}
	}
	if _, err := o.Create(ctx, runtime.Spec{ID: "cdi-gone", RootFS: rootfs, Limits: limits, Devices: []string{testutil.TestDeviceClass + "=9"}}); !errors.Is(err, runtime.ErrDeviceNotFound) {
		t.Errorf("a device no spec describes: %v", err)
	}
	assertGone(t, o, "cdi-gone")
}

// TestCDIBrokenSpec: a spec that does not parse is an error naming it,
// for the doctor, and the other specs' devices are listed still; no
// directory at all is none.
func TestCDIBrokenSpec(t *testing.T) {
	dir, names := testutil.CDIDevices(t, 1)
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte(`{"cdiVersion": "0.6.0", "kind": "no-class"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if devs, err := CDIDevices([]string{dir}); err == nil || !strings.Contains(err.Error(), "broken.json") || len(devs) != 1 || devs[0].Name != names[0] {
		t.Errorf("a broken spec beside a good one: %v, %v", devs, err)
	}
	if devs, err := CDIDevices([]string{filepath.Join(dir, "none")}); err != nil || len(devs) != 0 {
		t.Errorf("no directory: %v, %v", devs, err)
	}
}

// TestGVisorRefusesDevices: a gVisor sandbox is given no device (its
// Sentry would answer the node's calls, no driver), and the refused
// create leaves nothing.
func TestGVisorRefusesDevices(t *testing.T) {
	cfg := gvisorConfig(t, "cdi-gv")
	specDir, names := testutil.CDIDevices(t, 1)
	cfg.CDISpecDirs = []string{specDir}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	_, err = o.Create(context.Background(), runtime.Spec{ID: "cdi-gv", RootFS: testutil.TemplateRootFS(t, "python"),
		Runtime: RuntimeGVisor, Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 16 << 20}, Devices: names})
	if !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("a gVisor sandbox with a device: %v", err)
	}
	assertGone(t, o, "cdi-gv")
}
