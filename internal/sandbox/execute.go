package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/typescript"
)

// Execution statuses.
const (
	ExecSuccess = "success"
	ExecError   = "error"
	ExecTimeout = "timeout"
)

// Default bounds of one execution.
const (
	DefaultExecTimeout = 30 * time.Second
	DefaultMaxOutput   = 1 << 20
	// DefaultMaxResults and DefaultMaxResultBytes bound the rich results
	// one execution delivers, in number and in total size; one result is
	// at most agentproto.MaxResult.
	DefaultMaxResults     = 1000
	DefaultMaxResultBytes = 16 << 20
)

// agentGrace is how long past an execution's own timeout the host waits
// for the agent before giving up on it (a variable for tests).
var agentGrace = 10 * time.Second

// ExecuteRequest asks for code to run in a context.
type ExecuteRequest struct {
	ID        string // names the execution in its events; generated when empty
	Code      string
	Language  string // used when ContextID is empty; default python
	ContextID string
	Env       map[string]string
	Timeout   time.Duration // [DefaultExecTimeout]
	MaxOutput int64         // bytes of stdout plus stderr [DefaultMaxOutput]
	// MaxResults and MaxResultBytes bound the results delivered (streamed
	// or kept); the rest are dropped and counted in Execution.Dropped.
	MaxResults     int   // [DefaultMaxResults]
	MaxResultBytes int64 // the sum of the results' sizes [DefaultMaxResultBytes]
}

// Execution is what one execution did: the /v1 API's Execution (its
// ErrorCode an apierr code: why it did not end normally), and what the
// engine keeps of it for itself.
type Execution struct {
	api.Execution

	outputBytes int64       // stdout plus stderr seen, kept or streamed
	outputCut   bool        // the kernel cut the output at MaxOutput and the code ran on
	memoryPeak  int64       // the cgroup's peak memory, read after an OOM kill
	reports     execReports // the sandbox's violation reports, kept and dropped (reports.go)
}

// Dropped counts the results an execution produced but did not deliver:
// too large for the protocol, past the execution's bounds, or more than
// the engine could hold.
type Dropped = api.Dropped

