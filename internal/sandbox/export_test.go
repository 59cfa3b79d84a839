package sandbox

import "time"

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
