package metrics

import (
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sheepfold/sheepfold/internal/events"
)

// GET /v1/metrics: the figures of /metrics as JSON for the dashboard's
// metrics page, cut to what the caller may see. /metrics itself is for
// admin keys, since its figures describe every account's work; a
// dashboard user is an account, not necessarily the admin. So:
//
//   - account: the caller's own sandboxes by state, and its own
//     executions by status, resource_exceeded events by resource and
//     security violations by kind since the server started;
//   - server: latency quantiles of the service every account gets
//     (sandbox create by pool hit/miss, execution by language, agent round
//     trip by operation, preview connect), without counts, so that no
//     account learns how much others do;
//   - admin (admin keys only): the server-wide counters and gauges of
//     /metrics (sandboxes by state, the pool, executions, OOM kills,
//     violations, HTTP requests, preview traffic, the Go runtime).

// accountCounts are one owner's event counts since the server started.
type accountCounts struct {
	executions map[string]int64 // status
	exceeded   map[string]int64 // resource
	violations map[string]int64 // kind
}

// ownCounts holds accountCounts per owner, from the event bus's hook.
// Keys are owners (accounts or keys), as many as the store has.
type ownCounts struct {
	mu sync.Mutex // guards m
	m  map[string]*accountCounts
}

func (o *ownCounts) add(e events.Event, label func(string) string) {
	if e.Owner == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]*accountCounts{}
	}
	c := o.m[e.Owner]
	if c == nil {
		c = &accountCounts{executions: map[string]int64{}, exceeded: map[string]int64{}, violations: map[string]int64{}}
		o.m[e.Owner] = c
	}
	switch e.Type {
	case events.ExecutionFinished:
		c.executions[bounded(label("status"), knownStatuses)]++
	case events.ResourceExceeded:
		c.exceeded[bounded(label("resource"), knownResources)]++
	case events.SecurityViolation:
		c.violations[bounded(label("kind"), knownKinds)]++
	}
}

