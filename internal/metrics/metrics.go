// Package metrics keeps the server's Prometheus instruments
// (github.com/prometheus/client_golang), on a registry of its own. The
// request path only adds to counters and histograms; gauges of state
// (sandboxes by state, the pool, streams, shed connections, what the
// store keeps) are read at scrape time, and the execution and violation
// counters come from the event bus's hook (OnEvent), off every request's
// path. Summary cuts the same figures to what one account may see, for
// GET /v1/metrics.
//
// The server (internal/server) serves them: GET /metrics for admin keys,
// GET /v1/metrics for every key, and Handler without a key on `serve
// --metrics-listen`'s separate listener.
//
// # What is counted, and who sees what
//
// In detail: a registry per server. The request path only adds to
// counters and histograms: HTTP requests by route pattern (set by the
// mux wrapper, or `preview` / `e2b`) and code, creates by pool hit or miss
// and template with their latency, preview bytes (a counting wrapper on
// each preview connection) and connect time, agent calls by op (the
// engine's `Hooks.AgentCall`, one atomic load and an observe per call).
// Executions by status and language with their run time, OOM kills,
// `resource_exceeded` and `security_violation` come from a bus hook
// (`execution.finished` carries the language), off the request path,
// with label values limited to the known kinds, resources, statuses and
// languages (some are reported from inside the sandbox; anything else is
// `other`, so sandboxed code cannot grow the registry);
// sandboxes by state and the warm pool are read from the engine at scrape
// time; the Go runtime and process collectors add the rest. `/metrics`
// needs an admin key on the API listener; `serve --metrics-listen` serves
// it without one on a separate listener meant for a private address.
//
// The metrics page polls `GET /v1/metrics` every 2 s and draws rates from
// successive polls. `/metrics` is admin-only, since it describes every
// account's work; a dashboard user is an account, so `GET /v1/metrics`
// (Summary, summary.go) gives any key: its own sandboxes by
// state and its own executions by status, `resource_exceeded` by resource
// and violations by kind since the server started (counted per owner by
// the same bus hook that feeds the Prometheus counters); server-wide
// latency quantiles (p50/p90/p99, estimated from the histograms' buckets as
// `histogram_quantile` does) of sandbox creates by pool hit/miss,
// executions by language, agent calls by op and preview connects, without
// counts, so no account learns how much the others do; and to admin keys
// only, the server-wide counters and gauges of `/metrics` (sandboxes by
// state, pool, creates, executions, OOM kills, violations, HTTP requests
// by route and code, preview traffic, goroutines, heap, RSS, process CPU).
//
// Imports: internal/sandbox (states, the pool, execution statuses),
// internal/events (the events counted) and internal/lang (the languages
// a label may name).
package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Engine is what the gauges read of the engine at scrape time.
type Engine interface {
	List() []sandbox.Info
	PoolStats() sandbox.PoolStats
}

var _ Engine = (*sandbox.Manager)(nil)

// Config says where the gauges read at scrape time come from.
type Config struct {
	// Engine is read for the sandboxes by state and the pool; nil: no
	// such gauges are sent.
	Engine Engine
	// StreamsOpen and ConnectionsShed are read for the gauge of open
	// streams and the counter of shed connections [none].
	StreamsOpen     func() int
	ConnectionsShed func() int
	// Collectors are registered too (the store's amounts).
	Collectors []prometheus.Collector
	// Logger logs what fails in a scrape [slog.Default()].
	Logger *slog.Logger
}

// Metrics are the server's instruments.
type Metrics struct {
	log *slog.Logger
	reg *prometheus.Registry

	creates        *prometheus.CounterVec   // pool (hit|miss), template
	createSeconds  *prometheus.HistogramVec // pool, template
	executions     *prometheus.CounterVec   // status, language
	execSeconds    *prometheus.HistogramVec // language
	oomKills       prometheus.Counter
	exceeded       *prometheus.CounterVec // resource
	violations     *prometheus.CounterVec // kind
	httpRequests   *prometheus.CounterVec // route, code
	httpSeconds    *prometheus.HistogramVec
	previewBytes   *prometheus.CounterVec // direction (in: to the sandbox, out: from it)
	previewReqs    prometheus.Counter
	previewDial    prometheus.Histogram
	agentCall      *prometheus.HistogramVec // op
	previewIn      prometheus.Counter       // previewBytes' children, resolved once
	previewOut     prometheus.Counter
	streamRefusals *prometheus.CounterVec // scope (key, account, server)

	own ownCounts // per-owner event counts for GET /v1/metrics
}

