package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"
)

// Bursts: N creates at once, each to its first result, beside the host's
// N interpreters started at once (issue 35's burst target: 30 at once,
// p50 ≤ 1 s and ≥ 30 creates/s).

// burstSizes are the bursts measured.
var burstSizes = []int{10, 30}

// burstResult is one burst's figures, in ms from the burst's start.
type burstResult struct {
	N int `json:"n"`
	// Again marks the same burst repeated once the pool has refilled to
	// what the first one made it want (an adaptive pool grows with its
	// misses; a fixed one is as before).
	Again bool `json:"again,omitempty"`
	// Latency is each create's time to its first print(1)'s answer.
	Latency stat `json:"latency"`
	// PerSecond is N over the time the whole burst took.
	PerSecond float64 `json:"creates_per_second"`
	// Host is N `python3 -c pass` started at once on the host, each to
	// its exit: the floor a burst is compared with.
	Host stat `json:"host"`
}

// burst measures, for each size n, n creates sent at once, each timed
// from the common start to its first print(1)'s answer, and the rate at
// which the burst completed; the host's baseline is n `python3 -c pass`
// started at once, timed the same way. The pool is full before each
// burst: a burst larger than the pool measures its misses too, as users
// see them. Each burst is sent twice: the second once the pool holds
// what the first made it want, which shows what an adaptive pool gives
// to a load that comes back.
func (b *bencher) burst(ctx context.Context) error {
	for _, n := range burstSizes {
		host, err := atOnce(n, func() error { return exec.CommandContext(ctx, "/usr/bin/python3", "-c", "pass").Run() })
		if err != nil {
			return fmt.Errorf("the host's burst: python3 -c pass: %w", err)
		}
		for _, again := range []bool{false, true} {
			if _, err := b.waitPool(ctx); err != nil {
				return err
			}
			r, err := b.burstOnce(ctx, n)
			if err != nil {
				return fmt.Errorf("burst of %d: %w", n, err)
			}
			r.Host, r.Again = summarize(host), again
			b.res.Bursts = append(b.res.Bursts, r)
		}
	}
	return nil
}

// burstOnce sends n creates at once and kills what they made.
func (b *bencher) burstOnce(ctx context.Context, n int) (burstResult, error) {
	var mu sync.Mutex
	var ids []string
	began := time.Now()
	ms, err := atOnce(n, func() error {
		_, id, err := b.createFirst(ctx, nil)
		if id != "" {
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		}
		return err
	})
	whole := time.Since(began)
	for _, id := range ids {
		b.c.Kill(context.WithoutCancel(ctx), id)
	}
	if err != nil {
		return burstResult{}, err
	}
	return burstResult{N: n, Latency: summarize(ms), PerSecond: float64(n) / whole.Seconds()}, nil
}

// atOnce runs f n times at once, released together, and returns each
// run's time from the release to its return, in ms; the first error.
func atOnce(n int, f func() error) ([]float64, error) {
	ms := make([]float64, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range n {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			t := time.Now()
			errs[i] = f()
			ms[i] = since(t)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// printBursts prints the bursts' table.
func printBursts(w io.Writer, bursts []burstResult) {
	if len(bursts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "creates at once\tp50 ms\tp99 ms\tcreates/s\thost p50 ms\t×host\t")
	for _, b := range bursts {
		ratio := 0.0
		if b.Host.P50 > 0 {
			ratio = b.Latency.P50 / b.Host.P50
		}
		n := strconv.Itoa(b.N)
		if b.Again {
			n += ", again"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.1f\t%.0f\t%.1f\t\n", n, b.Latency.P50, b.Latency.P99, b.PerSecond, b.Host.P50, ratio)
	}
	tw.Flush()
	fmt.Fprintln(w, "  (each create timed from the burst's start to its first print(1); host: as many python3 -c pass at once;")
	fmt.Fprintln(w, "   again: the same burst once the pool holds what the first made it want)")
}
