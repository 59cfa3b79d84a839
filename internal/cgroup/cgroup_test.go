package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/psi"
)

func write(t *testing.T, dir string, files map[string]string) {
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

// TestReadV2 reads a cgroup v2 directory laid out as the kernel writes
// it; without limits; and a directory that is no cgroup.
func TestReadV2(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	write(t, d, map[string]string{
		"memory.current":  "73400320\n",
		"memory.stat":     "anon 41943040\nfile 25165824\nkernel 6291456\n",
		"memory.peak":     "90000000\n",
		"memory.max":      "536870912\n",
		"memory.events":   "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
		"cpu.stat":        "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"cpu.max":         "150000 100000\n",
		"pids.current":    "7\n",
		"pids.events":     "max 2\n",
		"memory.pressure": "some avg10=4.25 avg60=1.00 avg300=0.20 total=5678\nfull avg10=2.00 avg60=0.50 avg300=0.10 total=3000\n",
	})
	u, found := ReadV2(d)
	want := Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000, MemoryLimit: 536870912,
		OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 1.5, Pids: 7, PidsDenied: 2,
		Pressure: &psi.Pressure{MemorySome: 4.25, MemoryFull: 2}}
	if !found || !reflect.DeepEqual(u, want) {
		t.Errorf("ReadV2 = %+v, %v\nwant %+v", u, found, want)
	}
	write(t, d, map[string]string{"cpu.max": "max 100000\n", "memory.max": "max\n"})
	if u, _ := ReadV2(d); u.CPULimit != 0 || u.MemoryLimit != -1 {
		t.Errorf("no limits: CPULimit %v, MemoryLimit %v", u.CPULimit, u.MemoryLimit)
	}
	if u, found := ReadV2(t.TempDir()); found || !reflect.DeepEqual(u, Usage{}) {
		t.Errorf("an empty directory: %+v, %v", u, found)
	}
}

// TestReadV1 reads v1 controllers (cpu and cpuacct mounted together),
// one controller not mounted, and none.
func TestReadV1(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write(t, root, map[string]string{
		"memory/memory.usage_in_bytes":     "73400320\n",
		"memory/memory.stat":               "cache 1000\nrss 2000\ntotal_cache 25165824\ntotal_rss 41943040\n",
		"memory/memory.max_usage_in_bytes": "90000000\n",
		"memory/memory.limit_in_bytes":     "9223372036854771712\n",
		"memory/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
		"cpu,cpuacct/cpuacct.usage":        "1500000000\n",
		"cpu,cpuacct/cpu.cfs_quota_us":     "50000\n",
		"cpu,cpuacct/cpu.cfs_period_us":    "100000\n",
		"pids/pids.current":                "7\n",
		"pids/pids.events":                 "max 2\n",
	})
	cpu := filepath.Join(root, "cpu,cpuacct")
	d := V1{Memory: filepath.Join(root, "memory"), CPUAcct: cpu, CPU: cpu, Pids: filepath.Join(root, "pids")}
	u, found := ReadV1(d)
	want := Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000, MemoryLimit: 9223372036854771712,
		OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 0.5, Pids: 7, PidsDenied: 2}
	if !found || !reflect.DeepEqual(u, want) {
		t.Errorf("ReadV1 = %+v, %v\nwant %+v", u, found, want)
	}
	d.Pids = ""
	if u, found := ReadV1(d); !found || u.Pids != 0 || u.MemoryBytes != want.MemoryBytes {
		t.Errorf("pids not mounted: %+v, %v", u, found)
	}
	if _, found := ReadV1(V1{Pids: d.Pids}); found {
		t.Error("neither memory nor cpuacct: found")
	}
}

func TestIntKey(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	write(t, d, map[string]string{"a": "42\n", "max": "max\n", "huge": "18446744073709551615\n", "bad": "x\n",
		"kv": "usage_usec 7\nuser_usec 5\nbroken x\n"})
	for name, want := range map[string]int64{"a": 42, "max": -1, "huge": 1<<63 - 1} {
		if n, err := Int(filepath.Join(d, name)); err != nil || n != want {
			t.Errorf("Int(%s) = %d, %v; want %d", name, n, err, want)
		}
	}
	if _, err := Int(filepath.Join(d, "bad")); err == nil {
		t.Error("Int of a word: no error")
	}
	if _, err := Int(filepath.Join(d, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Int of a missing file: %v", err)
	}
	kv := filepath.Join(d, "kv")
	if n, err := Key(kv, "user_usec"); err != nil || n != 5 {
		t.Errorf("Key(user_usec) = %d, %v", n, err)
	}
	if _, err := Key(kv, "system_usec"); !errors.Is(err, ErrNoKey) {
		t.Errorf("Key of a missing key: %v", err)
	}
	if _, err := Key(kv, "broken"); err == nil || errors.Is(err, ErrNoKey) {
		t.Errorf("Key of a value that does not parse: %v", err)
	}
	if _, err := Key(filepath.Join(d, "missing"), "x"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Key of a missing file: %v", err)
	}
}
