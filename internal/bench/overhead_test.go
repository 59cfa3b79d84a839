package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOverheadScriptOnHost runs the micro-benchmarks' script with the
// host's python3 (as the bench's host baseline does): it must print every
// metric, each a positive time.
func TestOverheadScriptOnHost(t *testing.T) {
	t.Parallel()
	m, err := hostOverhead(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range overheadMetrics {
		if v := m[k.key]; !(v > 0) {
			t.Errorf("%s = %v, want a positive time", k.key, v)
		}
	}
}

// TestParseOverhead refuses output that misses a metric or is not the
// script's JSON.
func TestParseOverhead(t *testing.T) {
	t.Parallel()
	var full []string
	for _, k := range overheadMetrics {
		full = append(full, `"`+k.key+`": 1.5`)
	}
	if _, err := parseOverhead("{" + strings.Join(full, ",") + "}\n"); err != nil {
		t.Errorf("every metric: %v", err)
	}
	for _, bad := range []string{"", "Traceback", "{" + strings.Join(full[1:], ",") + "}"} {
		if _, err := parseOverhead(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestOverheadRows takes each place's median over the rounds and divides
// by the host's; no gVisor figures leave its columns empty.
func TestOverheadRows(t *testing.T) {
	t.Parallel()
	got := map[string]map[string][]float64{
		"host":   {"read_64mib": {10, 30, 20}, "getpid_100k": {5, 5, 5}},
		"runc":   {"read_64mib": {22, 200, 21}, "getpid_100k": {6, 6, 6}},
		"gvisor": {"read_64mib": {40, 41, 39}},
	}
	rows := overheadRows(got)
	if len(rows) != len(overheadMetrics) {
		t.Fatalf("%d rows, want %d", len(rows), len(overheadMetrics))
	}
	byName := map[string]overheadRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	r := byName["read_64mib"]
	if r.HostMS != 20 || r.RuncMS != 22 || r.GVisorMS != 40 || math.Abs(r.RuncRatio-1.1) > 1e-9 || r.GVisorRatio != 2 {
		t.Errorf("read_64mib: %+v", r)
	}
	r = byName["getpid_100k"]
	if r.GVisorMS != 0 || r.GVisorRatio != 0 || r.RuncRatio != 1.2 {
		t.Errorf("getpid_100k without gVisor: %+v", r)
	}
}

// TestGVisorTargets judges the must-hold ratios on the paired series
// alone.
func TestGVisorTargets(t *testing.T) {
	t.Parallel()
	r := &benchResults{Scenarios: map[string]stat{
		benchHitRuncPaired: {N: 10, P50: 10}, benchHitGVisorPaired: {N: 10, P50: 19},
		benchWarmRuncPaired: {N: 10, P50: 2}, benchWarmGVisorPaired: {N: 10, P50: 4},
		"gvisor: warm 1+1 over HTTP": {N: 10, P50: 2.5},
	}}
	r.evaluate()
	want := map[string]bool{"gvisor pool hit / runc's, p50 (paired)": true, "gvisor warm 1+1 / runc's, p50 (paired)": false}
	for _, tg := range r.Targets {
		if w, ok := want[tg.What]; ok {
			if tg.Met != w {
				t.Errorf("%s: got %.2f, met %v, want %v", tg.What, tg.Got, tg.Met, w)
			}
			delete(want, tg.What)
		}
	}
	if len(want) > 0 {
		t.Errorf("targets not judged: %v", want)
	}
}

// TestWarmTraces reads the hops of the traces after the offset given,
// and nothing else of the log.
func TestWarmTraces(t *testing.T) {
	t.Parallel()
	before := `time=x level=INFO msg="execution trace" request_id=a middleware_us=999 total_us=999` + "\n"
	log := before + `time=x level=INFO msg="execution trace" request_id=b middleware_us=70 handler_us=16 engine_us=75 first_frame_us=500 kernel_us=300 agent_rest_us=400 after_us=20 reply_us=9 total_us=1000
time=x level=INFO msg="sandbox created" id=s
time=x level=INFO msg="execution trace" request_id=c middleware_us=90 handler_us=16 engine_us=75 first_frame_us=500 kernel_us=300 agent_rest_us=400 after_us=20 reply_us=9 total_us=3000
`
	path := filepath.Join(t.TempDir(), "serve.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	res := &benchResults{Breakdown: map[string]stat{}}
	warmTraces(path, int64(len(before)), "gvisor", res)
	if len(res.Breakdown) != len(traceHops) {
		t.Errorf("%d series, want %d: %v", len(res.Breakdown), len(traceHops), res.Breakdown)
	}
	if s := res.Breakdown["warm trace, gvisor: 1 middleware"]; s.N != 2 || s.Max != 0.09 {
		t.Errorf("middleware: %+v, want 2 traces, at most 0.09 ms", s)
	}
	if s := res.Breakdown["warm trace, gvisor: 9 total"]; s.N != 2 || s.Min != 1 {
		t.Errorf("total: %+v", s)
	}
}
