package oci

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestUsageFiles reads a sandbox's figures from its cgroup directories as
// they lie on a cgroup v2 host and on a v1 one (cpu and cpuacct mounted
// together): the right directory of each controller, a missing cgroup
// ErrNotFound. Parsing each file is internal/cgroup's (its tests).
func TestUsageFiles(t *testing.T) {
	t.Run("v2", func(t *testing.T) {
		root := t.TempDir()
		testutil.WriteTree(t, filepath.Join(root, "sheepfold/server/sb"), map[string]string{
			"memory.current": "73400320\n",
			"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
			"pids.current":   "7\n",
			"cpu.pressure":   "some avg10=1.50 avg60=0.30 avg300=0.06 total=123456\n",
		})
		c := &cgroups{v2: true, mounts: []string{root}, unified: root, parent: "sheepfold/server"}
		u, err := c.usage("sb")
		if err != nil {
			t.Fatal(err)
		}
		want := runtime.Usage{MemoryBytes: 73400320, CPUNanos: 1_500_000_000, Pids: 7, Pressure: &runtime.Pressure{CPUSome: 1.5}}
		if !reflect.DeepEqual(u, want) {
			t.Errorf("usage\n got %+v (pressure %+v)\nwant %+v (pressure %+v)", u, u.Pressure, want, want.Pressure)
		}
		if _, err := c.usage("gone"); err != runtime.ErrNotFound {
			t.Errorf("usage of a missing cgroup: %v", err)
		}
	})
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		mem, cpu, pids := filepath.Join(root, "memory"), filepath.Join(root, "cpu,cpuacct"), filepath.Join(root, "pids")
		testutil.WriteTree(t, filepath.Join(mem, "sheepfold/server/sb"), map[string]string{"memory.usage_in_bytes": "73400320\n"})
		testutil.WriteTree(t, filepath.Join(cpu, "sheepfold/server/sb"), map[string]string{
			"cpuacct.usage": "1500000000\n", "cpu.cfs_quota_us": "50000\n", "cpu.cfs_period_us": "100000\n",
		})
		testutil.WriteTree(t, filepath.Join(pids, "sheepfold/server/sb"), map[string]string{"pids.current": "7\n"})
		c := &cgroups{mounts: []string{mem, cpu, pids}, parent: "sheepfold/server"}
		u, err := c.usage("sb")
		if err != nil {
			t.Fatal(err)
		}
		want := runtime.Usage{MemoryBytes: 73400320, CPUNanos: 1_500_000_000, CPULimit: 0.5, Pids: 7}
		if !reflect.DeepEqual(u, want) {
			t.Errorf("usage\n got %+v\nwant %+v", u, want)
		}
		if _, err := c.usage("gone"); err != runtime.ErrNotFound {
			t.Errorf("usage of a missing cgroup: %v", err)
		}
	})
}
