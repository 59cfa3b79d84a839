package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDeviceClass is the CDI vendor/class of CDIDevices' devices.
const TestDeviceClass = "sheepfold.test/dev"

// TestDeviceMajor is the major number of CDIDevices' device nodes: one of
// the numbers Linux keeps for local use (240–254), which no driver
// claims, so that opening one fails with ENXIO once the device cgroup
// lets it through (EPERM where the cgroup refuses it).
const TestDeviceMajor = 240

// CDIDevices makes n harmless test devices and a CDI spec describing
// them, and returns the spec's directory and the devices' qualified
// names (TestDeviceClass=0, =1, ...). Device i is a character node
// TestDeviceMajor:i at /dev/sftest<i> in a sandbox given it, which also
// gets SF_TEST_DEVICE=<i> in its environment. The nodes live under a
// directory any user may search, as runc's init (the sandbox's root)
// must reach them to bind-mount them. Needs root.
func CDIDevices(t testing.TB, n int) (specDir string, names []string) {
	t.Helper()
	RequireRoot(t)
	dir := ShortTempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	nodes, specDir := filepath.Join(dir, "nodes"), filepath.Join(dir, "cdi")
	for _, d := range []string{nodes, specDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits struct {
			DeviceNodes []map[string]string `json:"deviceNodes"`
			Env         []string            `json:"env"`
		} `json:"containerEdits"`
	}
	var devices []device
	for i := range n {
		host := filepath.Join(nodes, fmt.Sprintf("sftest%d", i))
		if err := unix.Mknod(host, unix.S_IFCHR|0o666, int(unix.Mkdev(TestDeviceMajor, uint32(i)))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(host, 0o666); err != nil { // past the umask
			t.Fatal(err)
		}
		var d device
		d.Name = fmt.Sprint(i)
		d.ContainerEdits.DeviceNodes = []map[string]string{{"path": fmt.Sprintf("/dev/sftest%d", i), "hostPath": host}}
		d.ContainerEdits.Env = []string{fmt.Sprintf("SF_TEST_DEVICE=%d", i)}
		devices = append(devices, d)
		names = append(names, fmt.Sprintf("%s=%d", TestDeviceClass, i))
	}
	spec, err := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": TestDeviceClass, "devices": devices})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "sheepfold-test.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return specDir, names
}
