package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// forgeReports is a cell that writes n violation reports on its driver's
// control pipe, as the driver's own hooks do, each with its own target.
func forgeReports(n int) string {
	return fmt.Sprintf("import os\nfor i in range(%d):\n"+
		"    os.write(4, b'{\"type\":\"violation\",\"kind\":\"syscall_denied\",\"target\":\"forged %%d\"}\\n' %% i)\n", n)
}

// TestForgedReportsCapped: one cell forges 10,000 security_violation
// reports. Without bounds (the control: limits far above the flood) every
// one becomes an event, in the store all tenants share and at every
// webhook. With the defaults, an execution keeps 100, each marked as the
// sandbox's word (source "sandbox"), and the rest are counted: the
// execution.finished says how many, and one resource_exceeded of the
// host's stands for them. A sandbox's executions share a budget per
// minute: the next floods keep only what is left of it. (The events that
// pass these bounds are coalesced by kind after them, TestEventsCoalesced:
// that rate is out of the way here.)
func TestForgedReportsCapped(t *testing.T) {
	t.Parallel()
	const flood = 10000
	ctx := context.Background()
	noRate := sandbox.EventRate{Burst: 1 << 30, PerMinute: 1 << 30}
	run := func(t *testing.T, s *sandbox.Sandbox, id string) {
		t.Helper()
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: id, Code: forgeReports(flood)}, nil)
		if err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
	}

	t.Run("control", func(t *testing.T) {
		t.Parallel()
		log := &policyLog{}
		m, _ := fakeEngine(t, sandbox.Config{Events: log, Reports: sandbox.ReportLimits{PerExecution: 1 << 30, PerMinute: 1 << 30}, EventRate: noRate})
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		run(t, s, "exe_control")
		if n := len(log.of(events.SecurityViolation, s.ID, "exe_control")); n != flood {
			t.Fatalf("unbounded, the forged reports made %d events, want %d", n, flood)
		}
	})

	t.Run("bounded", func(t *testing.T) {
		t.Parallel()
		log := &policyLog{}
		m, _ := fakeEngine(t, sandbox.Config{Events: log, Reports: sandbox.ReportLimits{PerMinute: 150}, EventRate: noRate})
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for i, want := range []int{sandbox.DefaultReportsPerExecution, 150 - sandbox.DefaultReportsPerExecution} {
			id := fmt.Sprintf("exe_flood%d", i)
			run(t, s, id)
			got := log.of(events.SecurityViolation, s.ID, id)
			// The budget refills at 150 a minute meanwhile.
			refill := 0
			if i > 0 {
				refill = int(time.Since(start).Seconds()*150/60) + 1
			}
			if len(got) < want || len(got) > want+refill {
				t.Fatalf("execution %d: %d security_violation events, want %d (+%d refilled)", i, len(got), want, refill)
			}
			want = len(got)
			for _, e := range got {
				if e.Source != events.SourceSandbox || e.Details["kind"] != "syscall_denied" {
					t.Fatalf("a forged report recorded as %+v", e)
				}
			}
			fin := log.of(events.ExecutionFinished, s.ID, id)
			if len(fin) != 1 || fin[0].Source != events.SourceHost || fin[0].Details["reports_dropped"] != flood-want {
				t.Fatalf("execution %d: execution.finished %+v", i, fin)
			}
			ex := log.of(events.ResourceExceeded, s.ID, id)
			if len(ex) != 1 || ex[0].Source != events.SourceHost || ex[0].Details["resource"] != events.ResourceReports ||
				ex[0].Details["dropped"] != flood-want || ex[0].Details["observed"] != flood ||
				!strings.Contains(fmt.Sprint(ex[0].Details["rule"]), []string{"per execution", "per minute"}[i]) {
				t.Fatalf("execution %d: resource_exceeded %+v", i, ex)
			}
		}
		// A forged report of a resource becomes a resource_exceeded
		// marked as the sandbox's word (in another sandbox: this one's
		// budget is spent).
		fake := "import os\nos.write(4, b'{\"type\":\"violation\",\"kind\":\"resource\",\"target\":\"disk\"}\\n')"
		m2, _ := fakeEngine(t, sandbox.Config{Events: log})
		s2, err := m2.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ex, err := s2.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_resource", Code: fake}, nil); err != nil || ex.Status != sandbox.ExecSuccess {
			t.Fatalf("Execute = %+v, %v", ex, err)
		}
		if ev := log.of(events.ResourceExceeded, s2.ID, "exe_resource"); len(ev) != 1 || ev[0].Source != events.SourceSandbox ||
			ev[0].Details["resource"] != events.ResourceDisk {
			t.Fatalf("a forged resource report: %+v", ev)
		}
		// An honest execution goes on as ever.
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "1 + 1"}, nil)
		if err != nil || ex.Status != sandbox.ExecSuccess || len(ex.Results) != 1 || ex.Results[0].Text != "2" {
			t.Fatalf("after the floods: %+v, %v", ex, err)
		}
	})
}
