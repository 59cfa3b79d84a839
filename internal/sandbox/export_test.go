package sandbox

import "time"

// SetAgentDeadlines shortens the deadlines of host→agent calls for one
// test (not a parallel one) and returns what restores them.
func SetAgentDeadlines(idle, grace time.Duration) (restore func()) {
	oldIdle, oldGrace := agentIdle, agentGrace
	agentIdle, agentGrace = idle, grace
	return func() { agentIdle, agentGrace = oldIdle, oldGrace }
}
