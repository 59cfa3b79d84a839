package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/config"
)

// gvisorBench is the second server of a run, whose sandboxes run under
// gVisor (serve --default-runtime gvisor), and the bencher driving it.
type gvisorBench struct {
	srv *benchServer
	b   *bencher
	err error // why there is none: no runsc, or a server at --url
}

// Names of the paired runc/gVisor series.
const (
	benchHitRuncPaired    = "create→print(1) pool hit, runc (paired with gvisor)"
	benchHitGVisorPaired  = "gvisor: create→print(1) pool hit (paired)"
	benchWarmRuncPaired   = "warm 1+1, runc (paired with gvisor)"
	benchWarmGVisorPaired = "gvisor: warm 1+1 (paired)"
)

// gvisorServer returns the bencher of the run's gVisor server, starting
// it the first time; nil when there can be none (a note says why).
func (b *bencher) gvisorServer(ctx context.Context, cfg config.Config) (*bencher, error) {
	if b.gv != nil {
		return b.gv.b, nil
	}
	switch {
	case cfg.RunscPath == "":
		b.gv = &gvisorBench{err: fmt.Errorf("no runsc (make setup builds it): no gVisor figures")}
	case b.instance == "":
		b.gv = &gvisorBench{err: fmt.Errorf("gVisor figures need a server the bench starts (no --url)")}
	}
	if b.gv != nil {
		b.res.Notes = append(b.res.Notes, b.gv.err.Error())
		return nil, nil
	}
	srv, err := startBenchServer(ctx, cfg, max(b.o.Pool, 1), "-gvisor", "--default-runtime", "gvisor")
	if err != nil {
		return nil, err
	}
	g := &bencher{c: client.New(srv.url, srv.key, client.WithUserAgent("sheepfold-bench")), o: b.o, instance: srv.instance,
		url: srv.url, key: srv.key, serveLog: filepath.Join(srv.dir, "serve.log"), res: &benchResults{Scenarios: map[string]stat{}, Breakdown: map[string]stat{}, Baselines: map[string]stat{}}}
	b.gv = &gvisorBench{srv: srv, b: g}
	return g, nil
}

// stopGVisor stops the run's gVisor server, if it was started.
func (b *bencher) stopGVisor() {
	if b.gv != nil && b.gv.srv != nil {
		b.gv.srv.stop()
	}
}

// gvisorRatio measures the pool hit, the pool miss (a create) and warm
// 1+1 on the run's gVisor server, records them as "gvisor: " scenarios
// and notes each one's ratio to runc's (measured first where this run
// has not yet); then the pool hit and warm 1+1 again, the two servers
// alternating, so that both see the same machine: the must-hold
// ratios (pool hit ≤ 2×, warm 1+1 ≤ 1.5×) are judged on those.
func (b *bencher) gvisorRatio(cfg config.Config) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		g, err := b.gvisorServer(ctx, cfg)
		if err != nil || g == nil {
			return err
		}
		scenarios := []struct {
			name string
			run  func(*bencher) func(context.Context) error
		}{
			{"create→print(1) pool hit", func(x *bencher) func(context.Context) error { return x.createHit }},
			{"create→print(1) pool miss", func(x *bencher) func(context.Context) error { return x.createMiss }},
			{"warm 1+1 over HTTP", func(x *bencher) func(context.Context) error { return x.warmRoundTrip }},
		}
		for _, sc := range scenarios {
			if _, ok := b.res.Scenarios[sc.name]; !ok {
				if err := sc.run(b)(ctx); err != nil {
					return fmt.Errorf("runc %s: %w", sc.name, err)
				}
			}
		}
		for _, sc := range scenarios {
			if err := sc.run(g)(ctx); err != nil {
				return fmt.Errorf("gvisor %s: %w", sc.name, err)
			}
			gs, rs := g.res.Scenarios[sc.name], b.res.Scenarios[sc.name]
			b.res.Scenarios["gvisor: "+sc.name] = gs
			b.res.order = append(b.res.order, "gvisor: "+sc.name)
			if rs.P50 > 0 {
				b.res.Notes = append(b.res.Notes, fmt.Sprintf("%s p50: gvisor %.2f ms / runc %.2f ms = %.2f×", sc.name, gs.P50, rs.P50, gs.P50/rs.P50))
			}
		}
		for k, v := range g.res.Breakdown {
			b.res.Breakdown["gvisor: "+k] = v
		}
		b.res.Notes = append(b.res.Notes, g.res.Notes...)
		g.res.Notes = nil

		hits, err := b.pairedHit(ctx, g)
		if err != nil {
			return err
		}
		b.record(benchHitRuncPaired, hits[0])
		b.record(benchHitGVisorPaired, hits[1])
		var ids [2]string
		for i, x := range []*bencher{b, g} {
			sb, err := x.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err != nil {
				return err
			}
			defer x.c.Kill(context.WithoutCancel(ctx), sb.ID)
			ids[i] = sb.ID
			if _, err := x.waitPool(ctx); err != nil {
				return err
			}
		}
		// Each server's traces of the paired warm 1+1, if it traces
		// (SHEEPFOLD_TRACE_EXECUTIONS in the bench's environment).
		fromRunc, fromGVisor := logSize(b.serveLog), logSize(g.serveLog)
		warm, err := b.pairedWarm(ctx, [2]*client.Client{b.c, g.c}, ids)
		if err != nil {
			return err
		}
		warmTraces(b.serveLog, fromRunc, "runc", b.res)
		warmTraces(g.serveLog, fromGVisor, "gvisor", b.res)
		b.record(benchWarmRuncPaired, warm[0])
		b.record(benchWarmGVisorPaired, warm[1])
		return nil
	}
}