// execute is Execute (execute_hooks.go) without the events around it.
func (s *Sandbox) execute(ctx context.Context, req ExecuteRequest, onEvent func(agentproto.Event) error) (*Execution, error) {
	end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	tr := execTraceFrom(ctx)
	if tr != nil {
		tr.Start = time.Now()
	}
	if err := s.takeExecution(ctx); err != nil {
		return nil, err
	}
	if err := s.m.admit(s, WorkExecution); err != nil {
		return nil, err
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultExecTimeout
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = DefaultMaxOutput
	}
	if req.MaxResults <= 0 {
		req.MaxResults = DefaultMaxResults
	}
	if req.MaxResultBytes <= 0 {
		req.MaxResultBytes = DefaultMaxResultBytes
	}
	if req.ContextID == "" && req.Language == "" {
		req.Language = lang.Python
	}
	if req.ContextID == "" && isTypeScript(req.Language) || req.ContextID != "" && s.contextLanguage(ctx, req.ContextID) == lang.TypeScript {
		js, perr := typescript.Transpile(req.Code)
		if perr != nil {
			if onEvent != nil {
				if err := onEvent(agentproto.Event{Type: agentproto.EventError, Error: perr}); err != nil {
					return nil, err
				}
			}
			return &Execution{Execution: api.Execution{Status: ExecError, Results: []agentproto.Result{}, Error: perr}}, nil
		}
		req.Code = js
	}
	// The OOM-kill count before the execution tells an out-of-memory kill
	// from another death. It is read while the request goes to the agent
	// (an allocation large enough to be killed takes far longer), from
	// one cgroup file where the runtime can (runtime.OOMCounter): all of
	// Usage cost about 0.35 ms of CPU per execution on a cgroup v1 host.
	// A Pod's count comes from its agent (usage.go), one more call per
	// execution, in parallel with it.
	beforeCh := make(chan uint64, 1)
	go func(ctx context.Context) { beforeCh <- s.oomKills(ctx) }(ctx)

	ctx, cancel := context.WithTimeout(ctx, req.Timeout+agentGrace)
	defer cancel()
	spec := &agentproto.ExecuteSpec{
		Code: req.Code, ContextID: req.ContextID, Language: req.Language, Env: req.Env,
		TimeoutMS: req.Timeout.Milliseconds(), MaxOutputBytes: req.MaxOutput,
	}
	s.executePolicy(spec)
	// A CPU time limit is counted on the sandbox's cgroup (cpu.go), which
	// stops the call past it.
	cpu := s.newCPUWatch(spec.Policy)
	var stopCPU context.CancelCauseFunc
	if cpu != nil {
		ctx, stopCPU = context.WithCancelCause(ctx)
		defer stopCPU(nil)
		cpu.run(ctx, stopCPU)
	}
	started := time.Now()
	run := &execRun{ctx: ctx, s: s, req: req, stream: onEvent, ex: &Execution{Execution: api.Execution{Results: []agentproto.Result{}}}}
	run.violation = func(v *agentproto.Violation) {
		run.netDenied = run.netDenied || v.Kind == events.KindNetworkDenied
		s.violation(req.ID, v)
	}
	run.hold.sandbox, run.hold.engine = s.resultBudgets()
	defer run.hold.release()
	handle := run.handle
	if tr != nil {
		handle = func(ev agentproto.Event) error {
			switch {
			case tr.First.IsZero():
				tr.First = time.Now()
			case ev.Type == agentproto.EventResult && tr.Result.IsZero():
				tr.Result = time.Now()
			}
			return run.handle(ev)
		}
	}
	done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpExecute, Execute: spec},
		nil, agentproto.Handlers{Event: handle, Admit: run.hold.admit(ctx)}, callOptions{trace: tr})
	if tr != nil {
		tr.Done = time.Now()
		if done.Stats != nil {
			tr.KernelMS = done.Stats.DurationMS
		}
	}
	var cpuUsed time.Duration
	if cpu != nil {
		stopCPU(nil)
		cpuUsed = cpu.finish()
		if errors.Is(context.Cause(ctx), errCPUTime) {
			// The host stopped it: the agent's Done, if any, is not read.
			ex := run.ex
			ex.Stdout, ex.Stderr = run.stdout.String(), run.stderr.String()
			ex.ExecutionTimeMS = float64(time.Since(started).Microseconds()) / 1000
			cpu.exceeded(ex, cpuUsed)
			if onEvent != nil {
				if err := onEvent(agentproto.Event{Type: agentproto.EventError, Error: ex.Error}); err != nil {
					return nil, err
				}
			}
			return ex, nil
		}
	}
	if err != nil {
		if ctx.Err() != nil && context.Cause(ctx) == context.DeadlineExceeded {
			return nil, apierr.Wrap(err, apierr.SandboxTimeout, "the sandbox did not answer within %s", req.Timeout+agentGrace)
		}
		return nil, s.gone(err)
	}
	ex := run.ex
	ex.Stdout, ex.Stderr = run.stdout.String(), run.stderr.String()
	ex.Truncated = ex.Truncated || done.Truncated
	// The kernel sets Truncated only at the output cap.
	ex.outputCut = done.Truncated && done.Status != agentproto.StatusOutputLimit
	if done.Stats != nil {
		ex.ExecutionTimeMS = done.Stats.DurationMS
		ex.CPUTimeMS = done.Stats.CPUTimeMS
		ex.PeakMemoryBytes = done.Stats.PeakMemoryBytes
	}
	if cpu != nil {
		// The cgroup's count, the one the limit is judged by; but the
		// agent's CPU limit report can be about what the last execution
		// left running after its end, before this one (internal/kernel,
		// idle.go), with that count.
		ex.CPUTimeMS = max(float64(cpuUsed.Microseconds())/1000, agentCPU(done))
	}
	switch done.Status {
	case agentproto.StatusOK:
		ex.Status = ExecSuccess
	case agentproto.StatusCPULimit:
		ex.Status, ex.ErrorCode = ExecError, string(apierr.CPUTimeExceeded)
	case agentproto.StatusTimeout:
		ex.Status, ex.ErrorCode = ExecTimeout, string(apierr.SandboxTimeout)
		if ex.Error == nil {
			ex.Error = &agentproto.ExecError{Name: "TimeoutError", Value: "execution exceeded " + req.Timeout.String()}
		}
	case agentproto.StatusOutputLimit:
		ex.Status, ex.ErrorCode, ex.Truncated = ExecError, string(apierr.OutputLimit), true
		if ex.Error == nil {
			ex.Error = &agentproto.ExecError{Name: "OutputLimitExceeded", Value: "output passed the limit and the execution was stopped"}
		}
	case agentproto.StatusKilled:
		ex.Status = ExecError
		before := <-beforeCh
		after, _ := s.usage(ctx)
		if after.OOMKills > before {
			// The killed interpreter's own high-water mark went with it;
			// the sandbox's cgroup peak is what it reached.
			ex.PeakMemoryBytes = max(ex.PeakMemoryBytes, after.MemoryPeakBytes)
			ex.ErrorCode = string(apierr.OutOfMemory)
			ex.Error = &agentproto.ExecError{Name: "OutOfMemoryError",
				Value: "the code ran out of memory (limit " + mib(s.CurrentLimits().MemoryBytes) + ") and was killed; the context's state is lost"}
			ex.memoryPeak = after.MemoryPeakBytes
		}
		s.reportLimits(req.ID, after, false, false)
	default:
		ex.Status = ExecError
	}
	if ex.ErrorCode == "" && ex.Error != nil {
		ex.ErrorCode = string(errorCodes[ex.Error.Name])
		// A refusal the code's own error wraps (urllib's URLError around
		// NetworkRestrictedError), or a language with no hook of its own
		// failing to reach the network the sandbox does not have.
		if ex.ErrorCode == "" && (run.netDenied || s.networkRefused(req.ID, ex, string(run.stderrTail))) {
			ex.ErrorCode = string(apierr.NetworkRestricted)
		}
	}
	if ex.Status != ExecSuccess && done.Status != agentproto.StatusKilled {
		// Off the way of executions that went well: a fork refused at
		// the pids limit (limits.go).
		if u, err := s.usage(ctx); err == nil {
			s.reportLimits(req.ID, u, false, false)
		}
	}
	return ex, nil
}

