package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/config"
)

// The cost of running inside a sandbox, apart from reaching it: one
// Python script (overheadScript) times file reads and computation in
// the interpreter itself, on the host, in a runc sandbox and in a gVisor
// one, alternating, and each figure is divided by the host's. Under
// gVisor every system call goes through the Sentry (systrap: a signal
// and two context switches) and every file it opens through its gofer or
// directfs, so the syscall-heavy and small-file figures show the price
// of its second wall; the pure Python loop shows that code making no
// system calls pays none.

// overheadScript runs the micro-benchmarks in the directory work (a
// Python string literal is prepended) and prints one JSON object: each
// benchmark's median over its repetitions, in ms. The 64 MiB file is
// written first and read back (from the page cache: what a re-read
// costs; the write is timed once), the small-file tree is 2,000 files of
// 1 KiB in 20 directories, walked, each stat'ed, opened and read.
const overheadScript = `
import json, os, shutil, time
def _bench(work):
    reps = 5
    base = os.path.join(work, "sheepfold-overhead")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    out = {}
    def med(f):
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t) * 1000)
        ts.sort()
        return ts[len(ts) // 2]
    big = os.path.join(base, "big")
    chunk = b"\x5a" * (1 << 20)
    t = time.perf_counter()
    with open(big, "wb") as f:
        for _ in range(64):
            f.write(chunk)
    out["write_64mib"] = (time.perf_counter() - t) * 1000
    def read_big():
        with open(big, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
    out["read_64mib"] = med(read_big)
    one = b"x" * 1024
    for d in range(20):
        p = os.path.join(base, "t", str(d))
        os.makedirs(p)
        for i in range(100):
            with open(os.path.join(p, str(i)), "wb") as f:
                f.write(one)
    tree = os.path.join(base, "t")
    def walk_stat():
        for root, dirs, files in os.walk(tree):
            for n in files:
                os.stat(os.path.join(root, n))
    out["stat_2000_files"] = med(walk_stat)
    def walk_read():
        for root, dirs, files in os.walk(tree):
            for n in files:
                with open(os.path.join(root, n), "rb") as f:
                    f.read()
    out["open_read_2000_files"] = med(walk_read)
    def loop():
        s = 0
        for i in range(2000000):
            s += i * i
    out["python_loop_2m"] = med(loop)
    def getpid():
        g = os.getpid
        for _ in range(100000):
            g()
    out["getpid_100k"] = med(getpid)
    def clock():
        c = time.time
        for _ in range(100000):
            c()
    out["time_100k"] = med(clock)
    def stat_one():
        s = os.stat
        for _ in range(20000):
            s(big)
    out["stat_20k"] = med(stat_one)
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out))
_bench(WORK)
`

// overheadMetrics are the script's figures in print order, with what
// each measures.
var overheadMetrics = []struct{ key, what string }{
	{"write_64mib", "write a 64 MiB file (1 MiB writes)"},
	{"read_64mib", "read it back (1 MiB reads, page cache)"},
	{"stat_2000_files", "walk and stat 2,000 small files"},
	{"open_read_2000_files", "walk, open and read 2,000 1 KiB files"},
	{"python_loop_2m", "pure Python loop, 2M iterations"},
	{"getpid_100k", "os.getpid() ×100k (a system call each)"},
	{"time_100k", "time.time() ×100k (vDSO on the host)"},
	{"stat_20k", "os.stat() of one file ×20k"},
}

// overheadRow is one micro-benchmark's medians (ms) and ratios.
type overheadRow struct {
	Name        string  `json:"name"`
	What        string  `json:"what"`
	HostMS      float64 `json:"host_ms"`
	RuncMS      float64 `json:"runc_ms"`
	GVisorMS    float64 `json:"gvisor_ms,omitempty"`
	RuncRatio   float64 `json:"runc_over_host"`
	GVisorRatio float64 `json:"gvisor_over_host,omitempty"`
}

// overheadRounds is how many times each place runs the script.
const overheadRounds = 3

