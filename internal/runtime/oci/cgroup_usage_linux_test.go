package oci

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// writeFiles writes name → content under dir, making the directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUsageFiles reads a sandbox's figures from cgroup files laid out as
// on a cgroup v2 host and as on a v1 one (cpu and cpuacct mounted
// together), from copies of what the kernel writes.
func TestUsageFiles(t *testing.T) {
	t.Run("v2", func(t *testing.T) {
		root := t.TempDir()
		writeFiles(t, filepath.Join(root, "sheepfold/server/sb"), map[string]string{
			"memory.current":  "73400320\n",
			"memory.stat":     "anon 41943040\nfile 25165824\nkernel 6291456\nfile_mapped 1048576\nfile_dirty 0\nshmem 8388608\n",
			"memory.peak":     "90000000\n",
			"memory.max":      "536870912\n",
			"memory.events":   "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
			"cpu.stat":        "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
			"cpu.max":         "150000 100000\n",
			"pids.current":    "7\n",
			"pids.events":     "max 2\n",
			"cpu.pressure":    "some avg10=1.50 avg60=0.30 avg300=0.06 total=123456\nfull avg10=1.00 avg60=0.20 avg300=0.04 total=100000\n",
			"memory.pressure": "some avg10=4.25 avg60=1.00 avg300=0.20 total=5678\nfull avg10=2.00 avg60=0.50 avg300=0.10 total=3000\n",
			"io.pressure":     "some avg10=0.75 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=5\n",
		})
		c := &cgroups{v2: true, mounts: []string{root}, unified: root, parent: "sheepfold/server"}
		u, err := c.usage("sb")
		if err != nil {
			t.Fatal(err)
		}
		want := runtime.Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000, MemoryLimit: 536870912,
			OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 1.5, Pids: 7, PidsDenied: 2,
			Pressure: &runtime.Pressure{CPUSome: 1.5, MemorySome: 4.25, MemoryFull: 2, IOSome: 0.75, IOFull: 0.25}}
		if !reflect.DeepEqual(u, want) {
			t.Errorf("usage\n got %+v (pressure %+v)\nwant %+v (pressure %+v)", u, u.Pressure, want, want.Pressure)
		}
		// No limit.
		writeFiles(t, filepath.Join(root, "sheepfold/server/sb"), map[string]string{"cpu.max": "max 100000\n", "memory.max": "max\n"})
		if u, _ := c.usage("sb"); u.CPULimit != 0 || u.MemoryLimit != -1 {
			t.Errorf("no limits: CPULimit %v, MemoryLimit %v", u.CPULimit, u.MemoryLimit)
		}
		if _, err := c.usage("gone"); err != runtime.ErrNotFound {
			t.Errorf("usage of a missing cgroup: %v", err)
		}
	})
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		mem, cpu, pids := filepath.Join(root, "memory"), filepath.Join(root, "cpu,cpuacct"), filepath.Join(root, "pids")
		writeFiles(t, filepath.Join(mem, "sheepfold/server/sb"), map[string]string{
			"memory.usage_in_bytes":     "73400320\n",
			"memory.stat":               "cache 1000\nrss 2000\nshmem 0\ntotal_cache 25165824\ntotal_rss 41943040\n",
			"memory.max_usage_in_bytes": "90000000\n",
			"memory.limit_in_bytes":     "536870912\n",
			"memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
		})
		writeFiles(t, filepath.Join(cpu, "sheepfold/server/sb"), map[string]string{
			"cpuacct.usage":     "1500000000\n",
			"cpu.cfs_quota_us":  "50000\n",
			"cpu.cfs_period_us": "100000\n",
		})
		writeFiles(t, filepath.Join(pids, "sheepfold/server/sb"), map[string]string{"pids.current": "7\n", "pids.events": "max 2\n"})
		c := &cgroups{mounts: []string{mem, cpu, pids}, parent: "sheepfold/server"}
		u, err := c.usage("sb")
		if err != nil {
			t.Fatal(err)
		}
		want := runtime.Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000, MemoryLimit: 536870912,
			OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 0.5, Pids: 7, PidsDenied: 2}
		if !reflect.DeepEqual(u, want) {
			t.Errorf("usage\n got %+v\nwant %+v", u, want)
		}
		writeFiles(t, filepath.Join(cpu, "sheepfold/server/sb"), map[string]string{"cpu.cfs_quota_us": "-1\n"})
		if u, _ := c.usage("sb"); u.CPULimit != 0 {
			t.Errorf("no CPU limit: %v", u.CPULimit)
		}
	})
}
