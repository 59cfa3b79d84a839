package bench

import (
	"context"
	"testing"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestEgressBench runs the bench's egress scenario: the same HTTPS GETs
// from the host and from a sandbox through the gateway. It checks that
// both work and logs the figures; the 2 ms budget is judged by the bench.
func TestEgressBench(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.TemplateRootFS(t, "python")
	cfg := config.Config{DataDir: testutil.DataDir(), RuntimePath: testutil.Runc(t), AgentPath: testutil.AgentBin(t)}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	res := &benchResults{Scenarios: map[string]stat{}}
	if err := egressBench(context.Background(), cfg, 30, res); err != nil {
		t.Fatal(err)
	}
	h, g := res.Scenarios[benchHTTPSHost], res.Scenarios[benchHTTPSGateway]
	if h.N != 30 || g.N != 30 {
		t.Fatalf("samples: host %d, gateway %d", h.N, g.N)
	}
	t.Logf("p50: host %.2f ms, gateway %.2f ms (+%.2f ms); p99: host %.2f ms, gateway %.2f ms", h.P50, g.P50, g.P50-h.P50, h.P99, g.P99)
	tl := res.Scenarios[benchHTTPSInject]
	if tl.N != 30 {
		t.Fatalf("samples: TLS terminated %d", tl.N)
	}
	t.Logf("HTTPS p50: no rule %.2f ms, injecting rule with TLS terminated %.2f ms (%+.2f ms); p99: %.2f ms", g.P50, tl.P50, tl.P50-g.P50, tl.P99)
	p, i := res.Scenarios[benchHTTPNoRule], res.Scenarios[benchHTTPInject]
	if p.N != 30 || i.N != 30 {
		t.Fatalf("samples: no rule %d, injecting rule %d", p.N, i.N)
	}
	t.Logf("plain HTTP p50: no rule %.2f ms, injecting rule %.2f ms (%+.2f ms, ×%.2f); p99: %.2f ms, %.2f ms", p.P50, i.P50, i.P50-p.P50, i.P50/p.P50, p.P99, i.P99)
}