// sandboxOverhead runs overheadScript on the host, in a runc sandbox of
// the bench's server and, where runsc is configured, in a gVisor sandbox
// of the bench's gVisor server, round by round in turn, and records the
// median of each figure over the rounds next to its ratio to the host's.
func (b *bencher) sandboxOverhead(cfg config.Config) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		type place struct {
			name string
			run  func(context.Context) (map[string]float64, error)
		}
		places := []place{{"host", hostOverhead}}
		rc, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			return err
		}
		defer b.c.Kill(context.WithoutCancel(ctx), rc.ID)
		places = append(places, place{"runc", sandboxOverheadRun(b.c, rc.ID)})
		g, err := b.gvisorServer(ctx, cfg)
		if err != nil {
			return err
		}
		if g != nil {
			gs, err := g.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err != nil {
				return err
			}
			defer g.c.Kill(context.WithoutCancel(ctx), gs.ID)
			places = append(places, place{"gvisor", sandboxOverheadRun(g.c, gs.ID)})
		}
		got := map[string]map[string][]float64{}
		for r := 0; r < overheadRounds; r++ {
			for i := range places {
				p := places[(i+r)%len(places)] // each place first once
				m, err := p.run(ctx)
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				if got[p.name] == nil {
					got[p.name] = map[string][]float64{}
				}
				for k, v := range m {
					got[p.name][k] = append(got[p.name][k], v)
				}
			}
		}
		b.res.Overhead = overheadRows(got)
		return nil
	}
}

// overheadRows turns each place's figures (per metric, one per round)
// into rows of medians and ratios to the host's.
func overheadRows(got map[string]map[string][]float64) []overheadRow {
	median := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var rows []overheadRow
	for _, m := range overheadMetrics {
		row := overheadRow{Name: m.key, What: m.what, HostMS: median(got["host"][m.key]),
			RuncMS: median(got["runc"][m.key]), GVisorMS: median(got["gvisor"][m.key])}
		if row.HostMS > 0 {
			row.RuncRatio = row.RuncMS / row.HostMS
			row.GVisorRatio = row.GVisorMS / row.HostMS
		}
		rows = append(rows, row)
	}
	return rows
}

// scriptFor is overheadScript working in dir.
func scriptFor(dir string) string {
	q, _ := json.Marshal(dir) // a JSON string is a Python string literal
	return "WORK = " + string(q) + "\n" + overheadScript
}

// parseOverhead reads the script's one JSON line and checks that it
// holds every metric.
func parseOverhead(out string) (map[string]float64, error) {
	var m map[string]float64
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &m); err != nil {
		return nil, fmt.Errorf("the script's output %q: %w", out, err)
	}
	for _, k := range overheadMetrics {
		if _, ok := m[k.key]; !ok {
			return nil, fmt.Errorf("the script's output %q has no %s", out, k.key)
		}
	}
	return m, nil
}

// hostOverhead runs the script with the host's /usr/bin/python3 in a
// directory of its own.
func hostOverhead(ctx context.Context) (map[string]float64, error) {
	dir, err := os.MkdirTemp("", "sheepfold-bench-overhead-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-c", scriptFor(dir))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("python3: %v: %s", err, stderr.String())
	}
	return parseOverhead(stdout.String())
}

// sandboxOverheadRun runs the script in sandbox id, in its home (the
// sandbox's writable layer).
func sandboxOverheadRun(c *client.Client, id string) func(context.Context) (map[string]float64, error) {
	return func(ctx context.Context) (map[string]float64, error) {
		ex, err := c.Execute(ctx, id, client.ExecuteRequest{Code: scriptFor("/home/user"), Timeout: 5 * time.Minute})
		if err != nil {
			return nil, err
		}
		if ex.Status != client.StatusSuccess {
			return nil, fmt.Errorf("the script: %s %+v: %s", ex.Status, ex.Error, ex.Stderr)
		}
		return parseOverhead(ex.Stdout)
	}
}

func printOverhead(w io.Writer, rows []overheadRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "inside the sandbox (median ms)\thost\trunc\tgvisor\trunc ×host\tgvisor ×host\t")
	for _, r := range rows {
		g, gr := "-", "-"
		if r.GVisorMS > 0 {
			g, gr = fmt.Sprintf("%.2f", r.GVisorMS), fmt.Sprintf("%.2f", r.GVisorRatio)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%s\t%.2f\t%s\t\n", r.What, r.HostMS, r.RuncMS, g, r.RuncRatio, gr)
	}
	tw.Flush()
}