// Buckets of the latency histograms, in seconds: from 0.5 ms (a warm
// 1+1 is ~2.5 ms over HTTP) to a minute.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New returns the instruments, registered.
func New(cfg Config) *Metrics {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StreamsOpen == nil {
		cfg.StreamsOpen = func() int { return 0 }
	}
	if cfg.ConnectionsShed == nil {
		cfg.ConnectionsShed = func() int { return 0 }
	}
	m := &Metrics{reg: prometheus.NewRegistry(), log: cfg.Logger}
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	m.creates = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_sandbox_creates_total",
		Help: "Sandboxes created, by whether the warm pool served them (pool=hit|miss) and template."}, []string{"pool", "template"})
	m.createSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sheepfold_sandbox_create_duration_seconds",
		Help: "Time to create a sandbox (admission, engine, record), by pool hit or miss and template.", Buckets: latencyBuckets}, []string{"pool", "template"})
	m.executions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_executions_total",
		Help: "Executions finished, by status (success, error, timeout, failed, ...) and language."}, []string{"status", "language"})
	m.execSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sheepfold_execution_duration_seconds",
		Help: "Run time of executions as the kernel measured it, by language.", Buckets: latencyBuckets}, []string{"language"})
	m.oomKills = prometheus.NewCounter(prometheus.CounterOpts{Name: "sheepfold_oom_kills_total",
		Help: "Executions or sandboxes the kernel's OOM killer ended (resource_exceeded events for memory)."})
	m.exceeded = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_resource_exceeded_total",
		Help: "resource_exceeded events, by resource."}, []string{"resource"})
	m.violations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_security_violations_total",
		Help: "security_violation events, by kind."}, []string{"kind"})
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_http_requests_total",
		Help: "HTTP requests answered, by route pattern (e2b, preview, or other for the rest) and status code."}, []string{"route", "code"})
	m.httpSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sheepfold_http_request_duration_seconds",
		Help: "Time to answer HTTP requests (streams: their whole life), by route.", Buckets: latencyBuckets}, []string{"route"})
	m.previewBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_preview_bytes_total",
		Help: "Bytes carried by preview connections, by direction (in: to the sandbox, out: from it)."}, []string{"direction"})
	m.previewReqs = prometheus.NewCounter(prometheus.CounterOpts{Name: "sheepfold_preview_requests_total",
		Help: "Requests admitted to a preview (after the access check)."})
	m.previewDial = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sheepfold_preview_connect_duration_seconds",
		Help: "Time to open a connection to a port inside a sandbox through its agent.", Buckets: latencyBuckets})
	m.agentCall = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sheepfold_agent_call_duration_seconds",
		Help: "Round trip of host→agent calls, request to Done, by operation (context.execute includes the code's run time).", Buckets: latencyBuckets}, []string{"op"})
	m.streamRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sheepfold_streams_refused_total",
		Help: "Streams (long-lived requests) refused, by the share they would have passed: key, account or server."}, []string{"scope"})
	streamsOpen := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sheepfold_streams_open",
		Help: "Streams (long-lived requests: executions, event streams, downloads, previews, MCP calls, E2B streams) open now."},
		func() float64 { return float64(cfg.StreamsOpen()) })
	connsShed := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sheepfold_connections_shed_total",
		Help: "Client connections serving no request (idle, or not yet sending one) closed to keep the bound of open connections."},
		func() float64 { return float64(cfg.ConnectionsShed()) })
	for _, c := range []prometheus.Collector{m.creates, m.createSeconds, m.executions, m.execSeconds, m.oomKills,
		m.exceeded, m.violations, m.httpRequests, m.httpSeconds, m.previewBytes, m.previewReqs, m.previewDial, m.agentCall,
		m.streamRefusals, streamsOpen, connsShed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{engine: cfg.Engine}} {
		f(c)
	}
	for _, c := range cfg.Collectors {
		f(c)
	}
	m.previewIn = m.previewBytes.WithLabelValues("in")
	m.previewOut = m.previewBytes.WithLabelValues("out")
	return m
}

// stateCollector reads the engine's sandboxes by state and the warm
// pool at scrape time.
type stateCollector struct{ engine Engine }

