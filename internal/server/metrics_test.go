package server_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/server"
)

// scrape reads /metrics with key and parses it with the client library's
// text parser.
func (e *env) scrape(key string) map[string]*dto.MetricFamily {
	e.t.Helper()
	r := e.do("GET", "/metrics", key, nil)
	want(e.t, r, http.StatusOK, "")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		e.t.Fatalf("parse /metrics: %v\n%s", err, r.body)
	}
	return fams
}

// value is the value of the sample of family name whose labels include
// labels (pairs); a histogram's value is its count. Missing is 0.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	_, admin, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	want(t, e.do("GET", "/metrics", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")
	want(t, e.do("GET", "/metrics", e.keyA, nil), http.StatusForbidden, "ERR_FORBIDDEN")

	before := e.scrape(admin)
	if value(before, "sheepfold_http_requests_total", "route", "GET /metrics", "code", "403") != 1 {
		t.Fatal("the refused scrape was not counted by route and code")
	}
	if value(before, "go_goroutines") == 0 || before["process_resident_memory_bytes"] == nil {
		t.Fatal("no Go runtime or process metrics")
	}
	id := e.create(e.keyA, nil)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "1+1", "language": "python"}), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": "raise ValueError()", "language": "python"}), http.StatusOK, "")
	app := startApp(t)
	tok := e.ports(e.keyA, id, "").Token
	want(t, e.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+strconv.Itoa(app.port)+"/", "Sheepfold-Preview-Token", tok), http.StatusOK, "")
	e.bus.Emit(events.Event{Type: events.SecurityViolation, SandboxID: id, Details: map[string]any{"kind": events.KindModuleBlocked}})
	e.bus.Emit(events.Event{Type: events.ResourceExceeded, SandboxID: id, Details: map[string]any{"resource": events.ResourceMemory}})
	// Kinds are reported from inside the sandbox: a made-up one is "other",
	// never a new series.
	e.bus.Emit(events.Event{Type: events.SecurityViolation, SandboxID: id, Details: map[string]any{"kind": "made-up-by-code-1"}})

	// Counters fed by the event bus move once it has delivered.
	var after map[string]*dto.MetricFamily
	deadline := time.Now().Add(10 * time.Second)
	for {
		after = e.scrape(admin)
		// The made-up kind was emitted last; the bus delivers in order.
		if value(after, "sheepfold_security_violations_total", "kind", "other") >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the scrape: the bus delivers on its own goroutine
	}
	for _, c := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"sheepfold_sandbox_creates_total", []string{"pool", "miss", "template", "python"}, 1},
		{"sheepfold_sandbox_create_duration_seconds", []string{"pool", "miss"}, 1},
		{"sheepfold_executions_total", []string{"status", "success", "language", "python"}, 1},
		{"sheepfold_executions_total", []string{"status", "error", "language", "python"}, 1},
		{"sheepfold_execution_duration_seconds", []string{"language", "python"}, 2},
		{"sheepfold_http_requests_total", []string{"route", "POST /v1/sandboxes", "code", "201"}, 1},
		{"sheepfold_http_requests_total", []string{"route", "preview", "code", "200"}, 1},
		{"sheepfold_preview_bytes_total", []string{"direction", "in"}, 50},
		{"sheepfold_preview_bytes_total", []string{"direction", "out"}, 50},
		{"sheepfold_preview_requests_total", nil, 1},
		{"sheepfold_agent_call_duration_seconds", []string{"op", "context.execute"}, 2},
		{"sheepfold_sandboxes", []string{"state", "running"}, 1},
		{"sheepfold_security_violations_total", []string{"kind", "module_blocked"}, 1},
		{"sheepfold_resource_exceeded_total", []string{"resource", "memory"}, 1},
		{"sheepfold_oom_kills_total", nil, 1},
		{"sheepfold_security_violations_total", []string{"kind", "other"}, 1},
	} {
		if got, was := value(after, c.name, c.labels...), value(before, c.name, c.labels...); got-was < c.min {
			t.Errorf("%s%v: %v before, %v after; want it up by %v", c.name, c.labels, was, got, c.min)
		}
	}
	if value(after, "sheepfold_security_violations_total", "kind", "made-up-by-code-1") != 0 {
		t.Fatal("a kind made up inside the sandbox became a label value")
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	if v := value(e.scrape(admin), "sheepfold_sandboxes", "state", "running"); v != 0 {
		t.Fatalf("running sandboxes after the delete: %v", v)
	}
}
