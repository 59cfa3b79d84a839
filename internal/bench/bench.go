// Package bench measures Sheepfold over HTTP on loopback (latency of
// creates and warm round trips, throughput, memory density, egress) next
// to baselines taken in the same run (the host, bare runc, bwrap), and
// judges the figures against the project's targets. cmd/sheepfold only
// wires its flags (sheepfold bench).
//
// Imports: internal/engine (to open the host's engine, as serve does),
// internal/sandbox, internal/config, internal/template, internal/policy,
// internal/egress and internal/agentproto for its scenarios, internal/cgroup
// (a sandbox's memory on this host), internal/osthread (the server it
// starts has a Pdeathsig), internal/llm/llmtest (a scripted model provider for the sessions
// scenario), the Go SDK (client) to drive the server, and the standard
// library.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/cgroup"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/osthread"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/template"
)

// Options are what `sheepfold bench` sets.
type Options struct {
	URL, Key   string // an existing server; empty: start one
	Pool       int
	Iterations int           // of each latency scenario
	Warm       int           // iterations of the warm round trip
	Duration   time.Duration // of each throughput level
	Density    int           // sandboxes measured for memory
	Live       int           // live sandboxes the live scenario makes (0: not run)
	JSONOut    string        // also write the results here
	Only       string        // run only the steps whose name contains one of these comma-separated words ("" all)
	// LocalBaseline, with URL, measures the pool hit on this host's own
	// engine too (a server the bench starts), as a baseline of the
	// server at URL (a Kubernetes-backed one, say).
	LocalBaseline bool
	Version       string // of the binary, reported with the results
	// SessionTickets Black-Friday tickets go through sessions from
	// SessionClients clients at once [200, 8].
	SessionTickets int
	SessionClients int
}

