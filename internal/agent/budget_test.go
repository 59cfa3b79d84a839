package agent

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestBudgetTake: a total budget gives exactly its limit, also to takers
// at once on several connections (the server's replicas), and keeps its
// count when its limit grows; a per-minute budget gives a minute's worth
// and then says when to retry; unknown budgets and limits are refused,
// and takes are not activity.
func TestBudgetTake(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t) // the agent runs: its idle time began
	begin := time.Now()
	take := func(name string, limit int64, perMinute bool) agentproto.Event {
		return a.call(t, agentproto.Request{Op: agentproto.OpBudgetTake,
			Budget: &agentproto.BudgetSpec{Name: name, Limit: limit, PerMinute: perMinute}}).done
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 3 {
				if d := take(agentproto.BudgetNetworkRequests, 5, false); d.Code != "" {
					t.Errorf("take: %+v", d)
				} else if d.Budget.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 5 {
		t.Fatalf("24 takes from a budget of 5 at once: %d allowed", allowed.Load())
	}
	if d := take(agentproto.BudgetNetworkRequests, 6, false); d.Budget == nil || !d.Budget.Allowed || d.Budget.Count != 6 {
		t.Fatalf("the limit raised to 6: %+v", d.Budget)
	}
	if d := take(agentproto.BudgetNetworkRequests, 6, false); d.Budget.Allowed || d.Budget.Count != 6 {
		t.Fatalf("past 6: %+v", d.Budget)
	}

	for i := range 3 {
		if d := take(agentproto.BudgetExecutions, 3, true); d.Budget == nil || !d.Budget.Allowed || d.Budget.Count != int64(2-i) {
			t.Fatalf("per-minute take %d: %+v", i, d.Budget)
		}
	}
	d := take(agentproto.BudgetExecutions, 3, true)
	if d.Budget.Allowed || d.Budget.RetryAfterMS <= 0 || d.Budget.RetryAfterMS > 20_000 {
		t.Fatalf("a spent per-minute budget of 3: %+v", d.Budget)
	}

	for _, spec := range []agentproto.BudgetSpec{{Name: "anything", Limit: 1}, {Name: agentproto.BudgetNetworkRequests}} {
		if d := a.call(t, agentproto.Request{Op: agentproto.OpBudgetTake, Budget: &spec}).done; d.Code != agentproto.CodeBadRequest {
			t.Fatalf("budget %+v: %+v", spec, d)
		}
	}
	if d := a.call(t, agentproto.Request{Op: agentproto.OpBudgetTake}).done; d.Code != agentproto.CodeBadRequest {
		t.Fatalf("no budget: %+v", d)
	}
	// Idle since before the first take: the takes were not activity. The
	// time since the first is taken before the ping that reads the idle
	// time, which the agent measures later (on a slow run, much later).
	since := time.Since(begin)
	if info := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t).done.Agent; info.IdleMS < since.Milliseconds()-1 {
		t.Fatalf("budget takes count as activity: idle %d ms, %v since the first", info.IdleMS, since)
	}
}
