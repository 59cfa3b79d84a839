package template

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestSetDevices: a template's devices are kept in its template.json and
// read back; a request no sandbox could be given is refused and changes
// nothing; none clears them.
func TestSetDevices(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	dir := filepath.Join(templatesDir(data), "gpu")
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeInfo(dir, Info{Name: "gpu", Version: FormatVersion}); err != nil {
		t.Fatal(err)
	}
	if err := SetDevices(data, "gpu", 1, []string{"sheepfold.test/dev=0"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		gpus int
		devs []string
	}{{-1, nil}, {17, nil}, {0, []string{"not a name"}}, {0, []string{"a.com/b=c", "a.com/b=c"}}} {
		if err := SetDevices(data, "gpu", bad.gpus, bad.devs); err == nil {
			t.Fatalf("%d GPUs and %v were set", bad.gpus, bad.devs)
		}
	}
	if info, err := Get(data, "gpu"); err != nil || info.GPUs != 1 || !reflect.DeepEqual(info.Devices, []string{"sheepfold.test/dev=0"}) {
		t.Fatalf("Get: %+v %v", info, err)
	}
	if err := SetDevices(data, "gpu", 0, nil); err != nil {
		t.Fatal(err)
	}
	if info, err := Get(data, "gpu"); err != nil || info.GPUs != 0 || info.Devices != nil {
		t.Fatalf("Get after clearing: %+v %v", info, err)
	}
}

// TestDevicesFromLabels: LABEL sheepfold.gpu and sheepfold.devices as a
// build reads them.
func TestDevicesFromLabels(t *testing.T) {
	t.Parallel()
	gpus, devs, err := devicesFromLabels(map[string]string{LabelGPU: " 2 ", LabelDevices: "a.com/x=0, b.com/y=1,", "other": "1"})
	if err != nil || gpus != 2 || !reflect.DeepEqual(devs, []string{"a.com/x=0", "b.com/y=1"}) {
		t.Fatalf("%d %v %v", gpus, devs, err)
	}
	if gpus, devs, err := devicesFromLabels(map[string]string{"other": "1"}); err != nil || gpus != 0 || devs != nil {
		t.Fatalf("no labels: %d %v %v", gpus, devs, err)
	}
	for _, bad := range []map[string]string{{LabelGPU: "one"}, {LabelGPU: "-1"}, {LabelDevices: "nvidia"}} {
		if _, _, err := devicesFromLabels(bad); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}
