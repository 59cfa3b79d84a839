package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
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
	// agentGrace is how long past an execution's own timeout the host waits
	// for the agent before giving up on it.
	agentGrace = 10 * time.Second
)

// ExecuteRequest asks for code to run in a context.
type ExecuteRequest struct {
	ID        string // names the execution in its events; generated when empty
	Code      string
	Language  string // used when ContextID is empty; default python
	ContextID string
	Env       map[string]string
	Timeout   time.Duration // [DefaultExecTimeout]
	MaxOutput int64         // bytes of stdout plus stderr [DefaultMaxOutput]
}

// Execution is what one execution did.
type Execution struct {
	Status          string                `json:"status"`
	Stdout          string                `json:"stdout"`
	Stderr          string                `json:"stderr"`
	Results         []agentproto.Result   `json:"results"`
	Error           *agentproto.ExecError `json:"error,omitempty"`
	ErrorCode       apierr.Code           `json:"error_code,omitempty"` // why it did not end normally
	Truncated       bool                  `json:"truncated,omitempty"`
	ExecutionTimeMS float64               `json:"execution_time_ms"`
	CPUTimeMS       float64               `json:"cpu_time_ms"`
	PeakMemoryBytes int64                 `json:"peak_memory_bytes"`
}

// execute is Execute (execute_hooks.go) without the events around it.
func (s *Sandbox) execute(ctx context.Context, req ExecuteRequest, onEvent func(agentproto.Event)) (*Execution, error) {
	end, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if req.Timeout <= 0 {
		req.Timeout = DefaultExecTimeout
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = DefaultMaxOutput
	}
	if req.ContextID == "" && req.Language == "" {
		req.Language = "python"
	}
	if req.ContextID == "" && isTypeScript(req.Language) || req.ContextID != "" && s.contextLanguage(ctx, req.ContextID) == "typescript" {
		js, perr := transpileTS(req.Code)
		if perr != nil {
			if onEvent != nil {
				onEvent(agentproto.Event{Type: agentproto.EventError, Error: perr})
			}
			return &Execution{Status: ExecError, Results: []agentproto.Result{}, Error: perr}, nil
		}
		req.Code = js
	}
	// The OOM-kill count before the execution tells an out-of-memory kill
	// from another death. Reading the cgroup costs about 0.4 ms on a
	// cgroup v1 host, so it is read while the request goes to the agent:
	// an allocation large enough to be killed takes far longer than that.
	beforeCh := make(chan runtime.Usage, 1)
	go func(ctx context.Context) {
		u, _ := s.m.cfg.Runtime.Usage(ctx, s.ID)
		beforeCh <- u
	}(ctx)

	ctx, cancel := context.WithTimeout(ctx, req.Timeout+agentGrace)
	defer cancel()
	var stdout, stderr strings.Builder
	ex := &Execution{Results: []agentproto.Result{}}
	done, err := s.agent.call(ctx, agentproto.Request{
		Op: agentproto.OpExecute,
		Execute: &agentproto.ExecuteSpec{
			Code: req.Code, ContextID: req.ContextID, Language: req.Language, Env: req.Env,
			TimeoutMS: req.Timeout.Milliseconds(), MaxOutputBytes: req.MaxOutput,
		},
	}, nil, func(ev agentproto.Event) error {
		switch ev.Type {
		case agentproto.EventStdout:
			appendCapped(&stdout, ev.Data, req.MaxOutput)
		case agentproto.EventStderr:
			appendCapped(&stderr, ev.Data, req.MaxOutput)
		case agentproto.EventResult:
			if ev.Result != nil {
				ex.Results = append(ex.Results, *ev.Result)
			}
		case agentproto.EventError:
			ex.Error = ev.Error
		}
		if onEvent != nil {
			onEvent(ev)
		}
		return nil
	}, nil)
	if err != nil {
		if ctx.Err() != nil && context.Cause(ctx) == context.DeadlineExceeded {
			return nil, apierr.Wrap(err, apierr.SandboxTimeout, "the sandbox did not answer within %s", req.Timeout+agentGrace)
		}
		return nil, s.gone(err)
	}
	ex.Stdout, ex.Stderr, ex.Truncated = stdout.String(), stderr.String(), done.Truncated
	if done.Stats != nil {
		ex.ExecutionTimeMS = done.Stats.DurationMS
		ex.CPUTimeMS = done.Stats.CPUTimeMS
		ex.PeakMemoryBytes = done.Stats.PeakMemoryBytes
	}
	switch done.Status {
	case agentproto.StatusOK:
		ex.Status = ExecSuccess
	case agentproto.StatusTimeout:
		ex.Status, ex.ErrorCode = ExecTimeout, apierr.SandboxTimeout
		if ex.Error == nil {
			ex.Error = &agentproto.ExecError{Name: "TimeoutError", Value: "execution exceeded " + req.Timeout.String()}
		}
	case agentproto.StatusOutputLimit:
		ex.Status, ex.ErrorCode, ex.Truncated = ExecError, apierr.OutputLimit, true
		if ex.Error == nil {
			ex.Error = &agentproto.ExecError{Name: "OutputLimitExceeded", Value: "output passed the limit and the execution was stopped"}
		}
	case agentproto.StatusKilled:
		ex.Status = ExecError
		before := <-beforeCh
		after, _ := s.m.cfg.Runtime.Usage(ctx, s.ID)
		if after.OOMKills > before.OOMKills {
			ex.ErrorCode = apierr.OutOfMemory
			ex.Error = &agentproto.ExecError{Name: "OutOfMemoryError",
				Value: "the code ran out of memory (limit " + mib(s.Limits.MemoryBytes) + ") and was killed; the context's state is lost"}
		}
	default:
		ex.Status = ExecError
	}
	return ex, nil
}

func appendCapped(b *strings.Builder, p []byte, max int64) {
	if room := max - int64(b.Len()); room > 0 {
		if int64(len(p)) > room {
			p = p[:room]
		}
		b.Write(p)
	}
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