func (o *ownCounts) of(owner string) (executions, exceeded, violations map[string]int64) {
	cp := func(m map[string]int64) map[string]int64 {
		out := make(map[string]int64, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.m[owner]
	if c == nil {
		return map[string]int64{}, map[string]int64{}, map[string]int64{}
	}
	return cp(c.executions), cp(c.exceeded), cp(c.violations)
}

// latencyJSON is a histogram's quantiles in seconds, estimated as
// Prometheus's histogram_quantile does (linear within a bucket); null
// when nothing was observed.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Summary is the answer of GET /v1/metrics.
type Summary struct {
	At      time.Time      `json:"at"`
	Account AccountFigures `json:"account"`
	Server  ServerFigures  `json:"server"`
	Admin   *AdminFigures  `json:"admin,omitempty"`
}

// AccountFigures are the caller's own; Sandboxes is the caller's to
// fill (the server knows its sandboxes' owners).
type AccountFigures struct {
	Sandboxes          map[string]int   `json:"sandboxes"`
	Executions         map[string]int64 `json:"executions"`
	ResourceExceeded   map[string]int64 `json:"resource_exceeded"`
	SecurityViolations map[string]int64 `json:"security_violations"`
}

// ServerFigures are the latencies every account gets.
type ServerFigures struct {
	CreateSeconds         map[string]*Latency `json:"create_seconds"`
	ExecutionSeconds      map[string]*Latency `json:"execution_seconds"`
	AgentCallSeconds      map[string]*Latency `json:"agent_call_seconds"`
	PreviewConnectSeconds *Latency            `json:"preview_connect_seconds"`
}

// AdminFigures are the server-wide figures, for admin keys.
type AdminFigures struct {
	Sandboxes          map[string]float64 `json:"sandboxes"`
	PoolReady          float64            `json:"pool_ready"`
	Creates            map[string]float64 `json:"creates"`
	Executions         map[string]float64 `json:"executions"`
	OOMKills           float64            `json:"oom_kills"`
	ResourceExceeded   map[string]float64 `json:"resource_exceeded"`
	SecurityViolations map[string]float64 `json:"security_violations"`
	HTTPRequests       map[string]float64 `json:"http_requests"` // "route code"
	PreviewRequests    float64            `json:"preview_requests"`
	PreviewBytes       map[string]float64 `json:"preview_bytes"`
	Goroutines         float64            `json:"goroutines"`
	HeapBytes          float64            `json:"heap_bytes"`
	ProcessCPUSeconds  float64            `json:"process_cpu_seconds"`
	ResidentBytes      float64            `json:"resident_bytes"`
}

// Summary returns the figures of the metrics that owner may see: its own
// event counts (not its sandboxes: Account.Sandboxes is the caller's to
// fill), the service's latencies, and with admin the server-wide figures.
func (m *Metrics) Summary(owner string, admin bool) (*Summary, error) {
	out := &Summary{At: time.Now().UTC()}
	out.Account.Executions, out.Account.ResourceExceeded, out.Account.SecurityViolations = m.own.of(owner)

	fams, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	out.Server = ServerFigures{CreateSeconds: map[string]*Latency{}, ExecutionSeconds: map[string]*Latency{},
		AgentCallSeconds: map[string]*Latency{}}
	var ad *AdminFigures
	if admin {
		ad = &AdminFigures{Sandboxes: map[string]float64{}, Creates: map[string]float64{}, Executions: map[string]float64{},
			ResourceExceeded: map[string]float64{}, SecurityViolations: map[string]float64{}, HTTPRequests: map[string]float64{},
			PreviewBytes: map[string]float64{}}
		out.Admin = ad
	}
	for _, f := range fams {
		name := f.GetName()
		switch name {
		case "sheepfold_sandbox_create_duration_seconds":
			mergeQuantiles(out.Server.CreateSeconds, f, "pool")
		case "sheepfold_execution_duration_seconds":
			mergeQuantiles(out.Server.ExecutionSeconds, f, "language")
		case "sheepfold_agent_call_duration_seconds":
			mergeQuantiles(out.Server.AgentCallSeconds, f, "op")
		case "sheepfold_preview_connect_duration_seconds":
			one := map[string]*Latency{}
			mergeQuantiles(one, f, "")
			out.Server.PreviewConnectSeconds = one[""]
		}
		if ad == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			switch name {
			case "sheepfold_sandboxes":
				ad.Sandboxes[label(m, "state")] += v
			case "sheepfold_pool_ready":
				ad.PoolReady = v
			case "sheepfold_sandbox_creates_total":
				ad.Creates[label(m, "pool")] += v
			case "sheepfold_executions_total":
				ad.Executions[label(m, "status")] += v
			case "sheepfold_oom_kills_total":
				ad.OOMKills = v
			case "sheepfold_resource_exceeded_total":
				ad.ResourceExceeded[label(m, "resource")] += v
			case "sheepfold_security_violations_total":
				ad.SecurityViolations[label(m, "kind")] += v
			case "sheepfold_http_requests_total":
				ad.HTTPRequests[label(m, "route")+" "+label(m, "code")] += v
			case "sheepfold_preview_requests_total":
				ad.PreviewRequests = v
			case "sheepfold_preview_bytes_total":
				ad.PreviewBytes[label(m, "direction")] += v
			case "go_goroutines":
				ad.Goroutines = v
			case "go_memstats_heap_alloc_bytes":
				ad.HeapBytes = v
			case "process_cpu_seconds_total":
				ad.ProcessCPUSeconds = v
			case "process_resident_memory_bytes":
				ad.ResidentBytes = v
			}
		}
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// mergeQuantiles adds f's histograms, summed over every label but by,
// to into as quantiles; a group with no observation is left out.
func mergeQuantiles(into map[string]*Latency, f *dto.MetricFamily, by string) {
	type acc struct {
		count  uint64
		bounds []float64
		cum    []uint64
	}
	groups := map[string]*acc{}
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		k := ""
		if by != "" {
			k = label(m, by)
		}
		a := groups[k]
		if a == nil {
			a = &acc{}
			for _, b := range h.GetBucket() {
				a.bounds = append(a.bounds, b.GetUpperBound())
			}
			a.cum = make([]uint64, len(a.bounds))
			groups[k] = a
		}
		a.count += h.GetSampleCount()
		for i, b := range h.GetBucket() {
			if i < len(a.cum) {
				a.cum[i] += b.GetCumulativeCount()
			}
		}
	}
	for k, a := range groups {
		if a.count == 0 {
			continue
		}
		q := func(p float64) float64 { return bucketQuantile(p, a.count, a.bounds, a.cum) }
		into[k] = &Latency{P50: q(0.5), P90: q(0.9), P99: q(0.99)}
	}
}

// bucketQuantile estimates the p-quantile of count observations in
// buckets with upper bounds bounds and cumulative counts cum, linear
// within the bucket it falls in; past the last bound it is the last bound.
func bucketQuantile(p float64, count uint64, bounds []float64, cum []uint64) float64 {
	rank := p * float64(count)
	i := sort.Search(len(cum), func(i int) bool { return float64(cum[i]) >= rank })
	if i == len(cum) {
		if len(bounds) == 0 {
			return 0
		}
		return bounds[len(bounds)-1]
	}
	lo, below := 0.0, uint64(0)
	if i > 0 {
		lo, below = bounds[i-1], cum[i-1]
	}
	in := cum[i] - below
	if in == 0 {
		return bounds[i]
	}
	return lo + (bounds[i]-lo)*(rank-float64(below))/float64(in)
}
