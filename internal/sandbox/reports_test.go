package sandbox

import (
	"context"
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
)

// TestGatewayEventsMarked: what the egress gateway emits through the
// Manager is recorded as the gateway's.
func TestGatewayEventsMarked(t *testing.T) {
	t.Parallel()
	var got []events.Event
	m, err := New(context.Background(), Config{Runtime: &fake.Runtime{Dir: t.TempDir()},
		Templates: TemplatesFunc(func(string) (string, error) { return "/", nil }),
		Events:    events.SinkFunc(func(e events.Event) { got = append(got, e) })})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	m.cfg.Egress.Events.Emit(events.Event{Type: events.SecurityViolation, SandboxID: "a"})
	if len(got) != 1 || got[0].Source != events.SourceGateway {
		t.Fatalf("a gateway's event recorded as %+v", got)
	}
}
