package sandbox_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// The sandbox cannot forge the host's records (docs/security.md, section
// 7): hostile cells in real sandboxes.

// forgedEndBurn ends its execution by writing the driver's end itself
// (the marker is on the driver's frame, "done" goes on the control pipe),
// then burns 5 s of CPU time in a thread and writes /tmp/burnt when done.
// Its interpreter's pid is in /tmp/pid.
const forgedEndBurn = `import os, sys, threading, time
open('/tmp/pid', 'w').write(str(os.getpid()))
f = sys._getframe()
while 'req' not in f.f_locals:
    f = f.f_back
mark = ('\x1e' + f.f_locals['req']['marker'] + '\n').encode()
sys.stdout.flush(); sys.stderr.flush()
os.write(1, mark); os.write(2, mark); os.write(4, b'{"type":"done"}\n')
def burn():
    t = time.thread_time()
    while time.thread_time() - t < 5: pass
    open('/tmp/burnt', 'w').write('%.2f' % (time.thread_time() - t))
threading.Thread(target=burn).start()
`

// TestRecordsForgedEndCPU: under cpu_time_seconds 2, a cell forges its
// own execution's end and burns 5 s of CPU time in a thread. The control,
// a sandbox without the limit, shows the attack: the execution returns at
// once as a success and the thread burns all of it. Under the limit the
// agent goes on counting after the end and kills the interpreter near
// 2 s; the next execution reports ERR_CPU_TIME_EXCEEDED (and a
// resource_exceeded) instead of running, and the one after runs afresh.
func TestRecordsForgedEndCPU(t *testing.T) {
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	ctx := context.Background()
	// burn runs the cell in s and waits until its burn is done or its
	// interpreter gone: it reports the CPU time the sandbox used
	// meanwhile, and whether the thread finished its burn.
	burn := func(t *testing.T, s *sandbox.Sandbox) (time.Duration, bool) {
		t.Helper()
		u0, err := s.Usage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: forgedEndBurn}, nil)
		if err != nil || ex.Status != sandbox.ExecSuccess || ex.CPUTimeMS > 1000 {
			t.Fatalf("the forged end did not end the execution at once: %+v, %v", ex, err)
		}
		var pid bytes.Buffer
		if _, err := s.ReadFile(ctx, "/tmp/pid", &pid, 64); err != nil {
			t.Fatal(err)
		}
		// Until the burn is done, or the interpreter is gone.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var b bytes.Buffer
			_, errBurnt := s.ReadFile(ctx, "/tmp/burnt", &b, 64)
			_, errAlive := s.ReadFile(ctx, "/proc/"+pid.String()+"/stat", &b, 4096)
			if errBurnt == nil || errAlive != nil {
				u, err := s.Usage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return time.Duration(u.CPUNanos - u0.CPUNanos), errBurnt == nil
			}
			if time.Now().After(deadline) {
				t.Fatalf("the burning thread still runs after 2 minutes")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	t.Run("control", func(t *testing.T) {
		free := newSandbox(t, m, sandbox.CreateOptions{})
		used, finished := burn(t, free)
		if !finished || used < 4500*time.Millisecond {
			t.Fatalf("unconfined, the thread burnt %s (finished %v)", used, finished)
		}
	})

	t.Run("cpu_time_seconds", func(t *testing.T) {
		s := newSandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{CPUTimeSeconds: pf(2)}}})
		used, finished := burn(t, s)
		if finished || used > 3500*time.Millisecond {
			t.Fatalf("past a forged end, the thread burnt %s (finished %v) under a limit of 2 s", used, finished)
		}
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{ID: "exe_after_forged_end", Code: "1 + 1"}, nil)
		if err != nil || apierr.Code(ex.ErrorCode) != apierr.CPUTimeExceeded || ex.Error == nil ||
			!strings.Contains(ex.Error.Value, "previous execution") || ex.CPUTimeMS < 2000 || len(ex.Results) != 0 {
			t.Fatalf("the execution after the kill: %+v %+v, %v", ex, ex.Error, err)
		}
		ev := log.of(events.ResourceExceeded, s.ID, "exe_after_forged_end")
		if len(ev) != 1 || ev[0].Details["resource"] != events.ResourceCPUTime || ev[0].Source != events.SourceHost {
			t.Fatalf("events %+v", ev)
		}
		if ex := run(t, s, "python", "1 + 1"); mainText(ex) != "2" {
			t.Fatalf("the execution after the report: %+v %+v", ex, ex.Error)
		}
	})
}

// TestRecordsForgedReports: a cell forges 10,000 security_violation
// reports on its driver's control pipe; the store gets at most 100, each
// marked as the sandbox's word, and the rest are counted. The control is
// an engine whose bounds are above the flood: every one becomes an event.
func TestRecordsForgedReports(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits sandbox.ReportLimits
		want   int
	}{
		{"control", sandbox.ReportLimits{PerExecution: 1 << 30, PerMinute: 1 << 30}, 10000},
		{"bounded", sandbox.ReportLimits{}, sandbox.DefaultReportsPerExecution},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &policyLog{}
			// The report bounds are what is tried here: the events'
			// coalescing (TestEventsCoalesced) is lifted.
			m := runcEngine(t, func(c *sandbox.Config) {
				c.Events, c.Reports = log, tc.limits
				c.EventRate = sandbox.EventRate{Burst: 1 << 30, PerMinute: 1 << 30}
			})
			s := newSandbox(t, m, sandbox.CreateOptions{})
			ex, err := s.Execute(context.Background(), sandbox.ExecuteRequest{ID: "exe_forge", Code: forgeReports(10000)}, nil)
			if err != nil || ex.Status != sandbox.ExecSuccess {
				t.Fatalf("%+v, %v", ex, err)
			}
			got := log.of(events.SecurityViolation, s.ID, "exe_forge")
			if len(got) != tc.want {
				t.Fatalf("%d security_violation events, want %d", len(got), tc.want)
			}
			for _, e := range got {
				if e.Source != events.SourceSandbox {
					t.Fatalf("a forged report recorded as %+v", e)
				}
			}
			dropped := log.of(events.ResourceExceeded, s.ID, "exe_forge")
			if tc.want < 10000 && (len(dropped) != 1 || dropped[0].Details["dropped"] != 10000-tc.want) {
				t.Fatalf("the dropped reports: %+v", dropped)
			}
		})
	}
}
