package sandbox

import (
	"fmt"

	"github.com/sheepfold/sheepfold/internal/events"
)

// sink is the Manager's events.Sink in front of Config.Events: every event
// the engine and its parts (the kernels' reports, the egress gateway)
// emit passes here. It fills in the owner, which an emitter that knows
// only the sandbox's id cannot, and stops a sandbox whose policy says
// on_violation "terminate" at its first security_violation (its stop
// reason names the violation).
type sink struct {
	m   *Manager
	out events.Sink
}

// Emit implements events.Sink.
func (k sink) Emit(e events.Event) {
	var s *Sandbox
	if e.SandboxID != "" && (e.Owner == "" || e.Type == events.SecurityViolation) {
		k.m.mu.Lock()
		s = k.m.sandboxes[e.SandboxID]
		k.m.mu.Unlock()
	}
	if s != nil && e.Owner == "" {
		e.Owner = s.owner
	}
	k.out.Emit(e)
	if s != nil && e.Type == events.SecurityViolation {
		if p := s.Policy(); p != nil && p.OnViolation == "terminate" {
			reason := fmt.Sprintf("terminated by policy at a security violation: %v %v", e.Details["kind"], e.Details["target"])
			go k.m.destroy(s, reason)
		}
	}
}