// runs reports whether the step named name is to run: Only is empty, or
// one of its comma-separated words is in the name.
func (o Options) runs(name string) bool {
	if o.Only == "" {
		return true
	}
	for _, w := range strings.Split(o.Only, ",") {
		if w = strings.TrimSpace(w); w != "" && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// stat summarises one series of latencies, in milliseconds.
type stat struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	Max  float64 `json:"max_ms"`
}

func summarize(ms []float64) stat {
	if len(ms) == 0 {
		return stat{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	// Nearest rank: the smallest sample with at least p of them at or below it.
	rank := func(p float64) float64 { return s[max(0, int(math.Ceil(p*float64(len(s))))-1)] }
	var sum float64
	for _, v := range s {
		sum += v
	}
	return stat{N: len(s), P50: rank(0.50), P95: rank(0.95), P99: rank(0.99), Mean: sum / float64(len(s)), Min: s[0], Max: s[len(s)-1]}
}

func since(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

type throughputResult struct {
	Clients    int     `json:"clients"`
	Executions int     `json:"executions"`
	Errors     int     `json:"errors"`
	PerSecond  float64 `json:"executions_per_second"`
	Latency    stat    `json:"latency"`
}

type density struct {
	Sandboxes int `json:"sandboxes"`
	// Median memory charged to one idle sandbox's cgroup, in MiB.
	NoKernelMiB float64 `json:"no_kernel_mib"` // agent and init only
	PythonMiB   float64 `json:"python_mib"`    // with a started python context
	PooledMiB   float64 `json:"pooled_mib"`    // a pool member: pandas, numpy, matplotlib loaded
	// How many idle sandboxes with a python context fit in 8 GiB.
	FitIn8GiB        int `json:"fit_in_8gib"`
	FitIn8GiBPreload int `json:"fit_in_8gib_preloaded"`
}

type target struct {
	What   string  `json:"what"`
	Limit  float64 `json:"limit"`
	Got    float64 `json:"got"`
	Unit   string  `json:"unit"`
	AtMost bool    `json:"at_most"`
	Met    bool    `json:"met"`
}

type benchResults struct {
	Version   string    `json:"version"`
	Time      time.Time `json:"time"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int64     `json:"memory_mib"`
	// Load is /proc/loadavg at the start and at the end: figures taken
	// while other work ran on the machine are not comparable.
	Load       [2]string          `json:"loadavg"`
	Pool       int                `json:"pool"`
	Baselines  map[string]stat    `json:"baselines"`
	Scenarios  map[string]stat    `json:"scenarios"`
	Throughput []throughputResult `json:"throughput"`
	Bursts     []burstResult      `json:"bursts,omitempty"`
	Density    *density           `json:"density,omitempty"`
	Live       *liveResult        `json:"live,omitempty"`
	Preview    *previewResult     `json:"preview,omitempty"`
	Batches    []batchResult      `json:"batches,omitempty"`
	Targets    []target           `json:"targets"`
	Notes      []string           `json:"notes,omitempty"`
	PoolStats  *client.PoolStats  `json:"pool_stats,omitempty"`
	Breakdown  map[string]stat    `json:"breakdown,omitempty"` // the ticket's steps, the pool hit's two parts
	// Overhead is the cost of file reads and computation inside a
	// sandbox, against the host's (overhead.go).
	Overhead  []overheadRow `json:"sandbox_overhead,omitempty"`
	order     []string      // scenario print order
	baseOrder []string      // baseline print order
}

// Run runs the bench and prints its results.
func Run(ctx context.Context, cfg config.Config, o Options) error {
	if err := cfg.Resolve(); err != nil {
		return err
	}
	tmpl, err := template.Get(cfg.DataDir, "python")
	if err != nil {
		return fmt.Errorf("the python template is needed (make template): %w", err)
	}
	res := &benchResults{Version: o.Version, Time: time.Now().UTC(), CPUs: goruntime.NumCPU(), MemoryMiB: sandbox.HostMemory() >> 20,
		Baselines: map[string]stat{}, Scenarios: map[string]stat{}, Breakdown: map[string]stat{}}
	res.Load[0] = loadavg()

	// Baselines first, on a quiet machine.
	if o.runs("baselines") {
		fmt.Fprintln(os.Stderr, "bench: baselines (host, runc, bwrap)")
		if err := baselines(ctx, cfg, tmpl.Path, max(o.Iterations, 20), res); err != nil {
			return err
		}
	}

	// The egress gateway is measured in-process: its test network, which
	// maps a name to the loopback server, is never reachable from the API.
	if o.runs("egress") {
		fmt.Fprintln(os.Stderr, "bench: HTTPS GET from the host and through the egress gateway")
		if err := egressBench(ctx, cfg, max(o.Iterations, 20), res); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
	}

	url, key := o.URL, o.Key
	instance, serveLog := "", ""
	var model *llmtest.Server
	if url == "" {
		// The scripted model serves the session scenarios (sessions.go).
		prov, config, stopModel, err := modelProvider()
		if err != nil {
			return err
		}
		defer stopModel()
		srv, err := startBenchServer(ctx, cfg, o.Pool, "", "--config", config)
		if err != nil {
			return err
		}
		defer srv.stop()
		url, key, instance, model = srv.url, srv.key, srv.instance, prov
		serveLog = filepath.Join(srv.dir, "serve.log")
		res.Pool = o.Pool
	} else if key == "" {
		return errors.New("--url needs --api-key (or SHEEPFOLD_API_KEY)")
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128, IdleConnTimeout: time.Minute}}
	if o.LocalBaseline {
		if o.URL == "" {
			return errors.New("--local-baseline compares the server at --url with this host's engine")
		}
		if err := localBaseline(ctx, cfg, o, hc, res); err != nil {
			return fmt.Errorf("local baseline: %w", err)
		}
	}
	c := client.New(url, key, client.WithHTTPClient(hc), client.WithUserAgent("sheepfold-bench"))
	b := &bencher{c: c, res: res, o: o, instance: instance, model: model, url: url, key: key, serveLog: serveLog}
	defer b.stopGVisor()
	if v, err := c.Version(ctx); err != nil {
		return fmt.Errorf("server at %s: %w", url, err)
	} else if v.Pool != nil {
		res.Pool = v.Pool.Size
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"create → first print(1), pool hit", b.createHit},
		{"create → first print(1), pool miss", b.createMiss},
		{"warm 1+1", b.warmRoundTrip},
		{"warm 1+1, full policy against none", b.policyCost},
		{"warm 1+1, accounting against none", b.accountingCost(cfg)},
		{"gvisor: create, pool hit and warm 1+1 against runc", b.gvisorRatio(cfg)},
		{"inside the sandbox: file reads and compute, host, runc and gvisor", b.sandboxOverhead(cfg)},
		{"Black-Friday ticket", b.blackFriday},
		{"chat completion relay", b.relayOverhead},
		{"Black-Friday tickets via sessions", b.sessionTicketsRun},
		{"preview", b.preview},
		{"react-ts create → first page", b.reactTS(cfg)},
		{"pause and resume", b.pauseResume},
		{"pause: snapshot, start from a snapshot, fork", b.snapshotFork},
		{"throughput", b.throughput},
		{"bursts", b.burst},
		{"batch items/s", b.batches},
		{"density", b.density},
		{"live sandboxes", b.live(cfg)},
	}
	for _, st := range steps {
		if !o.runs(st.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s\n", st.name)
		if err := st.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	if v, err := c.Version(ctx); err == nil {
		res.PoolStats = v.Pool
	}
	if serveLog != "" {
		restorePhases(serveLog, res)
	}
	res.Load[1] = loadavg()
	res.evaluate()
	res.print(os.Stdout)
	if o.JSONOut != "" {
		data, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.JSONOut, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: results written to %s\n", o.JSONOut)
	}
	return nil
}

// localBaselineName is the baseline of --local-baseline; its first word
// heads its ratio column (×local).
const localBaselineName = "local engine: create→print(1) pool hit"

// localBaseline measures the pool hit on a server of this host's engine
// the bench starts (pool of at least one) and records it as a baseline.
func localBaseline(ctx context.Context, cfg config.Config, o Options, hc *http.Client, res *benchResults) error {
	fmt.Fprintln(os.Stderr, "bench: baseline: create → first print(1), pool hit, on this host's engine")
	srv, err := startBenchServer(ctx, cfg, max(o.Pool, 1), "")
	if err != nil {
		return err
	}
	defer srv.stop()
	local := &benchResults{Scenarios: map[string]stat{}, Breakdown: map[string]stat{}, Baselines: map[string]stat{}}
	lb := &bencher{c: client.New(srv.url, srv.key, client.WithHTTPClient(hc), client.WithUserAgent("sheepfold-bench")),
		res: local, o: o, instance: srv.instance, url: srv.url, key: srv.key}
	if err := lb.createHit(ctx); err != nil {
		return err
	}
	s, ok := local.Scenarios["create→print(1) pool hit"]
	if !ok || s.N == 0 {
		return errors.New("no pool hit measured on this host's engine")
	}
	res.Baselines[localBaselineName] = s
	res.baseOrder = append(res.baseOrder, localBaselineName)
	res.Notes = append(res.Notes, local.Notes...)
	return nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// baselines times `/usr/bin/python3 -c pass` on the host, in a bare runc
// container and under bwrap, both over the template's rootfs read-only.
func baselines(ctx context.Context, cfg config.Config, rootfs string, n int, res *benchResults) error {
	dir, err := os.MkdirTemp("", "sheepfold-bench-runc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, cfg.RuntimePath, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %v: %s", err, out)
	}
	specPath := filepath.Join(bundle, "config.json")
	var spec map[string]any
	data, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/usr/bin/python3", "-c", "pass"}
	if data, err = json.Marshal(spec); err != nil {
		return err
	}
	if err := os.WriteFile(specPath, data, 0o644); err != nil {
		return err
	}
	runcState := filepath.Join(dir, "state")

	bwrap, bwrapErr := exec.LookPath("bwrap")
	cmds := []struct {
		name string
		cmd  func(i int) *exec.Cmd
		skip error
	}{
		{"host python3 -c pass", func(int) *exec.Cmd { return exec.CommandContext(ctx, "/usr/bin/python3", "-c", "pass") }, nil},
		{"runc run python3 -c pass", func(i int) *exec.Cmd {
			return exec.CommandContext(ctx, cfg.RuntimePath, "--root", runcState, "run", "--bundle", bundle,
				fmt.Sprintf("sfbench-%d-%d", os.Getpid(), i))
		}, nil},
		{"bwrap python3 -c pass", func(int) *exec.Cmd {
			return exec.CommandContext(ctx, bwrap, "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev",
				"--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "--new-session", "/usr/bin/python3", "-c", "pass")
		}, bwrapErr},
	}
	for _, c := range cmds {
		if c.skip != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%s skipped: %v (scripts/setup.sh installs bubblewrap)", c.name, c.skip))
			continue
		}
		var ms []float64
		for i := -2; i < n; i++ { // two unmeasured runs warm the page cache
			cmd := c.cmd(i + 2)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			t := time.Now()
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s: %v: %s", c.name, err, out.String())
			}
			if i >= 0 {
				ms = append(ms, since(t))
			}
		}
		res.Baselines[c.name] = summarize(ms)
		res.baseOrder = append(res.baseOrder, c.name)
	}
	return nil
}

// benchServer is a `sheepfold serve` the bench started.
type benchServer struct {
	url, key, instance, dir string
	cmd                     *exec.Cmd
	done                    chan error
	stopOnce                sync.Once
	unregister              func() // from onInterrupt
}

// startBenchServer starts a server; name tells several apart (engine
// instance), args are added to its serve flags.
func startBenchServer(ctx context.Context, cfg config.Config, pool int, name string, args ...string) (*benchServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sheepfold-bench-")
	if err != nil {
		return nil, err
	}
	s := &benchServer{dir: dir, instance: fmt.Sprintf("bench-%d%s", os.Getpid(), name)}
	fail := func(err error) (*benchServer, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	if err := os.Symlink(filepath.Join(cfg.DataDir, "templates"), filepath.Join(dir, "templates")); err != nil {
		return fail(err)
	}
	env := append(os.Environ(), "SHEEPFOLD_RUNTIME="+cfg.RuntimePath, "SHEEPFOLD_AGENT="+cfg.AgentPath)
	if cfg.RunscPath != "" {
		env = append(env, "SHEEPFOLD_RUNSC="+cfg.RunscPath)
	}
	keys := exec.CommandContext(ctx, exe, "--data-dir", dir, "keys", "create", "--name", "bench")
	keys.Env = env
	out, err := keys.CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("keys create: %v: %s", err, out))
	}
	if s.key = regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out)); s.key == "" {
		return fail(fmt.Errorf("no key in %q", out))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s.url = "http://" + addr
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return fail(err)
	}
	s.cmd = exec.Command(exe, append([]string{"--data-dir", dir, "serve", "--listen", addr, "--pool", strconv.Itoa(pool),
		"--max-snapshot-pool-per-account", "1", "--instance", s.instance, "--log-format", "text"}, args...)...)
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := osthread.Kept(s.cmd.Start); err != nil { // the Pdeathsig
		logf.Close()
		return fail(err)
	}
	logf.Close()
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	s.unregister = onInterrupt(s.stop)
	for deadline := time.Now().Add(30 * time.Second); ; {
		r, err := http.Get(s.url + "/healthz")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-s.done:
			s.unregister()
			log, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("sheepfold serve exited: %v\n%s", err, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("sheepfold serve did not answer within 30s")
		}
	}
	fmt.Fprintf(os.Stderr, "bench: started sheepfold serve on %s (pool %d, data dir %s)\n", s.url, pool, dir)
	return s, nil
}

// stop shuts the server down (it destroys its sandboxes) and removes its
// data dir, once: by the bench's own defer or at a signal (interrupt.go).
func (s *benchServer) stop() {
	s.stopOnce.Do(func() {
		s.unregister()
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
			s.cmd.Process.Kill()
			<-s.done
		}
		os.RemoveAll(s.dir)
	})
}

// bencher runs the scenarios against one server.
type bencher struct {
	c        *client.Client
	res      *benchResults
	o        Options
	instance string          // the engine instance of a server the bench started
	model    *llmtest.Server // the scripted model of a server the bench started; nil otherwise
	url, key string
	// gv is the bencher of a second server whose sandboxes run under
	// gVisor, started by the first step that needs it (gvisorServer) and
	// stopped by Run.
	gv *gvisorBench
	// serveLog is the log of a server the bench started ("" otherwise).
	serveLog string
}

func (b *bencher) record(name string, ms []float64) {
	b.res.Scenarios[name] = summarize(ms)
	b.res.order = append(b.res.order, name)
}

// waitPool waits until the warm pool is full: it holds what it wants now,
// its floor and what demand added within its budget (nil: there is no
// pool).
func (b *bencher) waitPool(ctx context.Context) (*client.PoolStats, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		v, err := b.c.Version(ctx)
		if err != nil {
			return nil, err
		}
		if v.Pool == nil || v.Pool.Size == 0 {
			return nil, nil
		}
		if v.Pool.Ready >= max(v.Pool.Size*max(1, v.Pool.Nodes), v.Pool.Wanted) {
			return v.Pool, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the warm pool did not fill in 3 minutes: %+v", *v.Pool)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// missEnv makes a create unpoolable without changing its cost: the
// sandbox-wide environment is fixed at container start.
var missEnv = map[string]string{"SHEEPFOLD_BENCH": "miss"}

// firstExec is one create → first print(1), in total and in its two
// parts (ms).
type firstExec struct{ total, create, exec float64 }

func (b *bencher) createFirst(ctx context.Context, env map[string]string) (firstExec, string, error) {
	t := time.Now()
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Env: env})
	if err != nil {
		return firstExec{}, "", err
	}
	created := since(t)
	t2 := time.Now()
	ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "print(1)"})
	f := firstExec{total: since(t), create: created, exec: since(t2)}
	if err == nil && (ex.Status != client.StatusSuccess || ex.Stdout != "1\n") {
		err = fmt.Errorf("print(1): %+v", ex)
	}
	return f, sb.ID, err
}

func (b *bencher) createHit(ctx context.Context) error {
	var ms, create, exec []float64
	misses := 0
	for i := 0; i < b.o.Iterations; i++ {
		before, err := b.waitPool(ctx)
		if err != nil {
			return err
		}
		if before == nil {
			b.res.Notes = append(b.res.Notes, "the server has no warm pool: no pool-hit figures")
			return nil
		}
		d, id, err := b.createFirst(ctx, nil)
		if err != nil {
			return err
		}
		if err := b.c.Kill(ctx, id); err != nil {
			return err
		}
		after, err := b.c.Version(ctx)
		if err != nil {
			return err
		}
		if after.Pool.Hits == before.Hits+1 {
			ms, create, exec = append(ms, d.total), append(create, d.create), append(exec, d.exec)
		} else {
			misses++
		}
	}
	if misses > 0 {
		b.res.Notes = append(b.res.Notes, fmt.Sprintf("%d pool-hit iterations missed and were left out", misses))
	}
	b.record("create→print(1) pool hit", ms)
	// The hand-out and the member's first execution apart: the first
	// execution applies the sandbox's policy in an interpreter that has
	// pandas, numpy and matplotlib loaded, where anything loaded for the
	// first time costs more than in a fresh one.
	b.res.Breakdown["pool hit: create"] = summarize(create)
	b.res.Breakdown["pool hit: first print(1)"] = summarize(exec)
	return nil
}

func (b *bencher) createMiss(ctx context.Context) error {
	var ms, create, exec []float64
	for i := 0; i < b.o.Iterations; i++ {
		if _, err := b.waitPool(ctx); err != nil { // no refill competing for the CPU
			return err
		}
		d, id, err := b.createFirst(ctx, missEnv)
		if err != nil {
			return err
		}
		if err := b.c.Kill(ctx, id); err != nil {
			return err
		}
		ms, create, exec = append(ms, d.total), append(create, d.create), append(exec, d.exec)
	}
	b.record("create→print(1) pool miss", ms)
	// The container's start (create) and the interpreter's (first print).
	b.res.Breakdown["pool miss: create"] = summarize(create)
	b.res.Breakdown["pool miss: first print(1)"] = summarize(exec)
	return nil
}

func (b *bencher) warmRoundTrip(ctx context.Context) error {
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		return err
	}
	defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
	if _, err := b.waitPool(ctx); err != nil {
		return err
	}
	var ms []float64
	for i := -50; i < b.o.Warm; i++ {
		t := time.Now()
		ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1+1"})
		d := since(t)
		if err != nil {
			return err
		}
		if len(ex.Results) != 1 || ex.Results[0].Text != "2" {
			return fmt.Errorf("1+1: %+v", ex)
		}
		if i >= 0 {
			ms = append(ms, d)
		}
	}
	b.record("warm 1+1 over HTTP", ms)
	return nil
}

// benchPolicy is the full policy of the policy-cost scenario: import
// rules, no subprocess, a CPU time limit, redaction and an output cap.
var benchPolicy = map[string]any{
	"resource_limits": map[string]any{"cpu_time_seconds": 10},
	"access_control": map[string]any{"allow_subprocess": false, "allow_import_system": false,
		"allowed_imports": []string{"json", "math", "numpy", "pandas"}, "blocked_modules": []string{"os", "socket", "subprocess"}},
	"output_filtering": map[string]any{"max_output_length": 10000, "strip_sensitive_data": true, "sanitize_errors": true},
}

// Names of the policy-cost scenario's two series.
const (
	benchWarmNone   = "warm 1+1, no policy (paired)"
	benchWarmPolicy = "warm 1+1, full policy (paired)"
)

// policyCost measures warm 1+1 in a sandbox with benchPolicy and in one
// without, alternating, so that both see the same machine.
func (b *bencher) policyCost(ctx context.Context) error {
	var ids [2]string
	for i, pol := range []any{nil, benchPolicy} {
		sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{SecurityPolicy: pol})
		if err != nil {
			return err
		}
		defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
		ids[i] = sb.ID
	}
	if _, err := b.waitPool(ctx); err != nil {
		return err
	}
	ms, err := b.pairedWarm(ctx, [2]*client.Client{b.c, b.c}, ids)
	if err != nil {
		return err
	}
	b.record(benchWarmNone, ms[0])
	b.record(benchWarmPolicy, ms[1])
	return nil
}

// pairedWarm runs warm 1+1 in sandbox ids[0] through cs[0] and ids[1]
// through cs[1], alternating (after 50 unmeasured rounds each), so that
// both series see the same machine, and returns their latencies in ms.
func (b *bencher) pairedWarm(ctx context.Context, cs [2]*client.Client, ids [2]string) ([2][]float64, error) {
	var ms [2][]float64
	for i := -50; i < b.o.Warm; i++ {
		for j := range cs {
			t := time.Now()
			ex, err := cs[j].Execute(ctx, ids[j], client.ExecuteRequest{Code: "1+1"})
			d := since(t)
			if err != nil {
				return ms, err
			}
			if len(ex.Results) != 1 || ex.Results[0].Text != "2" {
				return ms, fmt.Errorf("1+1: %+v", ex)
			}
			if i >= 0 {
				ms[j] = append(ms[j], d)
			}
		}
	}
	return ms, nil
}

// Names of the accounting-cost scenario's two series.
const (
	benchWarmNoAccounting = "warm 1+1, no accounting (paired)"
	benchWarmAccounting   = "warm 1+1, accounts+limits+metering (paired)"
)

// accountingCost measures warm 1+1 on two servers the bench starts, one
// with accounts, every limit set (high enough never to refuse) and
// metering, one with --no-accounting, alternating, so that both see the
// same machine.
func (b *bencher) accountingCost(cfg config.Config) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if b.o.URL != "" {
			b.res.Notes = append(b.res.Notes, "accounting cost: needs servers the bench starts (not --url)")
			return nil
		}
		var cs [2]*client.Client
		var ids [2]string
		for i, args := range [][]string{{"--no-accounting"}, {
			"--account-max-sandboxes", "1000", "--account-requests-per-minute", "100000000",
			"--account-executions-per-minute", "100000000", "--account-monthly-executions", "100000000000",
			"--account-monthly-cpu-seconds", "100000000000", "--account-monthly-sandbox-seconds", "100000000000",
			"--account-monthly-gb-seconds", "100000000000", "--account-max-cpus", "2", "--account-max-memory-mb", "8192"}} {
			srv, err := startBenchServer(ctx, cfg, 0, fmt.Sprintf("-acct%d", i), args...)
			if err != nil {
				return err
			}
			defer srv.stop()
			hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 16, MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
			cs[i] = client.New(srv.url, srv.key, client.WithHTTPClient(hc), client.WithUserAgent("sheepfold-bench"))
			sb, err := cs[i].CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err != nil {
				return err
			}
			defer cs[i].Kill(context.WithoutCancel(ctx), sb.ID)
			ids[i] = sb.ID
		}
		ms, err := b.pairedWarm(ctx, cs, ids)
		if err != nil {
			return err
		}
		b.record(benchWarmNoAccounting, ms[0])
		b.record(benchWarmAccounting, ms[1])
		return nil
	}
}

// ordersCSV is the Black-Friday ticket's data: 5,000 orders from 8
// countries, the same in every run.
func ordersCSV() []byte {
	r := rand.New(rand.NewPCG(11, 29))
	countries := []string{"DE", "FR", "US", "GB", "JP", "BR", "IN", "ES"}
	var buf bytes.Buffer
	buf.WriteString("order_id,country,amount,items\n")
	for i := 1; i <= 5000; i++ {
		fmt.Fprintf(&buf, "%d,%s,%.2f,%d\n", i, countries[r.IntN(len(countries))], 5+r.Float64()*495, 1+r.IntN(6))
	}
	return buf.Bytes()
}

const blackFridayCode = `import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("orders.csv")
by_country = df.groupby("country").sum()
by_country["amount"].plot(kind="bar", title="Black Friday revenue by country")
by_country`

func (b *bencher) ticket(ctx context.Context, csv []byte, env map[string]string) (total, create, upload, exec float64, err error) {
	t := time.Now()
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Env: env})
	if err != nil {
		return
	}
	defer func() {
		if kerr := b.c.Kill(context.WithoutCancel(ctx), sb.ID); err == nil {
			err = kerr
		}
	}()
	create = since(t)
	t1 := time.Now()
	if _, err = b.c.WriteFile(ctx, sb.ID, "orders.csv", bytes.NewReader(csv)); err != nil {
		return
	}
	upload = since(t1)
	t2 := time.Now()
	ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: blackFridayCode})
	if err != nil {
		return
	}
	exec = since(t2)
	total = since(t)
	var png, table bool
	for _, r := range ex.Results {
		png = png || r.PNG != ""
		table = table || (r.IsMainResult && strings.Contains(r.Text, "amount"))
	}
	if ex.Status != client.StatusSuccess || !png || !table {
		err = fmt.Errorf("the ticket did not produce its table and chart: status %s, error %+v, %d results", ex.Status, ex.Error, len(ex.Results))
	}
	return
}

func (b *bencher) blackFriday(ctx context.Context) error {
	csv := ordersCSV()
	run := func(name string, n int, env map[string]string) error {
		var total, create, upload, exec []float64
		for i := 0; i < n; i++ {
			if _, err := b.waitPool(ctx); err != nil {
				return err
			}
			tt, c, u, e, err := b.ticket(ctx, csv, env)
			if err != nil {
				return err
			}
			total, create, upload, exec = append(total, tt), append(create, c), append(upload, u), append(exec, e)
		}
		b.record(name, total)
		b.res.Breakdown[name+": create"] = summarize(create)
		b.res.Breakdown[name+": upload orders.csv"] = summarize(upload)
		b.res.Breakdown[name+": execute"] = summarize(exec)
		return nil
	}
	if b.res.Pool > 0 {
		if err := run("Black-Friday ticket, pool hit", b.o.Iterations, nil); err != nil {
			return err
		}
	}
	return run("Black-Friday ticket, pool miss", min(b.o.Iterations, 5), missEnv)
}

func (b *bencher) throughput(ctx context.Context) error {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.c.Kill(context.WithoutCancel(ctx), id)
		}
	}()
	for _, clients := range []int{2, 8, 32} {
		for len(ids) < clients {
			sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err != nil {
				return err
			}
			ids = append(ids, sb.ID)
			if _, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1"}); err != nil {
				return err
			}
		}
		if _, err := b.waitPool(ctx); err != nil {
			return err
		}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			lat      []float64
			errCount atomic.Int64
		)
		stop := time.Now().Add(b.o.Duration)
		start := time.Now()
		for i := 0; i < clients; i++ {
			wg.Go(func() {
				var mine []float64
				for time.Now().Before(stop) {
					t := time.Now()
					ex, err := b.c.Execute(ctx, ids[i], client.ExecuteRequest{Code: "1+1"})
					if err != nil || len(ex.Results) != 1 {
						errCount.Add(1)
						continue
					}
					mine = append(mine, since(t))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		b.res.Throughput = append(b.res.Throughput, throughputResult{Clients: clients, Executions: len(lat),
			Errors: int(errCount.Load()), PerSecond: float64(len(lat)) / elapsed, Latency: summarize(lat)})
	}
	return nil
}

// cgroupMemory reads the memory charged to a sandbox's cgroup on this host.
func cgroupMemory(instance, id string) (int64, error) {
	parents := []string{"*"}
	if instance != "" {
		parents = []string{instance}
	}
	for _, p := range parents {
		for _, pat := range []string{
			filepath.Join("/sys/fs/cgroup/memory/sheepfold", p, id, "memory.usage_in_bytes"), // v1
			filepath.Join("/sys/fs/cgroup/sheepfold", p, id, "memory.current"),               // v2
		} {
			matches, _ := filepath.Glob(pat)
			for _, m := range matches {
				n, err := cgroup.Int(m)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				return n, err
			}
		}
	}
	return 0, fmt.Errorf("no cgroup of sandbox %s on this host", id)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (b *bencher) density(ctx context.Context) error {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.c.Kill(context.WithoutCancel(ctx), id)
		}
	}()
	const mib = 1 << 20
	settle := func() { time.Sleep(1500 * time.Millisecond) }
	read := func(id string) (float64, error) {
		n, err := cgroupMemory(b.instance, id)
		return float64(n) / mib, err
	}
	// Misses (no preload), then the python context started.
	var bare, py []float64
	for i := 0; i < b.o.Density; i++ {
		if _, err := b.waitPool(ctx); err != nil {
			return err
		}
		sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Env: missEnv})
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
	}
	settle()
	for _, id := range ids {
		m, err := read(id)
		if err != nil {
			b.res.Notes = append(b.res.Notes, "density not measured: "+err.Error())
			return nil
		}
		bare = append(bare, m)
		if _, err := b.c.Execute(ctx, id, client.ExecuteRequest{Code: "1"}); err != nil {
			return err
		}
	}
	settle()
	for _, id := range ids {
		m, err := read(id)
		if err != nil {
			return err
		}
		py = append(py, m)
	}
	// Pool members at hand-out.
	var pooled []float64
	if b.res.Pool > 0 {
		for i := 0; i < min(b.o.Density, 4); i++ {
			if _, err := b.waitPool(ctx); err != nil {
				return err
			}
			sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err != nil {
				return err
			}
			ids = append(ids, sb.ID)
			m, err := read(sb.ID)
			if err != nil {
				return err
			}
			pooled = append(pooled, m)
		}
	}
	d := &density{Sandboxes: len(bare), NoKernelMiB: median(bare), PythonMiB: median(py), PooledMiB: median(pooled)}
	if d.PythonMiB > 0 {
		d.FitIn8GiB = int(8192 / d.PythonMiB)
	}
	if d.PooledMiB > 0 {
		d.FitIn8GiBPreload = int(8192 / d.PooledMiB)
	}
	b.res.Density = d
	return nil
}

// evaluate checks the figures against the targets of issue 6.
func (r *benchResults) evaluate() {
	add := func(what string, got, limit float64, unit string, atMost bool) {
		met := got <= limit
		if !atMost {
			met = got >= limit
		}
		r.Targets = append(r.Targets, target{What: what, Limit: limit, Got: got, Unit: unit, AtMost: atMost, Met: met})
	}
	if s, ok := r.Scenarios["create→print(1) pool hit"]; ok && s.N > 0 {
		add("create→print(1) pool hit p50", s.P50, 30, "ms", true)
	}
	if s, ok := r.Scenarios["create→print(1) pool miss"]; ok {
		add("create→print(1) pool miss p50", s.P50, 150, "ms", true)
	}
	if s, ok := r.Scenarios[benchReactMiss]; ok {
		add(benchReactMiss+" p50", s.P50, 2000, "ms", true)
	}
	if s, ok := r.Scenarios["warm 1+1 over HTTP"]; ok {
		add("warm 1+1 p50", s.P50, 3, "ms", true)
		add("warm 1+1 p99", s.P99, 10, "ms", true)
	}
	// Issue 32's must-hold ratios, on the paired series (gvisor.go).
	if rs, gs := r.Scenarios[benchHitRuncPaired], r.Scenarios[benchHitGVisorPaired]; rs.P50 > 0 && gs.N > 0 {
		add("gvisor pool hit / runc's, p50 (paired)", gs.P50/rs.P50, 2, "×", true)
	}
	if rs, gs := r.Scenarios[benchWarmRuncPaired], r.Scenarios[benchWarmGVisorPaired]; rs.P50 > 0 && gs.N > 0 {
		add("gvisor warm 1+1 / runc's, p50 (paired)", gs.P50/rs.P50, 1.5, "×", true)
	}
	if s, ok := r.Scenarios["Black-Friday ticket, pool hit"]; ok {
		add("Black-Friday ticket p50", s.P50, 150, "ms", true)
	}
	if s, ok := r.Scenarios[benchSessionBF]; ok {
		add("Black-Friday ticket via a session, Sheepfold's own time p50", s.P50, 150, "ms", true)
	}
	if d, ok := r.Scenarios[benchChatDirect]; ok {
		if rl, ok := r.Scenarios[benchChatRelayed]; ok {
			add("chat completion through Sheepfold − direct, p50", rl.P50-d.P50, 2, "ms", true)
		}
	}
	if h, ok := r.Scenarios[benchHTTPSHost]; ok {
		if g, ok := r.Scenarios[benchHTTPSGateway]; ok {
			add("HTTPS GET via gateway − from host, p50", g.P50-h.P50, 2, "ms", true)
		}
	}
	if p, ok := r.Scenarios[benchHTTPNoRule]; ok {
		if i, ok := r.Scenarios[benchHTTPInject]; ok {
			add("HTTP GET with a secret-injecting rule − without, p50", i.P50-p.P50, 2, "ms", true)
		}
	}
	if g, ok := r.Scenarios[benchHTTPSGateway]; ok {
		if i, ok := r.Scenarios[benchHTTPSInject]; ok {
			add("HTTPS GET with a secret-injecting rule (TLS terminated) − without, p50", i.P50-g.P50, 2, "ms", true)
		}
	}
	for _, b := range r.Bursts {
		if b.N == 30 && !b.Again {
			add("30 creates at once → first result, p50", b.Latency.P50, 1000, "ms", true)
			add("30 creates at once, creates/s", b.PerSecond, 30, "/s", false)
		}
	}
	if s, ok := r.Scenarios[benchResume]; ok {
		add("resume → first result, pandas loaded, p50", s.P50, 150, "ms", true)
	}
	if s, ok := r.Scenarios[benchFromSnapshot]; ok {
		add("start from a snapshot → first result, pandas loaded, p50", s.P50, 100, "ms", true)
	}
	if s, ok := r.Scenarios[benchFromPool]; ok {
		add("start from a pooled snapshot → first result, pandas loaded, p50", s.P50, 100, "ms", true)
	}
	if s, ok := r.Scenarios[benchFork4]; ok {
		add("fork of 4, pandas loaded, p50", s.P50, 500, "ms", true)
	}
	if n, ok := r.Scenarios[benchWarmNone]; ok {
		if p, ok := r.Scenarios[benchWarmPolicy]; ok {
			add("warm 1+1 full policy − none, p50", p.P50-n.P50, 0.3, "ms", true)
		}
	}
	if n, ok := r.Scenarios[benchWarmNoAccounting]; ok {
		if a, ok := r.Scenarios[benchWarmAccounting]; ok {
			add("warm 1+1 accounting − none, p50", a.P50-n.P50, 0.2, "ms", true)
		}
	}
	for _, t := range r.Throughput {
		if t.Clients == 8 {
			add("executions/s at 8 clients", t.PerSecond, 300, "/s", false)
		}
	}
	if p := r.Preview; p != nil {
		add("preview GET − direct, p50", p.Proxied.P50-p.Direct.P50, 1, "ms", true)
		add("preview GETs/s", p.ProxiedRPS, 2000, "/s", false)
	}
	if l := r.Live; l != nil && l.Sandboxes >= 500 {
		add("1+1 among 500 live sandboxes, p99", l.Latency.P99, 100, "ms", true)
	}
	if r.Density != nil {
		add("idle sandbox without its kernel", r.Density.NoKernelMiB, 30, "MiB", true)
	}
}

func (r *benchResults) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "sheepfold bench %s, %s, %d CPUs, %d MiB, warm pool %d, load %s at start, %s at end\n\n",
		r.Version, r.Time.Format(time.RFC3339), r.CPUs, r.MemoryMiB, r.Pool, r.Load[0], r.Load[1])
	fmt.Fprintln(tw, "baseline\tn\tp50 ms\tp95 ms\tp99 ms\t")
	for _, name := range r.baseOrder {
		s := r.Baselines[name]
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", name, s.N, s.P50, s.P95, s.P99)
	}
	tw.Flush()
	fmt.Fprintln(w)
	hdr := "scenario\tn\tp50 ms\tp95 ms\tp99 ms\t"
	for _, name := range r.baseOrder {
		hdr += "×" + strings.Fields(name)[0] + "\t"
	}
	fmt.Fprintln(tw, hdr)
	row := func(name string, s stat) {
		line := fmt.Sprintf("%s\t%d\t%.2f\t%.2f\t%.2f\t", name, s.N, s.P50, s.P95, s.P99)
		for _, bn := range r.baseOrder {
			if b := r.Baselines[bn]; b.P50 > 0 {
				line += fmt.Sprintf("%.2f\t", s.P50/b.P50)
			}
		}
		fmt.Fprintln(tw, line)
	}
	for _, name := range r.order {
		row(name, r.Scenarios[name])
	}
	tw.Flush()
	fmt.Fprintln(w, "  (×host, ×runc, ×bwrap, ×local: p50 over the baseline's p50)")
	if len(r.Breakdown) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "step\tn\tp50 ms\tp95 ms\tp99 ms\t")
		keys := make([]string, 0, len(r.Breakdown))
		for k := range r.Breakdown {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			s := r.Breakdown[k]
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", k, s.N, s.P50, s.P95, s.P99)
		}
		tw.Flush()
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "clients\texecutions/s\tp50 ms\tp99 ms\terrors\t")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%d\t\n", t.Clients, t.PerSecond, t.Latency.P50, t.Latency.P99, t.Errors)
		}
		tw.Flush()
	}
	printOverhead(w, r.Overhead)
	printBursts(w, r.Bursts)
	if d := r.Density; d != nil {
		fmt.Fprintf(w, "\nmemory per idle sandbox (cgroup, median of %d): %.1f MiB without a kernel, %.1f MiB with python, %.1f MiB as a pool member (pandas, numpy, matplotlib)\n",
			d.Sandboxes, d.NoKernelMiB, d.PythonMiB, d.PooledMiB)
		fmt.Fprintf(w, "idle sandboxes in 8 GiB: %d with python, %d preloaded\n", d.FitIn8GiB, d.FitIn8GiBPreload)
	}
	printLive(w, r.Live)
	if p := r.Preview; p != nil {
		fmt.Fprintf(w, "\npreview: %d clients: %.0f GETs/s through the preview (%d errors), %.0f/s direct inside the sandbox\n",
			p.Clients, p.ProxiedRPS, p.Errors, p.DirectRPS)
	}
	printBatches(w, r.Batches)
	if p := r.PoolStats; p != nil {
		fmt.Fprintf(w, "warm pool: size %d, %d hits, %d misses\n", p.Size, p.Hits, p.Misses)
	}
	fmt.Fprintln(w)
	for _, t := range r.Targets {
		verdict := "met"
		if !t.Met {
			verdict = "MISSED"
		}
		op := "≤"
		if !t.AtMost {
			op = "≥"
		}
		fmt.Fprintf(w, "target %-36s %s %g %s: got %.2f %s\n", t.What, op, t.Limit, t.Unit, t.Got, verdict)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}
