package sandbox

import (
	"context"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Bounds of the memory the engine holds for executions' results (and any
// other large frame an execution's agent sends), at once: per sandbox and
// for the whole engine. Large frames wait for room before they are read
// (backpressure: the sandbox's kernel stalls on its writes meanwhile);
// results kept for a non-streamed Execution take room only if there is
// some, and are dropped (and reported) otherwise.
const (
	DefaultMaxResultMemory        = 256 << 20 // Config.MaxResultMemory
	DefaultMaxSandboxResultMemory = 64 << 20  // Config.MaxSandboxResultMemory
)

// DefaultOutputRate is Config.OutputRate: the bytes per second of output
// one sandbox may push through the engine once its burst (outputBurst, or
// the rate if larger) is spent. Measured on a 2-core host with six
// sandboxes flooding output: 8 MiB/s each left a neighbour's 1+1 at a 29 ms
// median, 1 MiB/s at 4.4 ms, as when all is quiet.
const DefaultOutputRate = 1 << 20

// outputBurst is how much output a sandbox may send at once before the
// rate applies: a large print now and then is not slowed.
const outputBurst = 8 << 20

// outputLimiter returns the sandbox's output limiter, made on first use.
// Output waits for it before it is passed on, so that a flood is slowed at
// its source (the code's writes stall on a full pipe) and costs the
// engine, and so every other sandbox, no more than the rate.
func (s *Sandbox) outputLimiter() *rate.Limiter {
	s.outputOnce.Do(func() {
		r := s.m.cfg.OutputRate
		s.output = rate.NewLimiter(rate.Limit(r), int(max(r, outputBurst)))
	})
	return s.output
}

// waitOutput waits until n bytes of output may pass.
func (s *Sandbox) waitOutput(ctx context.Context, n int) error {
	l := s.outputLimiter()
	return l.WaitN(ctx, min(n, l.Burst()))
}

// budget is a number of bytes that may be held at once.
type budget = semaphore.Weighted

// resultBudgets returns the sandbox's and the engine's budgets, made on
// first use.
func (s *Sandbox) resultBudgets() (sandbox, engine *budget) {
	m := s.m
	m.resultsOnce.Do(func() { m.results = semaphore.NewWeighted(m.cfg.MaxResultMemory) })
	s.resultsOnce.Do(func() { s.results = semaphore.NewWeighted(m.cfg.MaxSandboxResultMemory) })
	return s.results, m.results
}

// holding is what one execution holds of the budgets; release gives it
// all back.
type holding struct {
	sandbox, engine *budget
	n               int64
}

// admit waits until a frame of n bytes fits in both budgets; it is the
// agentproto.Admit of an execution's call.
func (h *holding) admit(ctx context.Context) agentproto.Admit {
	return func(n int) (func(), error) {
		if err := h.sandbox.Acquire(ctx, int64(n)); err != nil {
			return nil, err
		}
		if err := h.engine.Acquire(ctx, int64(n)); err != nil {
			h.sandbox.Release(int64(n))
			return nil, err
		}
		return func() {
			h.engine.Release(int64(n))
			h.sandbox.Release(int64(n))
		}, nil
	}
}

// keep takes n bytes from both budgets for a result kept until the end of
// the execution, if they have room now, and still room for a frame after
// it: kept results never leave a waiting frame without room.
func (h *holding) keep(n int64) bool {
	const reserve = agentproto.MaxFrame
	if !h.sandbox.TryAcquire(n + reserve) {
		return false
	}
	if !h.engine.TryAcquire(n + reserve) {
		h.sandbox.Release(n + reserve)
		return false
	}
	h.engine.Release(reserve)
	h.sandbox.Release(reserve)
	h.n += n
	return true
}

// release gives back what keep took.
func (h *holding) release() {
	if h.n > 0 {
		h.engine.Release(h.n)
		h.sandbox.Release(h.n)
		h.n = 0
	}
}
