package sandbox

import (
	"context"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/lang"
)

// Execute runs code in a context of the sandbox and returns what it did.
// An error means the execution could not be run; code that fails, times
// out or runs out of memory is reported in the Execution.
//
// With onEvent nil, the Execution holds the output and results. Otherwise
// every event (stdout, stderr, result, error, and dropped for a result not
// delivered) goes to onEvent as it happens and nothing of it is kept: the
// Execution's Stdout, Stderr and Results stay empty. An error from onEvent
// (the client is gone or too slow) stops the execution, which the agent
// then interrupts, and is returned.
//
// Around the execution itself (execute.go) it emits execution.started and
// execution.finished (and resource_exceeded for a limit the execution hit).
func (s *Sandbox) Execute(ctx context.Context, req ExecuteRequest, onEvent func(agentproto.Event) error) (*Execution, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = "exe_" + newID()
	}
	language := req.Language
	if language == "" && req.ContextID == "" {
		language = lang.Python
	}
	if language == "" {
		if l, ok := s.ctxLangs.Load(req.ContextID); ok {
			language = l.(string)
		}
	}
	s.emit(events.ExecutionStarted, req.ID, map[string]any{"language": language, "context_id": req.ContextID})
	// The policy's output filtering (outfilter.go) sits between the
	// execution and the caller.
	of := s.newOutputFilter(req, onEvent)
	if of != nil && onEvent != nil {
		onEvent = of.event
	}
	ex, err := s.execute(ctx, req, onEvent)
	if of != nil && ex != nil {
		of.finish(ex)
	}
	s.executionFinished(req, language, ex, err, of)
	return ex, err
}

// executionFinished emits execution.finished, and resource_exceeded when
// the execution hit a limit. lang is the execution's language as far as
// the host knows it ("" for a context it has not seen).
func (s *Sandbox) executionFinished(req ExecuteRequest, lang string, ex *Execution, err error, of *outputFilter) {
	if err != nil {
		code := apierr.CodeOf(err)
		s.emit(events.ExecutionFinished, req.ID, map[string]any{"status": "failed", "error_code": code, "language": lang})
		if code == apierr.SandboxState && s.State() != StateRunning && s.Info().StopReason == reasonOOM {
			s.mu.Lock()
			peak := s.seen.memoryPeak
			s.mu.Unlock()
			s.emit(events.ResourceExceeded, req.ID, map[string]any{"resource": events.ResourceMemory,
				"limit": s.CurrentLimits().MemoryBytes, "observed": peak, "unit": "bytes"})
		}
		return
	}
	finished := map[string]any{"status": ex.Status, "error_code": apierr.Code(ex.ErrorCode), "language": lang,
		"duration_ms": ex.ExecutionTimeMS, "cpu_time_ms": ex.CPUTimeMS, "peak_memory_bytes": ex.PeakMemoryBytes}
	if ex.reports.dropped > 0 {
		finished["reports_dropped"] = ex.reports.dropped
	}
	s.emit(events.ExecutionFinished, req.ID, finished)
	s.reportsDropped(req.ID, ex.reports)
	var exceeded map[string]any
	switch {
	case ex.Status == ExecTimeout:
		timeout := req.Timeout
		if timeout <= 0 {
			timeout = DefaultExecTimeout
		}
		exceeded = map[string]any{"resource": events.ResourceWallTime, "limit": timeout.Milliseconds(),
			"observed": ex.ExecutionTimeMS, "unit": "ms"}
	case ex.ErrorCode == string(apierr.OutputLimit):
		limit := req.MaxOutput
		if limit <= 0 {
			limit = DefaultMaxOutput
		}
		exceeded = map[string]any{"resource": events.ResourceOutput, "limit": limit,
			"observed": ex.outputBytes, "unit": "bytes"}
	case ex.ErrorCode == string(apierr.CPUTimeExceeded):
		exceeded = map[string]any{"resource": events.ResourceCPUTime, "limit": s.Policy().CPUTime().Milliseconds(),
			"observed": ex.CPUTimeMS, "unit": "ms"}
	case ex.ErrorCode == string(apierr.OutOfMemory):
		exceeded = map[string]any{"resource": events.ResourceMemory, "limit": s.CurrentLimits().MemoryBytes,
			"observed": max(ex.memoryPeak, ex.PeakMemoryBytes), "unit": "bytes"}
	}
	if exceeded != nil {
		s.emit(events.ResourceExceeded, req.ID, exceeded)
	}
	if ex.outputCut {
		// Cut at the cap, the code ran on (to its end or its timeout).
		limit := req.MaxOutput
		if limit <= 0 {
			limit = DefaultMaxOutput
		}
		s.emit(events.ResourceExceeded, req.ID, map[string]any{"resource": events.ResourceOutput, "limit": limit,
			"observed": ex.outputBytes, "unit": "bytes"})
	}
	if of != nil && of.cap.Dropped > 0 {
		s.emit(events.ResourceExceeded, req.ID, map[string]any{"resource": events.ResourceOutput, "limit": of.cap.Limit,
			"observed": of.cap.Used + of.cap.Dropped, "unit": "bytes", "rule": "output_filtering.max_output_length"})
	}
}
