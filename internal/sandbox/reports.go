package sandbox

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/events"
)

// What a sandbox reports about itself: the violations its language
// drivers relay (which the code in it can write too, any number and any
// text) and the agent's own seccomp refusals (whose number and targets
// the code chooses) become security_violation and resource_exceeded
// events, kept in the store every tenant shares and sent to every
// webhook. They are the sandbox's word: each event says who saw it
// (Source: "sandbox" or "agent"; the engine's own are "host", the
// gateway's "gateway"), and the engine keeps at most
// ReportLimits.PerExecution of them per execution and PerMinute per
// sandbox. The rest are counted and dropped: the execution's
// execution.finished says how many ("reports_dropped"), and one
// resource_exceeded (resource "reports", the host's) stands for them. A
// report never ends an execution nor changes a limit (a policy's
// on_violation "terminate" stops the sandbox at the first one kept: the
// code could stop its own sandbox anyway).

// ReportLimits bound the events made of a sandbox's reports. Zero fields
// take the defaults in brackets.
type ReportLimits struct {
	PerExecution int   // per execution [DefaultReportsPerExecution]
	PerMinute    int64 // per sandbox, over all its executions, with a burst of as many [DefaultReportsPerMinute]
}

// Defaults of ReportLimits.
const (
	DefaultReportsPerExecution = 100
	DefaultReportsPerMinute    = 300
)

func (l ReportLimits) withDefaults() ReportLimits {
	if l.PerExecution <= 0 {
		l.PerExecution = DefaultReportsPerExecution
	}
	if l.PerMinute <= 0 {
		l.PerMinute = DefaultReportsPerMinute
	}
	return l
}

// execReports counts one execution's reports.
type execReports struct {
	kept, dropped int
	rule          string // the bound that dropped the first one dropped
}

// reportLimiter is a sandbox's per-minute budget of reports, made at its
// first report.
func (s *Sandbox) reportLimiter() *rate.Limiter {
	s.reportsOnce.Do(func() {
		n := s.m.cfg.Reports.PerMinute
		s.reports = rate.NewLimiter(rate.Limit(float64(n)/60), int(n))
	})
	return s.reports
}

// report decides whether one report of the execution becomes an event,
// and counts it.
func (r *execRun) report() bool {
	c := &r.ex.reports
	lim := r.s.m.cfg.Reports
	rule := ""
	switch {
	case c.kept >= lim.PerExecution:
		rule = fmt.Sprintf("at most %d reports of the sandbox per execution", lim.PerExecution)
	case !r.s.reportLimiter().Allow():
		rule = fmt.Sprintf("at most %d reports of the sandbox per minute", lim.PerMinute)
	}
	if rule == "" {
		c.kept++
		return true
	}
	if c.dropped == 0 {
		c.rule = rule
	}
	c.dropped++
	return false
}

// reportsDropped emits the resource_exceeded that stands for the
// reports of an execution that were dropped, if any.
func (s *Sandbox) reportsDropped(execID string, c execReports) {
	if c.dropped == 0 {
		return
	}
	s.emit(events.ResourceExceeded, execID, map[string]any{"resource": events.ResourceReports,
		"limit": s.m.cfg.Reports.PerExecution, "observed": c.kept + c.dropped, "dropped": c.dropped, "unit": "events", "rule": c.rule})
}

// reportSource is the events.Source of what a violation report says.
func reportSource(v *agentproto.Violation) string {
	if v.Source == agentproto.SourceAgent {
		return events.SourceAgent
	}
	return events.SourceSandbox
}

// emitFrom sends one of the sandbox's events recorded by source.
func (s *Sandbox) emitFrom(source string, typ events.Type, executionID string, details map[string]any) {
	s.m.cfg.Events.Emit(events.Event{Timestamp: time.Now(), Type: typ, Source: source, SandboxID: s.ID, Owner: s.owner,
		ExecutionID: executionID, Details: details})
}

// gatewayEvents marks what an egress gateway emits as the gateway's.
type gatewayEvents struct{ out events.Sink }

// Emit implements events.Sink.
func (g gatewayEvents) Emit(e events.Event) {
	if e.Source == "" {
		e.Source = events.SourceGateway
	}
	g.out.Emit(e)
}
