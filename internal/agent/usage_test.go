package agent

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// writeTree writes files (path relative to root: content) and symlinks
// (path: target) under root.
func writeTree(t *testing.T, root string, files, links map[string]string) {
	t.Helper()
	testutil.WriteTree(t, root, files)
	for p, target := range links {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
}

// v2Files is a container's cgroup v2 directory (under prefix).
func v2Files(prefix string) map[string]string {
	return map[string]string{
		prefix + "cgroup.controllers": "cpuset cpu io memory pids\n",
		prefix + "cpu.stat":           "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		prefix + "cpu.max":            "150000 100000\n",
		prefix + "memory.current":     "104857600\n",
		prefix + "memory.peak":        "209715200\n",
		prefix + "memory.max":         "536870912\n",
		prefix + "memory.stat":        "anon 73400320\nfile 31457280\nkernel 1048576\n",
		prefix + "memory.events":      "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n",
		prefix + "pids.current":       "17\n",
		prefix + "pids.events":        "max 5\n",
		prefix + "cpu.pressure":       "some avg10=1.50 avg60=0.30 avg300=0.06 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		prefix + "memory.pressure":    "some avg10=4.25 avg60=1.00 avg300=0.20 total=999\nfull avg10=2.00 avg60=0.50 avg300=0.10 total=555\n",
		prefix + "io.pressure":        "some avg10=0.75 avg60=0.10 avg300=0.01 total=77\nfull avg10=0.25 avg60=0.05 avg300=0.01 total=33\n",
	}
}

var v2Want = agentproto.Usage{
	Cgroup: "v2", MemoryBytes: 100 << 20, MemoryCacheBytes: 30 << 20, MemoryPeakBytes: 200 << 20, MemoryLimit: 512 << 20,
	OOMKills: 2, CPUNanos: 2_500_000_000, CPULimit: 1.5, Pids: 17, PidsDenied: 5,
	Pressure: &agentproto.Pressure{CPUSome: 1.5, MemorySome: 4.25, MemoryFull: 2, IOSome: 0.75, IOFull: 0.25},
}

// v1Files is a container's cgroup v1 directories, each controller's
// hierarchy under its mount (prefix is the path inside each).
func v1Files(prefix string) map[string]string {
	return map[string]string{
		"memory/" + prefix + "memory.usage_in_bytes":     "104857600\n",
		"memory/" + prefix + "memory.max_usage_in_bytes": "209715200\n",
		"memory/" + prefix + "memory.limit_in_bytes":     "536870912\n",
		"memory/" + prefix + "memory.stat":               "cache 1000\nrss 2000\ntotal_cache 31457280\ntotal_rss 73400320\n",
		"memory/" + prefix + "memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"cpu,cpuacct/" + prefix + "cpuacct.usage":        "2500000000\n",
		"cpu,cpuacct/" + prefix + "cpu.cfs_quota_us":     "150000\n",
		"cpu,cpuacct/" + prefix + "cpu.cfs_period_us":    "100000\n",
		"pids/" + prefix + "pids.current":                "17\n",
		"pids/" + prefix + "pids.events":                 "max 5\n",
	}
}

var v1Want = agentproto.Usage{
	Cgroup: "v1", MemoryBytes: 100 << 20, MemoryCacheBytes: 30 << 20, MemoryPeakBytes: 200 << 20, MemoryLimit: 512 << 20,
	OOMKills: 2, CPUNanos: 2_500_000_000, CPULimit: 1.5, Pids: 17, PidsDenied: 5,
}

// A v1 /proc/self/cgroup of a container whose hierarchies are bound to
// its own directories: the paths are the host's, not found under them.
const v1Self = `12:pids:/kubepods/burstable/pod1/abc
5:cpu,cpuacct:/kubepods/burstable/pod1/abc
4:memory:/kubepods/burstable/pod1/abc
1:name=systemd:/kubepods/burstable/pod1/abc
0::/kubepods/burstable/pod1/abc
`

func TestReadCgroupUsage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		files map[string]string
		links map[string]string
		self  string
		want  agentproto.Usage
	}{
		{name: "v2 cgroup namespace", files: v2Files(""), self: "0::/\n", want: v2Want},
		{name: "v2 without /proc/self/cgroup", files: v2Files(""), want: v2Want},
		{
			// The whole hierarchy mounted (no cgroup namespace): the
			// agent's own path under it, not the root's figures.
			name:  "v2 whole hierarchy",
			files: merge(v2Files("kubepods.slice/pod1/abc/"), map[string]string{"cgroup.controllers": "cpu memory pids\n", "memory.current": "1\n", "cpu.stat": "usage_usec 1\n"}),
			self:  "0::/kubepods.slice/pod1/abc\n", want: v2Want,
		},
		{
			// A path in /proc/self/cgroup that is not under the mount: the
			// mount is the cgroup itself.
			name: "v2 host path not under the mount", files: v2Files(""), self: "0::/kubepods.slice/pod1/abc\n", want: v2Want,
		},
		{
			name: "v2 without limits, peak or PSI",
			files: map[string]string{
				"cgroup.controllers": "memory\n", "memory.current": "4096\n", "memory.max": "max\n",
				"cpu.stat": "usage_usec 7\n", "cpu.max": "max 100000\n",
			},
			self: "0::/\n",
			want: agentproto.Usage{Cgroup: "v2", MemoryBytes: 4096, MemoryLimit: -1, CPUNanos: 7000},
		},
		{
			name: "v1 bound mounts with symlinks", files: v1Files(""), self: v1Self, want: v1Want,
			links: map[string]string{"cpu": "cpu,cpuacct", "cpuacct": "cpu,cpuacct"},
		},
		{name: "v1 joint mount without symlinks", files: v1Files(""), self: v1Self, want: v1Want},
		{
			name:  "v1 whole hierarchies",
			files: merge(v1Files("kubepods/burstable/pod1/abc/"), map[string]string{"memory/memory.usage_in_bytes": "1\n", "cpu,cpuacct/cpuacct.usage": "1\n"}),
			links: map[string]string{"cpuacct": "cpu,cpuacct", "cpu": "cpu,cpuacct"},
			self:  v1Self, want: v1Want,
		},
		{
			name: "v1 memory only, no limits",
			files: map[string]string{
				"memory/memory.usage_in_bytes": "8192\n", "memory/memory.limit_in_bytes": "9223372036854771712\n",
				"cpuacct/cpuacct.usage": "99\n", "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
			},
			want: agentproto.Usage{Cgroup: "v1", MemoryBytes: 8192, MemoryLimit: 9223372036854771712, CPUNanos: 99},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			writeTree(t, root, tc.files, tc.links)
			got, err := readCgroupUsage(root, tc.self)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("usage\n got %+v (pressure %+v)\nwant %+v (pressure %+v)", got, got.Pressure, tc.want, tc.want.Pressure)
			}
		})
	}
}

