package bench

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAtOnce: atOnce's runs are all under way together (each waits for
// the others: run one after another, they would never end), and the
// first error is returned.
func TestAtOnce(t *testing.T) {
	const n = 8
	var all sync.WaitGroup
	all.Add(n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ms, err := atOnce(n, func() error { all.Done(); all.Wait(); return nil })
		if err != nil || len(ms) != n {
			t.Errorf("atOnce = %v, %v", ms, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the runs were not under way together")
	}
	boom := errors.New("boom")
	if _, err := atOnce(3, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
}

// TestBurstTargets: a burst of 30 is judged against issue 35's targets
// (the first one: the one sent again, into a pool that grew, is not) and
// both are printed beside their host baseline.
func TestBurstTargets(t *testing.T) {
	r := &benchResults{Scenarios: map[string]stat{}, Bursts: []burstResult{
		{N: 10, Latency: stat{P50: 300, P99: 400}, PerSecond: 25, Host: stat{P50: 100}},
		{N: 30, Latency: stat{P50: 900, P99: 1500}, PerSecond: 20, Host: stat{P50: 300}},
		{N: 30, Again: true, Latency: stat{P50: 90, P99: 150}, PerSecond: 200, Host: stat{P50: 300}},
	}}
	r.evaluate()
	var got []string
	for _, tg := range r.Targets {
		got = append(got, tg.What+"="+map[bool]string{true: "met", false: "missed"}[tg.Met])
	}
	if strings.Join(got, ",") != "30 creates at once → first result, p50=met,30 creates at once, creates/s=missed" {
		t.Fatalf("targets: %v", got)
	}
	var buf bytes.Buffer
	printBursts(&buf, r.Bursts)
	if out := strings.Join(strings.Fields(buf.String()), " "); !strings.Contains(out, "30 900 1500 20.0 300 3.0") ||
		!strings.Contains(out, "30, again 90 150 200.0 300 0.3") {
		t.Fatalf("printed:\n%s", buf.String())
	}
}
