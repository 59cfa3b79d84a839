package agent

import (
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/ratelimit"
)

// budgets are the sandbox's budgets the agent keeps for its engines
// (budget.take): every replica of the server serving the sandbox takes
// from the same one, where each would otherwise count alone. They live
// as long as the agent, as the sandbox's do.
type budgets struct {
	mu     sync.Mutex
	totals map[string]int64
	minute map[string]*ratelimit.Bucket
}

// take takes one from the budget spec names at now.
func (b *budgets) take(spec agentproto.BudgetSpec, now time.Time) (agentproto.BudgetTaken, bool) {
	switch spec.Name {
	case agentproto.BudgetNetworkRequests, agentproto.BudgetExecutions:
	default:
		return agentproto.BudgetTaken{}, false // the names are few: a map no request can grow
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if spec.PerMinute {
		if b.minute == nil {
			b.minute = map[string]*ratelimit.Bucket{}
		}
		bk := b.minute[spec.Name]
		if bk == nil {
			bk = &ratelimit.Bucket{}
			b.minute[spec.Name] = bk
		}
		res := bk.Take(now, spec.Limit)
		return agentproto.BudgetTaken{Allowed: res.Allowed, Count: res.Remaining, RetryAfterMS: res.RetryAfter.Milliseconds()}, true
	}
	if b.totals == nil {
		b.totals = map[string]int64{}
	}
	n := b.totals[spec.Name]
	if n >= spec.Limit {
		return agentproto.BudgetTaken{Count: n}, true
	}
	b.totals[spec.Name] = n + 1
	return agentproto.BudgetTaken{Allowed: true, Count: n + 1}, true
}

func (s *server) budgetTake(req *agentproto.Request) agentproto.Event {
	if req.Budget == nil || req.Budget.Limit <= 0 {
		return fail(agentproto.CodeBadRequest, "budget.take needs a budget with a positive limit")
	}
	taken, ok := s.budgets.take(*req.Budget, time.Now())
	if !ok {
		return fail(agentproto.CodeBadRequest, "unknown budget %q", req.Budget.Name)
	}
	return agentproto.Event{Type: agentproto.EventDone, Budget: &taken}
}