func TestReadCgroupUsageNoCgroup(t *testing.T) {
	t.Parallel()
	for name, files := range map[string]map[string]string{
		"empty":                     {},
		"v2 without counters":       {"cgroup.controllers": "", "pids.current": "3\n"},
		"v1 pids only":              {"pids/pids.current": "3\n"},
		"v1 memory without counter": {"memory/memory.stat": "total_cache 1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			writeTree(t, root, files, nil)
			if u, err := readCgroupUsage(root, "0::/\n"); !errors.Is(err, errNoCgroup) {
				t.Fatalf("usage %+v, err %v; want errNoCgroup", u, err)
			}
		})
	}
}

func TestUsageOp(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeTree(t, root, v2Files(""), nil)
	a := startAgent(t, Config{CgroupRoot: root})
	done := a.call(t, agentproto.Request{Op: agentproto.OpUsage}).mustOK(t).done
	if done.Usage == nil || !reflect.DeepEqual(*done.Usage, v2Want) {
		t.Fatalf("usage %+v, want %+v", done.Usage, v2Want)
	}

	// No cgroup: refused as unsupported, not an internal failure.
	b := startAgent(t, Config{CgroupRoot: t.TempDir()})
	if done := b.call(t, agentproto.Request{Op: agentproto.OpUsage}).done; done.Code != agentproto.CodeUnsupported || done.Usage != nil {
		t.Fatalf("without a cgroup: %+v", done)
	}
}

func merge(maps ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestParseProcCgroup(t *testing.T) {
	t.Parallel()
	got := parseProcCgroup(v1Self + "garbage\n7:blkio\n")
	want := map[string]string{"pids": "/kubepods/burstable/pod1/abc", "cpu": "/kubepods/burstable/pod1/abc",
		"cpuacct": "/kubepods/burstable/pod1/abc", "memory": "/kubepods/burstable/pod1/abc",
		"name=systemd": "/kubepods/burstable/pod1/abc", "": "/kubepods/burstable/pod1/abc"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
}

// The cgroup files come from the kernel, but the parsers must not fail
// on anything (a future format, a fake tree).
func FuzzCgroupText(f *testing.F) {
	f.Add(v1Self)
	f.Add("0::/\n")
	f.Fuzz(func(t *testing.T, text string) {
		parseProcCgroup(text)
	})
}

// TestUsageHistory: with UsageHistory the agent samples its usage at once
// and keeps it for usage.history; without, the op is unsupported.
func TestUsageHistory(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeTree(t, root, v2Files(""), nil)
	a := startAgent(t, Config{CgroupRoot: root, UsageHistory: true})
	var hist []agentproto.UsageSample
	for deadline := time.Now().Add(5 * time.Second); len(hist) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		hist = a.call(t, agentproto.Request{Op: agentproto.OpUsageHistory}).mustOK(t).done.History
	}
	if len(hist) != 1 || !reflect.DeepEqual(hist[0].Usage, v2Want) || time.Since(time.UnixMilli(hist[0].UnixMS)) > time.Minute {
		t.Fatalf("history %+v", hist)
	}
	if info := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t).done.Agent; info.IdleMS == 0 && info.Busy != 0 {
		t.Fatalf("history reads count as activity: %+v", info)
	}
	b := startAgent(t, Config{CgroupRoot: root})
	if done := b.call(t, agentproto.Request{Op: agentproto.OpUsageHistory}).done; done.Code != agentproto.CodeUnsupported {
		t.Fatalf("without a history: %+v", done)
	}
}
