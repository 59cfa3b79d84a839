package metrics_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/metrics"
)

// An owner's summary holds its own counts only, and labels reported from
// inside a sandbox (a kind, a status, a resource) that are none of the
// known ones count as "other": code cannot make up series. The admin's
// figures are everyone's.
func TestSummaryIsTheOwners(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Config{})
	for _, e := range []events.Event{
		{ID: 1, Owner: "a", Type: events.ExecutionFinished, Details: map[string]any{"status": "success", "language": "python", "duration_ms": 3}},
		{ID: 2, Owner: "a", Type: events.SecurityViolation, Details: map[string]any{"kind": "made-up"}},
		{ID: 3, Owner: "a", Type: events.ResourceExceeded, Details: map[string]any{"resource": events.ResourceMemory}},
		{ID: 4, Owner: "b", Type: events.ExecutionFinished, Details: map[string]any{"status": "invented"}},
		{ID: 5, Owner: "b", Type: events.SecurityViolation, Details: map[string]any{"kind": events.KindNetworkDenied}},
	} {
		m.OnEvent(e)
	}
	sa, err := m.Summary("a", false)
	if err != nil {
		t.Fatal(err)
	}
	if sa.Admin != nil {
		t.Fatal("a key's summary has the admin's figures")
	}
	want := metrics.AccountFigures{Executions: map[string]int64{"success": 1}, ResourceExceeded: map[string]int64{"memory": 1},
		SecurityViolations: map[string]int64{"other": 1}}
	if d := cmp.Diff(want, sa.Account); d != "" {
		t.Fatalf("a's figures (-want +got):\n%s", d)
	}
	if l := sa.Server.ExecutionSeconds["python"]; l == nil || l.P50 <= 0 {
		t.Fatalf("execution latency %+v", sa.Server.ExecutionSeconds)
	}
	sb, err := m.Summary("b", true)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Account.Executions["other"] != 1 || len(sb.Account.ResourceExceeded) != 0 {
		t.Fatalf("b's figures %+v", sb.Account)
	}
	if sb.Admin == nil || sb.Admin.Executions["success"] != 1 || sb.Admin.Executions["other"] != 1 || sb.Admin.OOMKills != 1 ||
		sb.Admin.SecurityViolations["other"] != 1 || sb.Admin.SecurityViolations[events.KindNetworkDenied] != 1 {
		t.Fatalf("the admin's figures %+v", sb.Admin)
	}
}
