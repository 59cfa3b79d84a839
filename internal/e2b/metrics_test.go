package e2b

import (
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestHistoryMetrics: an agent's history becomes E2B samples from the
// sandbox's creation on, the first one's CPU use measured from the last
// sample before it (a warm Pod's), the window applied.
func TestHistoryMetrics(t *testing.T) {
	t.Parallel()
	created := time.Unix(1_000_000, 0)
	sb := &sandbox.Sandbox{ID: "sb", Created: created,
		Limits: runtime.Limits{CPUs: 2, MemoryBytes: 512 << 20, DiskBytes: 256 << 20}}
	u := func(cpuSec float64, disk int64) runtime.Usage {
		return runtime.Usage{CPUNanos: uint64(cpuSec * 1e9), MemoryBytes: 100 << 20, MemoryCacheBytes: 10 << 20,
			MemoryLimit: 512 << 20, CPULimit: 2, DiskBytes: disk, DiskTotalBytes: 256 << 20}
	}
	hist := []sandbox.UsageSample{
		{At: created.Add(-5 * time.Second), Usage: u(3, 0)}, // before the hand-out
		{At: created.Add(2 * time.Second), Usage: u(3.7, 1<<20)},
		{At: created.Add(7 * time.Second), Usage: u(8.7, 9<<20)},
	}
	ms := historyMetrics(sb, hist, 0, 0)
	if len(ms) != 2 {
		t.Fatalf("samples %+v", ms)
	}
	// 0.7 CPU-s over 7 s on 2 CPUs; then 5 over 5 s on 2.
	if ms[0].CPUUsedPct != 5 || ms[1].CPUUsedPct != 50 || ms[1].DiskUsed != 9<<20 || ms[1].DiskTotal != 256<<20 ||
		ms[1].MemUsed != 90<<20 || ms[1].MemCache != 10<<20 || ms[0].CPUCount != 2 || ms[1].TimestampUnix != created.Unix()+7 {
		t.Fatalf("samples %+v", ms)
	}
	if w := historyMetrics(sb, hist, created.Unix()+5, 0); len(w) != 1 || w[0].TimestampUnix != created.Unix()+7 {
		t.Fatalf("window: %+v", w)
	}
}

// TestMetricDiskIsTheLimit: a disk formatted a few blocks past the
// sandbox's limit is reported at the limit (the size the sandbox's detail
// gives), its use never past it.
func TestMetricDiskIsTheLimit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	sb := &sandbox.Sandbox{ID: "sb", Created: now, Limits: runtime.Limits{DiskBytes: 256 << 20}}
	m := newMetric(sb, runtime.Usage{DiskBytes: 256<<20 + 8192, DiskTotalBytes: 256<<20 + 249856}, now, now, 0)
	if m.DiskTotal != 256<<20 || m.DiskUsed != 256<<20 {
		t.Fatalf("disk %d/%d, want 256 MiB/256 MiB", m.DiskUsed, m.DiskTotal)
	}
	// Without a limit, the filesystem's size.
	sb.Limits.DiskBytes = 0
	if m := newMetric(sb, runtime.Usage{DiskBytes: 1 << 20, DiskTotalBytes: 300 << 20}, now, now, 0); m.DiskTotal != 300<<20 || m.DiskUsed != 1<<20 {
		t.Fatalf("no limit: disk %d/%d", m.DiskUsed, m.DiskTotal)
	}
}

// TestMetricMemoryIsTheLimit: memTotal is the sandbox's memory limit, as
// getInfo gives it, though its cgroup's holds the disk too (a Pod whose
// disk is in memory: 512 MiB and 256 MiB).
func TestMetricMemoryIsTheLimit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	sb := &sandbox.Sandbox{ID: "sb", Created: now, Limits: runtime.Limits{MemoryBytes: 512 << 20, DiskBytes: 256 << 20}}
	if m := newMetric(sb, runtime.Usage{MemoryLimit: 768 << 20, MemoryBytes: 100 << 20}, now, now, 0); m.MemTotal != 512<<20 {
		t.Fatalf("memTotal %d, want 512 MiB", m.MemTotal)
	}
	// Without a limit of its own, the cgroup's; none there either: 0.
	sb.Limits.MemoryBytes = 0
	if m := newMetric(sb, runtime.Usage{MemoryLimit: 768 << 20}, now, now, 0); m.MemTotal != 768<<20 {
		t.Fatalf("no limit: memTotal %d", m.MemTotal)
	}
	if m := newMetric(sb, runtime.Usage{MemoryLimit: -1}, now, now, 0); m.MemTotal != 0 {
		t.Fatalf("no limit anywhere: memTotal %d", m.MemTotal)
	}
}
