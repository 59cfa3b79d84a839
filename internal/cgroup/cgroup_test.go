package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/psi"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestIntKey(t *testing.T) {
	d := t.TempDir()
	testutil.WriteTree(t, d, map[string]string{"a": "42\n", "max": "max\n", "huge": "18446744073709551615\n", "bad": "x\n",
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

// TestRead reads cgroups laid out as the kernel writes them: v2 with
// limits, v2 without, a directory that is no cgroup; v1 controllers (cpu
// and cpuacct mounted together), one not mounted, neither counter.
func TestRead(t *testing.T) {
	t.Parallel()
	v2 := map[string]string{
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
	}
	v1 := map[string]string{
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
	}
	v1Dirs := func(root string) V1 {
		cpu := filepath.Join(root, "cpu,cpuacct")
		return V1{Memory: filepath.Join(root, "memory"), CPUAcct: cpu, CPU: cpu, Pids: filepath.Join(root, "pids")}
	}
	both := Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000,
		OOMKills: 1, CPUNanos: 1_500_000_000, Pids: 7, PidsDenied: 2}
	withV2 := both
	withV2.MemoryLimit, withV2.CPULimit, withV2.Pressure = 536870912, 1.5, &psi.Pressure{MemorySome: 4.25, MemoryFull: 2}
	withV1 := both
	withV1.MemoryLimit, withV1.CPULimit = 9223372036854771712, 0.5
	for _, tc := range []struct {
		name  string
		files map[string]string
		read  func(root string) (Usage, bool)
		want  Usage
		found bool
	}{
		{"v2", v2, ReadV2, withV2, true},
		{"v2 without limits", map[string]string{"cpu.max": "max 100000\n", "memory.max": "max\n", "memory.current": "1\n"}, ReadV2,
			Usage{MemoryBytes: 1, MemoryLimit: -1}, true},
		{"no cgroup", nil, ReadV2, Usage{}, false},
		{"v1", v1, func(root string) (Usage, bool) { return ReadV1(v1Dirs(root)) }, withV1, true},
		{"v1 without pids", v1, func(root string) (Usage, bool) {
			d := v1Dirs(root)
			d.Pids = ""
			return ReadV1(d)
		}, Usage{MemoryBytes: 73400320, MemoryCacheBytes: 25165824, MemoryPeakBytes: 90000000, MemoryLimit: 9223372036854771712,
			OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 0.5}, true},
		{"v1 neither memory nor cpuacct", v1, func(root string) (Usage, bool) {
			return ReadV1(V1{Pids: filepath.Join(root, "pids")})
		}, Usage{Pids: 7, PidsDenied: 2}, false},
	} {
		root := t.TempDir()
		testutil.WriteTree(t, root, tc.files)
		u, found := tc.read(root)
		if found != tc.found || !reflect.DeepEqual(u, tc.want) {
			t.Errorf("%s: %+v (pressure %+v), found %v\nwant %+v (pressure %+v), found %v", tc.name, u, u.Pressure, found, tc.want, tc.want.Pressure, tc.found)
		}
	}
}