// agentCPU is the CPU time of an agent's CPU limit report, else 0.
func agentCPU(done agentproto.Event) float64 {
	if done.Status != agentproto.StatusCPULimit || done.Stats == nil {
		return 0
	}
	return done.Stats.CPUTimeMS
}

// oomKills is the sandbox's OOM-kill count, 0 when it cannot be read.
func (s *Sandbox) oomKills(ctx context.Context) uint64 {
	if c, ok := s.m.cfg.Runtime.(runtime.OOMCounter); ok {
		n, _ := c.OOMKills(s.ID)
		return n
	}
	u, _ := s.usage(ctx)
	return u.OOMKills
}

// execRun is one execution on its way: every event the agent sends passes
// through handle, the one place where output, results and errors flow on
// the host.
type execRun struct {
	ctx    context.Context
	s      *Sandbox
	req    ExecuteRequest
	stream func(agentproto.Event) error // nil: keep everything in ex
	ex     *Execution
	// violation reports what the code tried against the policy (events).
	violation  func(*agentproto.Violation)
	netDenied  bool   // the kernel reported a network_denied violation
	stderrTail []byte // the last stderrTailSize bytes of a streamed stderr

	stdout, stderr strings.Builder // kept when not streaming
	results        int             // delivered
	resultBytes    int64           // their size
	hold           holding         // budget held by kept results
}

