package e2b

import (
	"context"
	"math"
	"net/http"
	goruntime "runtime"
	"strconv"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Sandbox metrics (GET /sandboxes/{id}/metrics, the SDK's getMetrics):
// a sample every metricsInterval, E2B's, from the sandbox's cgroup (CPU
// time and limit, memory and page cache) and its writable layer (disk),
// kept for metricsKept samples. A sandbox's sampling starts when the E2B
// surface creates it (or, for one made through /v1, at its first metrics
// call) and ends with it: one goroutine and one timer per sandbox, a few
// cgroup reads and a statfs every five seconds.
const (
	metricsInterval = 5 * time.Second
	metricsKept     = 720 // an hour
)

// metric is one sample in E2B's SandboxMetric shape, every field of it,
// with E2B's meanings (envd's, which reads them in its VM): memUsed is
// memory in use less the page cache, which memCache reports apart (on
// the sandbox's cgroup: its charge less the file pages, tmpfs included,
// which is where the sandbox's disk lives); disk figures are those of the
// writable layer. Sizes are bytes.
type metric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metricsLog is one sandbox's samples.
type metricsLog struct {
	sb *sandbox.Sandbox

	// mu guards the fields below.
	mu      sync.Mutex
	samples []metric
	lastAt  time.Time // when the CPU counter was last read
	lastCPU uint64
}

// watchMetrics starts this server's sampling of a sandbox it created,
// unless the sandbox's agent keeps the history itself (a Pod's, which
// getMetrics reads instead): one sampler per sandbox, off the create's
// reply.
func (h *Handler) watchMetrics(sb *sandbox.Sandbox) {
	if _, err := sb.UsageHistory(context.Background()); err == nil {
		return
	}
	h.sampleMetrics(sb)
}

// sampleMetrics starts sampling sb unless it is sampled already, and
// returns its log. A log is shared only once it holds its first sample,
// so a metrics call racing the create's sampler never sees it empty.
func (h *Handler) sampleMetrics(sb *sandbox.Sandbox) *metricsLog {
	h.mu.Lock()
	l := h.metrics[sb.ID]
	h.mu.Unlock()
	if l != nil {
		return l
	}
	l = &metricsLog{sb: sb, lastAt: sb.Created}
	l.sample(time.Now()) // the first covers the time since the start
	h.mu.Lock()
	if prev := h.metrics[sb.ID]; prev != nil {
		h.mu.Unlock()
		return prev
	}
	h.metrics[sb.ID] = l
	h.mu.Unlock()
	go func() {
		t := time.NewTicker(metricsInterval)
		defer t.Stop()
		for now := range t.C {
			switch sb.State() {
			case sandbox.StateStopping, sandbox.StateStopped:
				return
			case sandbox.StatePaused:
				continue // nothing runs; sampling goes on after the resume
			}
			// A sample that failed is skipped: a Pod's usage comes from
			// its agent, over the network, which may miss one.
			l.sample(now)
		}
	}()
	return l
}

// sample reads the sandbox's usage and appends a sample; nothing when it
// cannot be read.
func (l *metricsLog) sample(now time.Time) {
	u, err := l.sb.Usage(context.Background())
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := newMetric(l.sb, u, now, l.lastAt, l.lastCPU)
	l.lastAt, l.lastCPU = now, u.CPUNanos
	if len(l.samples) == metricsKept {
		l.samples = append(l.samples[:0], l.samples[1:]...)
	}
	l.samples = append(l.samples, m)
}

// newMetric is the sample of usage u read at now, whose CPU use is
// measured since the CPU counter read lastCPU at lastAt.
func newMetric(sb *sandbox.Sandbox, u runtime.Usage, now, lastAt time.Time, lastCPU uint64) metric {
	// The CPUs the sandbox may use: its cgroup's quota, rounded up (as
	// getInfo's cpuCount); the host's without one.
	cpus := goruntime.NumCPU()
	if c := u.CPULimit; c > 0 {
		cpus = int(math.Ceil(c))
	} else if c := sb.CurrentLimits().CPUs; c > 0 {
		cpus = int(math.Ceil(c))
	}
	// The sandbox's memory limit, as getInfo gives it. Its cgroup's may
	// be larger (a runtime that keeps the disk in memory adds the disk to
	// it) or none (v1 shows none as a huge number, v2 as -1): the
	// cgroup's only when the sandbox has no limit of its own.
	memTotal := sb.CurrentLimits().MemoryBytes
	if memTotal <= 0 {
		memTotal = u.MemoryLimit
	}
	if memTotal < 0 || memTotal >= 1<<60 {
		memTotal = 0
	}
	memCache := min(max(u.MemoryCacheBytes, 0), u.MemoryBytes)
	// The disk's size as the sandbox's detail gives it (diskSizeMB): its
	// limit. The filesystem holding it may have a few blocks more (a disk
	// is formatted to at least the limit), which E2B's clients need not see.
	diskTotal := sb.CurrentLimits().DiskBytes
	if diskTotal <= 0 {
		diskTotal = u.DiskTotalBytes
	}
	diskUsed := min(u.DiskBytes, diskTotal)
	pct := 0.0
	if wall := now.Sub(lastAt); wall > 0 && u.CPUNanos >= lastCPU {
		pct = float64(u.CPUNanos-lastCPU) / float64(wall.Nanoseconds()) / float64(cpus) * 100
		pct = math.Round(min(pct, 100)*100) / 100
	}
	return metric{
		Timestamp: now.UTC().Format(time.RFC3339), TimestampUnix: now.Unix(),
		CPUCount: cpus, CPUUsedPct: pct, MemUsed: u.MemoryBytes - memCache, MemTotal: memTotal, MemCache: memCache,
		DiskUsed: diskUsed, DiskTotal: diskTotal,
	}
}

// historyMetrics are the samples of a sandbox's agent-kept usage history
// (a Pod's: every replica shows the same) taken since it was created (a
// warm Pod's agent sampled before it was handed out: those samples only
// serve as the first one's CPU baseline) and in [start, end].
func historyMetrics(sb *sandbox.Sandbox, hist []sandbox.UsageSample, start, end int64) []metric {
	out := []metric{}
	lastAt, lastCPU := sb.Created, uint64(0)
	for _, h := range hist {
		m := newMetric(sb, h.Usage, h.At, lastAt, lastCPU)
		lastAt, lastCPU = h.At, h.CPUNanos
		if h.At.Before(sb.Created) {
			continue
		}
		if (start == 0 || m.TimestampUnix >= start) && (end == 0 || m.TimestampUnix <= end) {
			out = append(out, m)
		}
	}
	return out
}

// between returns the samples taken in [start, end] (unix seconds; 0: open).
func (l *metricsLog) between(start, end int64) []metric {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []metric{}
	for _, m := range l.samples {
		if (start == 0 || m.TimestampUnix >= start) && (end == 0 || m.TimestampUnix <= end) {
			out = append(out, m)
		}
	}
	return out
}

// getMetrics answers GET /sandboxes/{id}/metrics?start=&end=.
func (h *Handler) getMetrics(w http.ResponseWriter, r *http.Request, owner string) error {
	var bounds [2]int64
	for i, k := range []string{"start", "end"} {
		if v := r.URL.Query().Get(k); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return badRequest("%s must be a unix time in seconds", k)
			}
			bounds[i] = n
		}
	}
	sb, err := h.backend.Sandbox(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	// A Pod's agent keeps the history, which every replica reads alike;
	// elsewhere this server samples the sandbox itself.
	if hist, err := sb.UsageHistory(r.Context()); err == nil {
		writeJSON(w, http.StatusOK, historyMetrics(sb, hist, bounds[0], bounds[1]))
		return nil
	}
	writeJSON(w, http.StatusOK, h.sampleMetrics(sb).between(bounds[0], bounds[1]))
	return nil
}
