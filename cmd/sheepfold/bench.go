package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/bench"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// benchCmd wires the flags of `sheepfold bench`; the harness is
// internal/bench.
func benchCmd(cfg *config.Config) *cobra.Command {
	o := bench.Options{Pool: sandbox.DefaultPoolSize(), Version: version}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox latency, throughput and density against host, runc and bwrap baselines",
		Long: `Measure Sheepfold over HTTP on loopback, next to baselines measured in the same
run: /usr/bin/python3 -c pass on the host, the same in a bare runc container and
under bwrap (both over the python template's root filesystem, read-only).

By default it starts this binary's ` + "`sheepfold serve`" + ` on a free loopback port with a
fresh temporary data dir (the templates of --data-dir linked in, its own engine
instance so that it never touches another server's sandboxes), and stops it at
the end. --url and --api-key measure a running server instead (memory density
is then read only if its cgroups are on this host).

Scenarios: create → first print(1) from the warm pool (hit) and without it
(miss: a sandbox-wide env var makes the request unpoolable); a warm 1+1 round
trip, and the same alternating between a sandbox with a full security policy
and one without; the Black-Friday ticket (upload orders.csv, pandas groupby, one chart) in
a fresh sandbox; a warm 1+1 on a server with accounts, limits and metering
against one with --no-accounting, alternating; a chat completion sent to the scripted model directly and
through the server's /v1/chat/completions, alternating (the relay's overhead); the Black-Friday
tickets of examples/black_friday.py through sessions (--session-tickets by --session-clients
clients at once; Sheepfold's own time per ticket, the model's excluded); executions per second with 2, 8 and 32 clients (one sandbox
each); a batch of 1,000 len(item) items at concurrency 8, in fresh sandboxes and with
reuse "worker" (items/s); memory of idle sandboxes; with --live N, N live sandboxes
and 1+1 in each of them while the others sit idle; where runsc is set up, the pool hit, the
pool miss and warm 1+1 on a second server whose sandboxes run under gVisor, then the pool
hit and warm 1+1 alternating between the two servers (the ratios judged); the cost inside a
sandbox (a 64 MiB file written and read back, 2,000 small files stat'ed and read, a pure
Python loop, os.getpid(), time.time() and os.stat() in loops) on the host, in a runc and in
a gVisor sandbox, as ratios to the host's. With SHEEPFOLD_TRACE_EXECUTIONS=1 the servers
trace the paired warm 1+1 and the breakdown shows each hop under each runtime. Hit scenarios wait for the pool to be full
before each iteration, so they measure a hit, not the refill.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.Run(cmd.Context(), *cfg, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URL, "url", "", "measure the server at this URL instead of starting one")
	f.StringVar(&o.Key, "api-key", os.Getenv("SHEEPFOLD_API_KEY"), "API key for --url (env SHEEPFOLD_API_KEY)")
	f.IntVar(&o.Pool, "pool", o.Pool, "warm pool size of the server the bench starts")
	f.IntVarP(&o.Iterations, "iterations", "n", 30, "iterations of each create and ticket scenario")
	f.IntVar(&o.Warm, "warm", 1000, "iterations of the warm 1+1 round trip")
	f.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each throughput level")
	f.IntVar(&o.Density, "density", 8, "idle sandboxes whose memory is measured")
	f.IntVar(&o.Live, "live", 0, "live sandboxes (128 MiB, 16 MiB of disk, a Python context each) made on a server of their own, then 1+1 timed in each while the others sit idle, with the server's and the host's memory per sandbox (0: not run; issue 35's target is 500)")
	f.StringVar(&o.JSONOut, "json", "", "also write the results to this file as JSON")
	f.IntVar(&o.SessionTickets, "session-tickets", 200, "Black-Friday tickets sent through sessions")
	f.IntVar(&o.SessionClients, "session-clients", 8, "clients sending them at once, each with its own session")
	f.BoolVar(&o.LocalBaseline, "local-baseline", false, "with --url: also measure the pool hit on this host's own engine (a server the bench starts) as a baseline (×local), e.g. for a Kubernetes-backed server")
	f.StringVar(&o.Only, "only", "", `run only the steps whose name contains one of these comma-separated words ("policy", "warm", "egress", "baselines,pool"...)`)
	return cmd
}
