package sandbox

import "github.com/sheepfold/sheepfold/internal/events"

// sink is the Manager's events.Sink in front of Config.Events: every event
// the engine and its parts (the egress gateway) emit passes here. It fills
// in the owner, which an emitter that knows only the sandbox's id cannot.
type sink struct {
	m   *Manager
	out events.Sink
}

// Emit implements events.Sink.
func (k sink) Emit(e events.Event) {
	if e.Owner == "" && e.SandboxID != "" {
		k.m.mu.Lock()
		s := k.m.sandboxes[e.SandboxID]
		k.m.mu.Unlock()
		if s != nil {
			e.Owner = s.owner
		}
	}
	k.out.Emit(e)
}