// pairedHit measures the pool hit (create → first print(1)) on b's
// server and g's in turn, each round in the other order, both pools full
// before each, and returns the latencies of the hits (a miss is left
// out and noted).
func (b *bencher) pairedHit(ctx context.Context, g *bencher) ([2][]float64, error) {
	var ms [2][]float64
	xs := [2]*bencher{b, g}
	misses := 0
	for i := 0; i < b.o.Iterations; i++ {
		for k := range xs {
			j := k
			if i%2 == 1 {
				j = 1 - k
			}
			x := xs[j]
			for _, y := range xs { // no refill competing for the CPU
				if _, err := y.waitPool(ctx); err != nil {
					return ms, err
				}
			}
			before, err := x.c.Version(ctx)
			if err != nil {
				return ms, err
			}
			if before.Pool == nil {
				return ms, fmt.Errorf("the server at %s has no warm pool", x.url)
			}
			d, id, err := x.createFirst(ctx, nil)
			if err != nil {
				return ms, err
			}
			if err := x.c.Kill(ctx, id); err != nil {
				return ms, err
			}
			after, err := x.c.Version(ctx)
			if err != nil {
				return ms, err
			}
			if after.Pool.Hits == before.Pool.Hits+1 {
				ms[j] = append(ms[j], d.total)
			} else {
				misses++
			}
		}
	}
	if misses > 0 {
		b.res.Notes = append(b.res.Notes, fmt.Sprintf("paired pool hit, runc and gvisor: %d iterations missed and were left out", misses))
	}
	return ms, nil
}

// traceHops are the fields of the server's "execution trace" line
// (SHEEPFOLD_TRACE_EXECUTIONS; internal/server logTrace), in the order
// of an execution's way.
var traceHops = []string{"middleware_us", "handler_us", "engine_us", "first_frame_us", "kernel_us", "agent_rest_us", "after_us", "reply_us", "total_us"}

// logSize is the size of a server's log now: where the traces of what
// follows begin.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// warmTraces adds to res.Breakdown, as "warm trace, LABEL: N hop" (ms),
// the hops of the traced executions the server's log holds after offset
// from. A server that traces nothing adds nothing.
func warmTraces(serveLog string, from int64, label string, res *benchResults) {
	data, err := os.ReadFile(serveLog)
	if err != nil || from > int64(len(data)) {
		return
	}
	series := map[string][]float64{}
	for _, line := range strings.Split(string(data[from:]), "\n") {
		if !strings.Contains(line, `msg="execution trace"`) {
			continue
		}
		vals := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				vals[k] = v
			}
		}
		for i, k := range traceHops {
			if us, err := strconv.ParseInt(vals[k], 10, 64); err == nil {
				name := fmt.Sprintf("warm trace, %s: %d %s", label, i+1, strings.TrimSuffix(k, "_us"))
				series[name] = append(series[name], float64(us)/1000)
			}
		}
	}
	for name, ms := range series {
		res.Breakdown[name] = summarize(ms)
	}
}
