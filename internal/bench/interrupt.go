package bench

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// A bench stopped by SIGINT or SIGTERM (Ctrl-C, timeout(1)) would exit
// without its deferred stops: the servers it started got their own
// SIGTERM from Pdeathsig, but nobody waited for them to destroy their
// sandboxes nor removed their data dirs, and a server killed in the
// middle left its engine instance's cgroups (sheepfold/bench-PID) in
// every controller. So the stops are registered here too, and a signal
// runs them before the bench exits.

var interrupts struct {
	mu    sync.Mutex
	next  int
	stops map[int]func()
	once  sync.Once
}

// onInterrupt registers stop to run if the bench is stopped by a signal,
// and returns what unregisters it (the caller's own stop ran).
func onInterrupt(stop func()) (unregister func()) {
	interrupts.mu.Lock()
	defer interrupts.mu.Unlock()
	interrupts.once.Do(watchSignals)
	if interrupts.stops == nil {
		interrupts.stops = map[int]func(){}
	}
	k := interrupts.next
	interrupts.next++
	interrupts.stops[k] = stop
	return func() {
		interrupts.mu.Lock()
		delete(interrupts.stops, k)
		interrupts.mu.Unlock()
	}
}

// watchSignals runs the registered stops, in parallel, at the first
// SIGINT or SIGTERM, and exits as the signal would have (128+n).
func watchSignals() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := (<-c).(syscall.Signal)
		fmt.Fprintf(os.Stderr, "bench: %v: stopping the servers it started\n", s)
		interrupts.mu.Lock()
		stops := interrupts.stops
		interrupts.stops = nil
		interrupts.mu.Unlock()
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
		os.Exit(128 + int(s))
	}()
}
