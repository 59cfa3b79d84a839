package sandbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// forgeKinds is a cell that writes n violation reports of each kind on
// its driver's control pipe, each with its own target.
func forgeKinds(n int, kinds ...string) string {
	code := "import os\n"
	for _, k := range kinds {
		code += fmt.Sprintf("for i in range(%d):\n"+
			"    os.write(4, b'{\"type\":\"violation\",\"kind\":\"%s\",\"target\":\"t%%d\"}\\n' %% i)\n", n, k)
	}
	return code
}

// sumCounts is the occurrences a list of events stands for.
func sumCounts(t *testing.T, evs []events.Event) int64 {
	t.Helper()
	var n int64
	for _, e := range evs {
		switch c := e.Details["count"].(type) {
		case nil:
			n++
		case int64:
			n += c
		default:
			t.Fatalf("count %T %v in %+v", c, c, e)
		}
	}
	return n
}

// TestEventsCoalesced: a cell floods security_violation reports of two
// kinds, and of kinds the engine does not know. Without a rate (the
// control) every report the per-execution bound keeps is an event. With
// the defaults, each kind of the sandbox lets DefaultEventBurst through,
// then holds the rest and sends one event that stands for them (its
// "count", "first_at") once its bucket has a token again; nothing is
// lost in the count. Unknown kinds share one bucket. A sandbox that stops
// sends what it holds before sandbox.stopped.
func TestEventsCoalesced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const flood = 100 // the per-execution bound's default: all kept by it
	reports := sandbox.ReportLimits{PerMinute: 1 << 20}

	t.Run("control", func(t *testing.T) {
		t.Parallel()
		log := &policyLog{}
		m, _ := fakeEngine(t, sandbox.Config{Events: log, Reports: reports,
			EventRate: sandbox.EventRate{Burst: 1 << 20, PerMinute: 1 << 20}})
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_control", Code: forgeKinds(flood/2, "dns_denied", "network_denied")}, nil); err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
		if n := len(log.of(events.SecurityViolation, s.ID, "exe_control")); n != flood {
			t.Fatalf("without a rate, %d events of %d reports", n, flood)
		}
	})

	t.Run("coalesced", func(t *testing.T) {
		t.Parallel()
		log := &policyLog{}
		m, _ := fakeEngine(t, sandbox.Config{Events: log, Reports: reports})
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		code := forgeKinds(flood/2, "dns_denied", "network_denied")
		if ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_flood", Code: code}, nil); err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
		of := func(kind string) []events.Event {
			var out []events.Event
			for _, e := range log.of(events.SecurityViolation, s.ID, "exe_flood") {
				if e.Details["kind"] == kind {
					out = append(out, e)
				}
			}
			return out
		}
		for _, kind := range []string{"dns_denied", "network_denied"} {
			// The burst at once; then, within about a second (a
			// token at 60 a minute), one event for the rest.
			waitFor(t, kind+": no coalesced event", func() bool { return len(of(kind)) > sandbox.DefaultEventBurst })
			got := of(kind)
			if len(got) != sandbox.DefaultEventBurst+1 {
				t.Fatalf("%s: %d events of %d reports, want %d and one coalesced", kind, len(got), flood/2, sandbox.DefaultEventBurst)
			}
			if n := sumCounts(t, got); n != flood/2 {
				t.Fatalf("%s: the events stand for %d reports, want %d", kind, n, flood/2)
			}
			last := got[len(got)-1]
			if last.Details["target"] != fmt.Sprintf("t%d", flood/2-1) || last.Details["first_at"] == nil ||
				last.Source != events.SourceSandbox {
				t.Fatalf("%s: the coalesced event %+v", kind, last)
			}
		}

		// Kinds the engine does not know share one bucket.
		if ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_odd", Code: forgeKinds(15, "odd_a", "odd_b")}, nil); err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
		waitFor(t, "unknown kinds: no coalesced event", func() bool {
			return len(log.of(events.SecurityViolation, s.ID, "exe_odd")) > sandbox.DefaultEventBurst
		})
		if got := log.of(events.SecurityViolation, s.ID, "exe_odd"); len(got) != sandbox.DefaultEventBurst+1 || sumCounts(t, got) != 30 {
			t.Fatalf("unknown kinds: %d events for %d reports", len(got), sumCounts(t, got))
		}
	})

	t.Run("flushed at stop", func(t *testing.T) {
		t.Parallel()
		log := &policyLog{}
		// A token a minute: what is held waits for the stop.
		m, _ := fakeEngine(t, sandbox.Config{Events: log, Reports: reports, EventRate: sandbox.EventRate{Burst: 5, PerMinute: 1}})
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_held", Code: forgeKinds(40, "syscall_denied")}, nil); err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
		if n := len(log.of(events.SecurityViolation, s.ID, "exe_held")); n != 5 {
			t.Fatalf("%d events before the stop, want the burst of 5", n)
		}
		if err := m.Kill(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		log.mu.Lock()
		var order []string
		for _, e := range log.evs {
			if e.SandboxID == s.ID && (e.Type == events.SecurityViolation || e.Type == events.SandboxStopped) {
				order = append(order, string(e.Type))
			}
		}
		log.mu.Unlock()
		if len(order) != 7 || order[5] != string(events.SecurityViolation) || order[6] != string(events.SandboxStopped) {
			t.Fatalf("events at the stop: %v", order)
		}
		if n := sumCounts(t, log.of(events.SecurityViolation, s.ID, "exe_held")); n != 40 {
			t.Fatalf("the events stand for %d reports, want 40", n)
		}
	})
}