var (
	sandboxesDesc = prometheus.NewDesc("sheepfold_sandboxes", "Sandboxes the engine holds, by state (pool members not included).", []string{"state"}, nil)
	poolReadyDesc = prometheus.NewDesc("sheepfold_pool_ready", "Warm pool members ready to be handed out.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- poolReadyDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.engine == nil {
		return
	}
	counts := map[sandbox.State]int{sandbox.StateStarting: 0, sandbox.StateRunning: 0, sandbox.StatePaused: 0, sandbox.StateStopping: 0}
	for _, in := range c.engine.List() {
		counts[in.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), string(st))
	}
	ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(c.engine.PoolStats().Ready))
}

// Created records a sandbox create that took d.
func (m *Metrics) Created(sb *sandbox.Sandbox, d time.Duration) {
	pool := "miss"
	if sb.FromPool() {
		pool = "hit"
	}
	m.creates.WithLabelValues(pool, sb.Template).Inc()
	m.createSeconds.WithLabelValues(pool, sb.Template).Observe(d.Seconds())
}

// OnEvent counts executions, exceeded resources and violations: a bus
// hook, on the bus's goroutine.
func (m *Metrics) OnEvent(e events.Event) {
	str := func(k string) string {
		if v, ok := e.Details[k]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return ""
	}
	m.own.add(e, str)
	switch e.Type {
	case events.ExecutionFinished:
		lang := bounded(str("language"), knownLanguages)
		m.executions.WithLabelValues(bounded(str("status"), knownStatuses), lang).Inc()
		if ms, ok := number(e.Details["duration_ms"]); ok {
			m.execSeconds.WithLabelValues(lang).Observe(ms / 1000)
		}
	case events.ResourceExceeded:
		res := bounded(str("resource"), knownResources)
		m.exceeded.WithLabelValues(res).Inc()
		if res == events.ResourceMemory {
			m.oomKills.Inc()
		}
	case events.SecurityViolation:
		m.violations.WithLabelValues(bounded(str("kind"), knownKinds)).Inc()
	}
}

// Label values taken from events are limited to these sets: some are
// reported from inside the sandbox (a violation's kind, a resource, a
// context's language) and code there could otherwise make up a new
// series per report. Anything else counts as "other".
var (
	knownLanguages = set(lang.All()...)
	knownStatuses  = set(sandbox.ExecSuccess, sandbox.ExecError, sandbox.ExecTimeout, "failed")
	knownResources = set(events.ResourceCPUTime, events.ResourceWallTime, events.ResourceMemory, events.ResourceDisk,
		events.ResourceOutput, events.ResourceNetworkRequests, events.ResourceNetworkFlows, events.ResourcePids)
	knownKinds = set(events.KindModuleBlocked, events.KindSubprocessDenied, events.KindNetworkDenied, events.KindDNSDenied,
		events.KindPathDenied, events.KindSyscallDenied)
)

func set(vs ...string) map[string]bool {
	m := make(map[string]bool, len(vs))
	for _, v := range vs {
		m[v] = true
	}
	return m
}

// bounded is v when it is one of known, else "other".
func bounded(v string, known map[string]bool) string {
	if known[v] {
		return v
	}
	return "other"
}

// number reads a JSON-able number of an event's details (its own type
// when emitted in this process, float64 after a trip through JSON).
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	}
	return 0, false
}

// AgentCallDone observes one host→agent call (sandbox.Hooks.AgentCall).
func (m *Metrics) AgentCallDone(op string, d time.Duration) {
	m.agentCall.WithLabelValues(op).Observe(d.Seconds())
}

// HTTPRequest records one answered request.
func (m *Metrics) HTTPRequest(route string, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	m.httpRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.httpSeconds.WithLabelValues(route).Observe(d.Seconds())
}

// PreviewRequest counts a request admitted to a preview.
func (m *Metrics) PreviewRequest() { m.previewReqs.Inc() }

// PreviewDialed observes the time to open a preview connection.
func (m *Metrics) PreviewDialed(d time.Duration) { m.previewDial.Observe(d.Seconds()) }

// CountPreview counts the bytes of a preview connection.
func (m *Metrics) CountPreview(nc net.Conn) net.Conn {
	return &countingConn{Conn: nc, in: m.previewIn, out: m.previewOut}
}

type countingConn struct {
	net.Conn
	in, out prometheus.Counter
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.out.Add(float64(n))
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.in.Add(float64(n))
	}
	return n, err
}

// Handler serves the metrics in Prometheus's text format; it
// authenticates nobody.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{m.log}})
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics", "err", v) }

// StreamRefused counts a stream refused at its scope's share.
func (m *Metrics) StreamRefused(scope string) { m.streamRefusals.WithLabelValues(scope).Inc() }
