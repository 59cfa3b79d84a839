package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// agentUsageTimeout bounds a usage call to an agent (a dozen small file
// reads on its side).
var agentUsageTimeout = 5 * time.Second

// Usage reads the sandbox's resource usage from its cgroup: metrics,
// metering and the service layer's readers call it.
func (s *Sandbox) Usage(ctx context.Context) (runtime.Usage, error) {
	return s.usage(ctx)
}

// usage is how the engine reads a sandbox's resource usage, every reader
// of it (metrics, metering, the idle stop, OOM and limit reports): from
// the runtime, which reads the sandbox's cgroup on this host, or, where
// the runtime cannot (runtime.ErrUnsupported: a Pod, whose cgroup is on
// its node), from the sandbox's agent, which reads its container's own
// cgroup (agentproto.OpUsage). A runtime that measures pays nothing more:
// the agent is asked only after the runtime said it cannot.
//
// What the agent answers is the kernel's counters, which no code in the
// sandbox can change (internal/agent/usage.go says why); like every
// answer of an agent it speaks only of its own sandbox. Its disk figures
// are its scratch volume's (a Pod's home and /tmp, internal/agent,
// scratch_linux.go); writes elsewhere go to the Pod's writable layer, its
// node's, which only the node's ephemeral-storage limit bounds. A dead
// agent answers nothing: the error is the call's.
func (s *Sandbox) usage(ctx context.Context) (runtime.Usage, error) {
	u, err := s.m.cfg.Runtime.Usage(ctx, s.ID)
	if err == nil || !errors.Is(err, runtime.ErrUnsupported) {
		return u, err
	}
	if !s.agentReady() {
		return u, err // still starting (the idle loop sees such sandboxes)
	}
	return s.agentUsage(ctx)
}

// agentReady reports whether the sandbox's agent can be asked: its create
// has returned (s.agent is set) and left it an agent.
func (s *Sandbox) agentReady() bool {
	select {
	case <-s.created:
		return s.agent.dial != nil
	default:
		return false
	}
}

// agentRead sends the agent op, a read of the sandbox's usage, which is
// not activity (the idle stop does not see it): an agent that cannot
// answer it (no cgroup, no history, an agent older than the op) is
// runtime.ErrUnsupported, saying what it could not.
func (s *Sandbox) agentRead(ctx context.Context, op, what string) (agentproto.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, agentUsageTimeout)
	defer cancel()
	done, err := s.agent.call(ctx, agentproto.Request{Op: op}, nil, agentproto.Handlers{}, callOptions{idle: agentUsageTimeout})
	if done.Code == agentproto.CodeUnsupported || done.Code == agentproto.CodeBadRequest {
		return done, fmt.Errorf("%w: the sandbox's agent cannot read its %s: %s", runtime.ErrUnsupported, what, done.Message)
	}
	if err != nil {
		return done, fmt.Errorf("read %s from the sandbox's agent: %w", what, err)
	}
	return done, nil
}

// agentUsage asks the sandbox's agent for its usage.
func (s *Sandbox) agentUsage(ctx context.Context) (runtime.Usage, error) {
	done, err := s.agentRead(ctx, agentproto.OpUsage, "usage")
	if err != nil {
		return runtime.Usage{}, err
	}
	if done.Usage == nil {
		return runtime.Usage{}, fmt.Errorf("%w: a usage reply without usage", errAgentBroke)
	}
	return fromAgent(*done.Usage), nil
}

// fromAgent is an agent's usage as the engine's.
func fromAgent(a agentproto.Usage) runtime.Usage {
	u := runtime.Usage{
		MemoryBytes: a.MemoryBytes, MemoryCacheBytes: a.MemoryCacheBytes, MemoryPeakBytes: a.MemoryPeakBytes,
		MemoryLimit: a.MemoryLimit, OOMKills: a.OOMKills, CPUNanos: a.CPUNanos, CPULimit: a.CPULimit,
		Pids: a.Pids, PidsDenied: a.PidsDenied, DiskBytes: a.DiskBytes, DiskTotalBytes: a.DiskTotalBytes,
	}
	if p := a.Pressure; p != nil {
		u.Pressure = &runtime.Pressure{CPUSome: p.CPUSome, MemorySome: p.MemorySome, MemoryFull: p.MemoryFull, IOSome: p.IOSome, IOFull: p.IOFull}
	}
	return u
}

// UsageSample is one sample of a sandbox's usage history.
type UsageSample struct {
	At time.Time
	runtime.Usage
}

// UsageHistory returns the usage samples the sandbox's agent took (every
// 5 s, the last hour, oldest first): a Pod's, which every replica reads
// alike. runtime.ErrUnsupported where the agent keeps none (the local
// engine's sandboxes: their server samples them itself).
func (s *Sandbox) UsageHistory(ctx context.Context) ([]UsageSample, error) {
	if !s.agentReady() {
		return nil, fmt.Errorf("%w: the sandbox has no agent to ask yet", runtime.ErrUnsupported)
	}
	done, err := s.agentRead(ctx, agentproto.OpUsageHistory, "usage history")
	if err != nil {
		return nil, err
	}
	out := make([]UsageSample, 0, len(done.History))
	for _, h := range done.History {
		out = append(out, UsageSample{At: time.UnixMilli(h.UnixMS), Usage: fromAgent(h.Usage)})
	}
	return out, nil
}
