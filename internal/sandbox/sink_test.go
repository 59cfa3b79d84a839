package sandbox

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
)

// Events from parts that know only the sandbox's id (the egress gateway)
// get its owner; those of unknown sandboxes pass as they are.
func TestSinkFillsOwner(t *testing.T) {
	var got []events.Event
	m := &Manager{sandboxes: map[string]*Sandbox{"a": {ID: "a", owner: "alice"}}}
	k := sink{m: m, out: events.SinkFunc(func(e events.Event) { got = append(got, e) })}
	k.Emit(events.Event{Type: events.SecurityViolation, SandboxID: "a"})
	k.Emit(events.Event{Type: events.SecurityViolation, SandboxID: "gone"})
	k.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "a", Owner: "bob"})
	if len(got) != 3 || got[0].Owner != "alice" || got[1].Owner != "" || got[2].Owner != "bob" {
		t.Fatalf("owners %+v", got)
	}
}