func (r *execRun) handle(ev agentproto.Event) error {
	switch ev.Type {
	case agentproto.EventStdout:
		r.ex.outputBytes += int64(len(ev.Data))
		if err := r.s.waitOutput(r.ctx, len(ev.Data)); err != nil {
			return err
		}
		if r.stream == nil {
			appendCapped(&r.stdout, ev.Data, r.req.MaxOutput+capMarkerRoom)
		}
	case agentproto.EventStderr:
		r.ex.outputBytes += int64(len(ev.Data))
		if err := r.s.waitOutput(r.ctx, len(ev.Data)); err != nil {
			return err
		}
		if r.stream == nil {
			appendCapped(&r.stderr, ev.Data, r.req.MaxOutput+capMarkerRoom)
		} else {
			// The end of a streamed stderr, for networkRefused.
			r.stderrTail = append(r.stderrTail, ev.Data...)
			r.stderrTail = r.stderrTail[max(0, len(r.stderrTail)-stderrTailSize):]
		}
	case agentproto.EventResult:
		if ev.Result == nil {
			return nil
		}
		n := resultSize(ev.Result)
		switch {
		case r.results >= r.req.MaxResults:
			ev = r.drop(agentproto.EventResult, n, fmt.Sprintf("an execution delivers at most %d results", r.req.MaxResults))
		case r.resultBytes+n > r.req.MaxResultBytes:
			ev = r.drop(agentproto.EventResult, n, fmt.Sprintf("an execution delivers at most %d bytes of results", r.req.MaxResultBytes))
		case r.stream == nil && !r.hold.keep(n):
			ev = r.drop(agentproto.EventResult, n, "the server holds too many results at the moment; stream the execution to receive them as they come")
		default:
			r.results++
			r.resultBytes += n
			if r.stream == nil {
				r.ex.Results = append(r.ex.Results, *ev.Result)
			}
		}
	case agentproto.EventDropped:
		if ev.Dropped == nil {
			return nil
		}
		ev = r.drop(ev.Dropped.Type, ev.Dropped.Bytes, ev.Dropped.Reason)
	case agentproto.EventError:
		r.ex.Error = ev.Error
	case agentproto.EventViolation:
		if ev.Violation == nil || !r.report() {
			return nil // dropped and counted (reports.go)
		}
		if r.violation != nil {
			r.violation(ev.Violation)
		}
	}
	if r.stream != nil {
		return r.stream(ev)
	}
	return nil
}

// drop counts a result not delivered and returns the event that says so.
func (r *execRun) drop(typ string, n int64, reason string) agentproto.Event {
	d := r.ex.Dropped
	if d == nil {
		d = &Dropped{Reason: reason}
		r.ex.Dropped = d
	}
	d.Results++
	d.Bytes += n
	r.ex.Truncated = true
	return agentproto.Event{Type: agentproto.EventDropped, Dropped: &agentproto.Dropped{Type: typ, Bytes: n, Reason: reason}}
}

// resultSize is about the size of a result's encoding.
func resultSize(res *agentproto.Result) int64 {
	n := len(res.Text) + len(res.HTML) + len(res.Markdown) + len(res.SVG) + len(res.PNG) +
		len(res.JPEG) + len(res.PDF) + len(res.LaTeX) + len(res.JavaScript)
	if res.JSON != nil {
		b, _ := json.Marshal(res.JSON)
		n += len(b)
	}
	if res.Extra != nil {
		b, _ := json.Marshal(res.Extra)
		n += len(b)
	}
	return int64(n)
}

// capMarkerRoom is the room kept output has past MaxOutput for the
// kernel's agentproto.OutputCapMarker.
const capMarkerRoom = 128

func appendCapped(b *strings.Builder, p []byte, max int64) {
	if room := max - int64(b.Len()); room > 0 {
		if int64(len(p)) > room {
			p = p[:room]
		}
		b.Write(p)
	}
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
