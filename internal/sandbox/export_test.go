package sandbox

import (
	"context"
	"time"
)

// SetAgentDeadlines shortens the deadlines of host→agent calls for one
// test (not a parallel one) and returns what restores them.
func SetAgentDeadlines(idle, grace time.Duration) (restore func()) {
	oldIdle, oldGrace := agentIdle, agentGrace
	agentIdle, agentGrace = idle, grace
	return func() { agentIdle, agentGrace = oldIdle, oldGrace }
}

// RefillQuiet is how long a pool with members left waits after a
// hand-out before it refills.
const RefillQuiet = refillQuiet

// The warm pool's tests change a Placer's nodes and want the pool to see
// it soon.
func init() { nodeRefresh = 100 * time.Millisecond }

// PoolLease is a member's lease in the pool of an engine that does not
// share its sandboxes, and LifetimeGrace how long after the engine's
// deadline the agent ends a sandbox.
const (
	PoolLease     = poolLease
	LifetimeGrace = lifetimeGrace
)

// SetAgentLifetime tells the sandbox's agent to end it d from now (the
// engine's grace included), leaving the engine's own deadline as it is:
// the agent's deadline as a slow pause leaves it, close at hand.
func SetAgentLifetime(ctx context.Context, s *Sandbox, d time.Duration) error {
	return s.tellLifetime(ctx, d-lifetimeGrace)
}

// AgentLifetimeLeft is the lifetime the sandbox's agent says it has left
// (the engine's grace included).
func AgentLifetimeLeft(ctx context.Context, s *Sandbox) (time.Duration, error) {
	info, err := s.agentInfo(ctx)
	if err != nil {
		return 0, err
	}
	return time.Duration(info.LifetimeLeftMS) * time.Millisecond, nil
}

// SetAttendantIdle sets how long a volume's attendant outlives its last
// call; the returned func restores it.
func SetAttendantIdle(d time.Duration) func() {
	old := attendantIdle
	attendantIdle = d
	return func() { attendantIdle = old }
}

// SetMeasureCommand sets the command that measures an attendant's
// volume; the returned func restores it.
func SetMeasureCommand(cmd ...string) func() {
	old := measureCmd
	measureCmd = cmd
	return func() { measureCmd = old }
}

// AttendantMount is where an attendant mounts its volume.
const AttendantMount = attendantMount
