package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/config"
)

// Live sandboxes (issue 35's density target: 500 live Python sandboxes
// on a 24 GiB machine, each answering 1+1 at p99 ≤ 100 ms while the
// others sit idle, and the server's own memory per sandbox).

// liveResult is the live-sandboxes scenario's figures.
type liveResult struct {
	Sandboxes int `json:"sandboxes"`
	// CreateSeconds is how long making them all took (liveCreators at
	// once, each to its first 1+1).
	CreateSeconds float64 `json:"create_seconds"`
	// Latency is 1+1 in each live sandbox once, in random order, one at
	// a time, while the others sit idle.
	Latency stat `json:"latency"`
	// ServerKiB is the server's own resident memory per live sandbox
	// (its growth over the run, divided); HostMiB the host's memory
	// (MemAvailable's fall) per live sandbox.
	ServerKiB float64 `json:"server_kib_per_sandbox"`
	HostMiB   float64 `json:"host_mib_per_sandbox"`
}

// liveCreators is how many creates the scenario has in flight at once.
const liveCreators = 4

// liveResources are each live sandbox's: small, so that hundreds fit
// the server's admission (memory limits up to --overcommit × the host's
// memory) and the disk (each sandbox's is allocated whole).
var liveResources = client.Resources{MemoryMB: 128, DiskMB: 16}

// live starts a server of its own (no pool, room for b.o.Live sandboxes),
// makes b.o.Live sandboxes each with a started Python context, then
// times 1+1 in each of them once while the others sit idle.
func (b *bencher) live(cfg config.Config) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		n := b.o.Live
		if n <= 0 {
			b.res.Notes = append(b.res.Notes, "live sandboxes: not run (--live N)")
			return nil
		}
		if b.o.URL != "" {
			b.res.Notes = append(b.res.Notes, "live sandboxes: needs a server the bench starts (not --url)")
			return nil
		}
		room := strconv.Itoa(n + 8)
		srv, err := startBenchServer(ctx, cfg, 0, "-live", "--max-sandboxes", room, "--account-max-sandboxes", room,
			"--account-requests-per-minute", "100000000", "--account-executions-per-minute", "100000000",
			"--account-max-memory-mb", strconv.Itoa((n+8)*int(liveResources.MemoryMB)), "--overcommit", "8")
		if err != nil {
			return err
		}
		defer srv.stop()
		c := client.New(srv.url, srv.key, client.WithUserAgent("sheepfold-bench"))
		rss0, err := residentKiB(srv.cmd.Process.Pid)
		if err != nil {
			return err
		}
		avail0, err := memAvailableMiB()
		if err != nil {
			return err
		}

		var mu sync.Mutex
		var ids []string
		defer func() {
			for _, id := range ids {
				c.Kill(context.WithoutCancel(ctx), id)
			}
		}()
		began := time.Now()
		work := make(chan struct{})
		errs := make(chan error, liveCreators)
		var wg sync.WaitGroup
		for range liveCreators {
			wg.Go(func() {
				for range work {
					sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Resources: &liveResources})
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					ids = append(ids, sb.ID)
					mu.Unlock()
					if _, err := exec1(ctx, c, sb.ID); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		var createErr error
	feed:
		for i := 0; i < n; i++ {
			select {
			case work <- struct{}{}:
			case createErr = <-errs:
				break feed
			}
		}
		close(work)
		wg.Wait()
		if createErr == nil {
			select {
			case createErr = <-errs:
			default:
			}
		}
		if createErr != nil {
			return fmt.Errorf("live sandbox %d of %d: %w", len(ids), n, createErr)
		}
		res := liveResult{Sandboxes: n, CreateSeconds: time.Since(began).Seconds()}

		var ms []float64
		for _, i := range rand.Perm(len(ids)) {
			d, err := exec1(ctx, c, ids[i])
			if err != nil {
				return fmt.Errorf("1+1 among %d live sandboxes: %w", n, err)
			}
			ms = append(ms, d)
		}
		res.Latency = summarize(ms)
		if rss, err := residentKiB(srv.cmd.Process.Pid); err == nil {
			res.ServerKiB = float64(rss-rss0) / float64(n)
		}
		if avail, err := memAvailableMiB(); err == nil {
			res.HostMiB = float64(avail0-avail) / float64(n)
		}
		b.res.Live = &res
		return nil
	}
}

// exec1 runs 1+1 in sandbox id and returns its round trip in ms.
func exec1(ctx context.Context, c *client.Client, id string) (float64, error) {
	t := time.Now()
	ex, err := c.Execute(ctx, id, client.ExecuteRequest{Code: "1+1"})
	d := since(t)
	if err != nil {
		return 0, err
	}
	if len(ex.Results) != 1 || ex.Results[0].Text != "2" {
		return 0, fmt.Errorf("1+1: %+v", ex)
	}
	return d, nil
}

// residentKiB reads a process's VmRSS.
func residentKiB(pid int) (int64, error) {
	return procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
}

// memAvailableMiB reads the host's MemAvailable.
func memAvailableMiB() (int64, error) {
	kib, err := procField("/proc/meminfo", "MemAvailable:")
	return kib >> 10, err
}

// procField reads a "Name: N kB" line of a /proc file, in KiB.
func procField(path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, name)
}

// printLive prints the live-sandboxes scenario.
func printLive(w io.Writer, l *liveResult) {
	if l == nil {
		return
	}
	fmt.Fprintf(w, "\n%d live sandboxes (made in %.0f s, %d at once): 1+1 in each, the others idle: p50 %.2f ms, p99 %.2f ms, max %.1f ms\n",
		l.Sandboxes, l.CreateSeconds, liveCreators, l.Latency.P50, l.Latency.P99, l.Latency.Max)
	fmt.Fprintf(w, "  memory per live sandbox: the server's own %.0f KiB, the host's %.1f MiB\n", l.ServerKiB, l.HostMiB)
}
