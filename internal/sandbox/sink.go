package sandbox

import (
	"fmt"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// sink is the Manager's events.Sink in front of Config.Events: every event
// the engine and its parts (the kernels' reports, the egress gateway)
// emit passes here. It fills in the owner, which an emitter that knows
// only the sandbox's id cannot; applies the sandbox's output_filtering
// to every text in the event's details (a violation's target is what the
// code tried: a command line, a module, a host name, a path, any of
// which may carry a secret), so that the events' store, their stream and
// the webhooks see them filtered; and stops a sandbox whose policy says
// on_violation "terminate" at its first security_violation (its stop
// reason names the violation, filtered). The events the sandbox's code
// can cause (every source but the host) are coalesced past a rate
// (coalesce.go).
type sink struct {
	m   *Manager
	out events.Sink
}

// Emit implements events.Sink.
func (k sink) Emit(e events.Event) {
	var s *Sandbox
	if e.SandboxID != "" {
		k.m.mu.Lock()
		s = k.m.sandboxes[e.SandboxID]
		k.m.mu.Unlock()
	}
	if s != nil && e.Owner == "" {
		e.Owner = s.owner
	}
	if s != nil && len(e.Details) > 0 {
		if f := s.policyFilter(nil); f != nil {
			e.Details = filterDetails(f, e.Details)
		}
	}
	if s != nil && e.Source != "" && e.Source != events.SourceHost && !s.coalescer().admit(e) {
		return // held, to be sent coalesced (coalesce.go)
	}
	k.out.Emit(e)
	if s != nil && e.Type == events.SecurityViolation {
		if p := s.Policy(); p != nil && p.OnViolation == "terminate" {
			reason := fmt.Sprintf("terminated by policy at a security violation: %v %v", e.Details["kind"], e.Details["target"])
			go k.m.destroy(s, reason)
		}
	}
}

// filterDetails returns a copy of an event's details with every string
// in them, at any depth, redacted and cut at max_output_length (each on
// its own: an event is not an answer).
func filterDetails(f *policy.OutputFilter, d map[string]any) map[string]any {
	out := make(map[string]any, len(d))
	for k, v := range d {
		out[k] = filterValue(f, v)
	}
	return out
}

func filterValue(f *policy.OutputFilter, v any) any {
	switch x := v.(type) {
	case string:
		return f.Text(x)
	case []string:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = f.Text(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = filterValue(f, e)
		}
		return out
	case map[string]any:
		return filterDetails(f, x)
	}
	return v
}
