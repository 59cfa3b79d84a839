package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// errCPUTime is the cause with which cpuWatch cancels an execution.
var errCPUTime = errors.New("the execution passed its CPU time limit")

// cpuWatch enforces a policy's cpu_time_seconds on one execution with the
// kernel's own count: the sandbox cgroup's CPU usage (v1 cpuacct.usage,
// v2 cpu.stat usage_usec), so CPU burnt in threads and in background
// processes the code started counts as well as the interpreter's own. It
// reads the counter at the start and then every quarter of the limit
// (between 10 and 100 ms); past the limit it cancels the execution's call
// with errCPUTime, and the agent interrupts the code (SIGINT, then a kill
// if it does not stop). The interpreter's RLIMIT_CPU, set a little past
// the limit, is the backstop. Without a limit nothing is read.
type cpuWatch struct {
	read  func() (time.Duration, error)
	limit time.Duration
	start time.Duration
	every time.Duration
	done  chan struct{}
}

// newCPUWatch returns the watch of an execution under pol, or nil when it
// has no CPU time limit or the runtime cannot count (runtime.CPUCounter).
// Then the agent's own watch of its interpreter applies (internal/kernel:
// the interpreter's threads and the children it waited for, read from
// /proc a few times per limit), with the interpreter's RLIMIT_CPU as the
// backstop; CPU burnt by background processes the code left running is
// not counted against the execution, only against the sandbox's CPU
// quota. That holds for the fake runtime and for Pods (kubernetes): a
// Pod's cgroup is on its node, and reading it through the agent (usage.go)
// up to a hundred times a second, over the network, would cost more than
// the limit is worth.
func (s *Sandbox) newCPUWatch(pol *agentproto.KernelPolicy) *cpuWatch {
	if pol == nil || pol.CPUTimeMS <= 0 {
		return nil
	}
	c, ok := s.m.cfg.Runtime.(runtime.CPUCounter)
	if !ok {
		return nil
	}
	id := s.ID
	w := &cpuWatch{read: func() (time.Duration, error) { return c.CPUTime(id) },
		limit: time.Duration(pol.CPUTimeMS) * time.Millisecond}
	start, err := w.read()
	if err != nil {
		return nil
	}
	w.start = start
	w.every = min(max(w.limit/4, 10*time.Millisecond), 100*time.Millisecond)
	return w
}

// run cancels ctx with errCPUTime once the execution has used more than
// its limit; it returns when ctx ends.
func (w *cpuWatch) run(ctx context.Context, cancel context.CancelCauseFunc) {
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		t := time.NewTicker(w.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if w.used() > w.limit {
					cancel(errCPUTime)
					return
				}
			}
		}
	}()
}

// used is the CPU time since the start.
func (w *cpuWatch) used() time.Duration {
	now, err := w.read()
	if err != nil || now < w.start {
		return 0
	}
	return now - w.start
}

// finish waits for the watch to end (ctx must be done) and returns the
// CPU time the execution used.
func (w *cpuWatch) finish() time.Duration {
	if w.done != nil {
		<-w.done
	}
	return w.used()
}

// exceeded is the execution the host stopped at its CPU time limit.
func (w *cpuWatch) exceeded(ex *Execution, used time.Duration) {
	ex.Status, ex.ErrorCode = ExecError, string(apierr.CPUTimeExceeded)
	ex.CPUTimeMS = float64(used.Microseconds()) / 1000
	ex.Error = &agentproto.ExecError{Name: "CPUTimeExceeded",
		Value: fmt.Sprintf("the execution used %s of CPU time, more than its limit of %s (cpu_time_seconds; counted on the "+
			"sandbox's cgroup, threads and background processes included), and was stopped", used.Round(time.Millisecond), w.limit)}
}
