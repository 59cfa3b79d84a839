package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// Pacing: the server's CPU shared out between accounts. Each account's
// requests are paced, in memory and per server, to a rate
// (Config.PacePerAccount) with a second's worth of burst: a request past
// it waits for its place, costing a goroutine and no CPU, and is refused
// with ERR_RATE_LIMITED only when that place is more than maxPaceWait
// away. So a tenant whose clients send each request as soon as the last
// is answered gets its answers at that rate, whatever the number of its
// clients, and the CPU it takes is bounded by the rate
// (BenchmarkUnpacedFlood, docs/security.md section 13). The account's
// own `requests_per_minute` (shared by the servers of one store, and
// refused rather than waited for) comes on top.
//
// Waiting rather than refusing is what bounds a client that retries at
// once: a refusal costs the server nearly what an answer does.

// DefaultPacePerAccount is each account's request rate per server
// before its requests wait: far above what a person or an agent's
// ordinary load sends (100 concurrent creates, the E2B suites), far
// below the ten thousand a second this server answers on two cores.
const DefaultPacePerAccount = 1000

// maxPaceWait is the longest a request waits for its place.
var maxPaceWait = 5 * time.Second

// paceIdle is how long an account's pace is kept without a request (a
// full bucket is the same as none).
const paceIdle = time.Minute

// paces is every account's pace.
type paces struct {
	per   rate.Limit // 0: no pacing
	burst int
	mu    sync.Mutex
	by    map[string]*pace
	swept time.Time
}

type pace struct {
	lim  *rate.Limiter
	last time.Time
}

func newPaces(perSecond int) *paces {
	return &paces{per: rate.Limit(perSecond), burst: max(1, perSecond/10), by: map[string]*pace{}}
}

// wait waits for owner's next place, until ctx ends (its client left:
// the error is ctx's); a place further than maxPaceWait is refused.
func (p *paces) wait(ctx context.Context, owner string) error {
	if p.per <= 0 {
		return nil
	}
	now := time.Now()
	p.mu.Lock()
	if now.Sub(p.swept) > paceIdle {
		for k, v := range p.by {
			if now.Sub(v.last) > paceIdle {
				delete(p.by, k)
			}
		}
		p.swept = now
	}
	a := p.by[owner]
	if a == nil {
		a = &pace{lim: rate.NewLimiter(p.per, p.burst)}
		p.by[owner] = a
	}
	a.last = now
	res := a.lim.ReserveN(now, 1)
	p.mu.Unlock()
	d := res.DelayFrom(now)
	if d == 0 {
		return nil
	}
	if d > maxPaceWait {
		res.CancelAt(now)
		return &apierr.Error{Code: apierr.RateLimited, RetryAfter: d,
			Message: fmt.Sprintf("this account's requests arrive faster than this server paces them (%d a second); retry in %.1f s", int(p.per), d.Seconds())}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		res.Cancel()
		return ctx.Err()
	}
}
