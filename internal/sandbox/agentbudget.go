package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/egress"
)

// The budgets of a sandbox that must hold across the engines serving it
// (the server's replicas) are kept by its agent (budget.take), which every
// engine's requests reach; each engine counting alone would give the
// whole budget again. Its executions per minute are the agent's when the
// engine is shared (Config.Shared), its network_requests whenever its
// egress goes through the agent (a Pod's).

// budgetTimeout bounds one take: a budget is on the way of a request.
const budgetTimeout = 5 * time.Second

// errNoAgentBudgets says that the sandbox's agent keeps no budgets (one
// older than budget.take): the engine counts alone.
var errNoAgentBudgets = errors.New("the sandbox's agent keeps no budgets")

// takeBudget takes one from the agent's budget spec.
func (s *Sandbox) takeBudget(ctx context.Context, spec agentproto.BudgetSpec) (agentproto.BudgetTaken, error) {
	ctx, cancel := context.WithTimeout(ctx, budgetTimeout)
	defer cancel()
	done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpBudgetTake, Budget: &spec}, nil, agentproto.Handlers{}, callOptions{idle: budgetTimeout})
	switch {
	case done.Code == agentproto.CodeBadRequest && done.Budget == nil:
		return agentproto.BudgetTaken{}, fmt.Errorf("%w: %s", errNoAgentBudgets, done.Message)
	case err != nil:
		return agentproto.BudgetTaken{}, fmt.Errorf("take from the sandbox's %s budget: %w", spec.Name, err)
	case done.Budget == nil:
		return agentproto.BudgetTaken{}, fmt.Errorf("%w: a budget.take reply without a budget", errAgentBroke)
	}
	return *done.Budget, nil
}

// shareEgressBudget makes the sandbox's gateway count network_requests in
// its agent, where every replica's gateway counts; with an agent older
// than budget.take, alone.
func (s *Sandbox) shareEgressBudget() {
	s.net.ShareBudget(func(ctx context.Context, limit int64) (bool, int64, error) {
		t, err := s.takeBudget(ctx, agentproto.BudgetSpec{Name: agentproto.BudgetNetworkRequests, Limit: limit})
		if errors.Is(err, errNoAgentBudgets) {
			return false, 0, egress.ErrNoBudget
		}
		return t.Allowed, t.Count, err
	})
}
