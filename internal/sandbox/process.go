package sandbox

import (
	"context"
	"errors"
	"io"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
)

// ProcessSpec describes a command to run in a sandbox. Its User is
// "user" (the default: uid 1000, no capabilities), "root" (root inside the
// sandbox, holding the agent's few capabilities, all confined to the
// sandbox's user namespace) or another name from the sandbox's
// /etc/passwd.
type ProcessSpec = agentproto.ProcessSpec

// ProcessResult is how a process ended.
type ProcessResult struct {
	PID       int               `json:"pid"`
	ExitCode  int               `json:"exit_code"`
	Signal    int               `json:"signal,omitempty"`
	Status    string            `json:"status,omitempty"` // "timeout" or "output_limit" when the agent stopped it
	Truncated bool              `json:"truncated,omitempty"`
	Stats     *agentproto.Stats `json:"stats,omitempty"`
}

// Run starts a command and streams its events (start, stdout, stderr) to
// onEvent until it ends. Cancelling ctx stops the streaming, not the
// process: use Signal to stop it.
func (s *Sandbox) Run(ctx context.Context, spec ProcessSpec, onEvent func(agentproto.Event)) (*ProcessResult, error) {
	end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	if spec.Cmd == "" {
		return nil, apierr.New(apierr.BadRequest, "cmd is required")
	}
	if err := s.m.admit(s, WorkCommand); err != nil {
		return nil, err
	}
	res := &ProcessResult{}
	// The policy's output filtering sits between the command and the
	// caller (outfilter.go).
	cf := s.newCommandFilter(spec.Env, onEvent)
	if cf != nil {
		onEvent = cf.event
	}
	done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpProcessStart, Process: &spec}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventStart {
				res.PID = ev.PID
			}
			return s.forward(ctx, ev, onEvent)
		}}, callOptions{})
	if err != nil {
		if cf != nil {
			cf.finish(s, nil)
		}
		return nil, s.gone(s.startFailed(err))
	}
	return s.ended(finish(res, done), cf, spec.MaxOutputBytes), nil
}

// ended finishes a command's filtered stream and reports the limits it
// hit: the agent's output cap, and (when it failed) memory, pids and disk.
func (s *Sandbox) ended(res *ProcessResult, cf *commandFilter, maxOutput int64) *ProcessResult {
	if cf != nil {
		cf.finish(s, res)
	}
	if res.Status == agentproto.StatusOutputLimit {
		// The agent stopped it at the cap; what it would have written
		// past it is not known.
		d := map[string]any{"resource": events.ResourceOutput, "unit": "bytes", "pid": res.PID}
		if maxOutput > 0 {
			d["limit"], d["observed"] = maxOutput, maxOutput
		}
		s.emit(events.ResourceExceeded, "", d)
	}
	s.commandEnded(res)
	return res
}

// errStarted stops reading a process's stream once it has started.
var errStarted = errors.New("started")

// Start starts a command in the background and returns its pid.
func (s *Sandbox) Start(ctx context.Context, spec ProcessSpec) (int, error) {
	end, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer end()
	if spec.Cmd == "" {
		return 0, apierr.New(apierr.BadRequest, "cmd is required")
	}
	if err := s.m.admit(s, WorkCommand); err != nil {
		return 0, err
	}
	pid := 0
	_, err = s.agent.call(ctx, agentproto.Request{Op: agentproto.OpProcessStart, Process: &spec}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventStart {
				pid = ev.PID
				return errStarted
			}
			return nil
		}}, callOptions{idle: agentIdle})
	if errors.Is(err, errStarted) {
		if len(spec.Env) > 0 {
			s.procEnv.Store(pid, spec.Env) // its secrets, for the output filter of Connect
		}
		return pid, nil
	}
	if err == nil {
		return 0, apierr.New(apierr.Internal, "the process ended before it started")
	}
	return 0, s.gone(s.startFailed(err))
}

// startFailed returns the error of a process start the agent refused:
// ERR_PROCESS_LIMIT, with the pids limit reported as a command that
// failed reports the limits it hit, when the tenant's tasks are at it
// (the fork failed with EAGAIN, counted in the cgroup's pids.events);
// err itself otherwise.
func (s *Sandbox) startFailed(err error) error {
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Code != apierr.Internal {
		return err // the agent gone, or a request it refused for another reason
	}
	u, uerr := s.usage(context.Background())
	if uerr != nil || !s.reportLimits("", u, false, false) {
		return err
	}
	return apierr.Wrap(err, apierr.ProcessLimit, "the sandbox holds its limit of %d processes (pids): a new one is refused until some end",
		s.CurrentLimits().Pids)
}

// Connect streams a running process's output from now until it ends.
func (s *Sandbox) Connect(ctx context.Context, pid int, onEvent func(agentproto.Event)) (*ProcessResult, error) {
	ctx = WithFollower(ctx) // a pause cuts it; the process runs on
	end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	var env map[string]string
	if v, ok := s.procEnv.Load(pid); ok {
		env = v.(map[string]string)
	}
	cf := s.newCommandFilter(env, onEvent)
	if cf != nil {
		onEvent = cf.event
	}
	done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpProcessConnect, PID: pid}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			return s.forward(ctx, ev, onEvent)
		}}, callOptions{})
	if err != nil {
		if cf != nil {
			cf.finish(s, nil)
		}
		return nil, s.gone(err)
	}
	s.procEnv.Delete(pid)
	return s.ended(finish(&ProcessResult{PID: pid}, done), cf, 0), nil
}

// forward passes a process's event on, its output at the sandbox's
// output rate.
func (s *Sandbox) forward(ctx context.Context, ev agentproto.Event, onEvent func(agentproto.Event)) error {
	if ev.Type == agentproto.EventStdout || ev.Type == agentproto.EventStderr || ev.Type == agentproto.EventPTY {
		if err := s.waitOutput(ctx, len(ev.Data)); err != nil {
			return err
		}
	}
	if onEvent != nil {
		onEvent(ev)
	}
	return nil
}

func finish(res *ProcessResult, done agentproto.Event) *ProcessResult {
	if done.ExitCode != nil {
		res.ExitCode = *done.ExitCode
	}
	res.Signal = done.Signal
	if done.Status == agentproto.StatusTimeout || done.Status == agentproto.StatusOutputLimit {
		res.Status = done.Status
	}
	res.Truncated = done.Truncated
	res.Stats = done.Stats
	return res
}

// SendInput writes to a process's stdin (started with Stdin: true); eof closes it.
func (s *Sandbox) SendInput(ctx context.Context, pid int, data []byte, eof bool) error {
	return s.simple(ctx, agentproto.Request{Op: agentproto.OpProcessInput, PID: pid, Data: data, EOF: eof}, nil)
}

// Resize changes the size of the terminal of a process started with one
// (ProcessSpec.PTY).
func (s *Sandbox) Resize(ctx context.Context, pid int, size agentproto.TermSize) error {
	return s.simple(ctx, agentproto.Request{Op: agentproto.OpProcessResize, PID: pid, Size: &size}, nil)
}

// Signal sends a signal to a process's group.
func (s *Sandbox) Signal(ctx context.Context, pid, signal int) error {
	return s.simple(ctx, agentproto.Request{Op: agentproto.OpProcessSignal, PID: pid, Signal: signal}, nil)
}

// Processes lists the processes started through the agent that still run.
func (s *Sandbox) Processes(ctx context.Context) ([]agentproto.ProcessInfo, error) {
	var done agentproto.Event
	err := s.simple(ctx, agentproto.Request{Op: agentproto.OpProcessList}, &done)
	if done.Processes == nil {
		done.Processes = []agentproto.ProcessInfo{}
	}
	return done.Processes, err
}

// CreateContext starts a code context.
func (s *Sandbox) CreateContext(ctx context.Context, spec agentproto.ContextSpec) (agentproto.ContextInfo, error) {
	var done agentproto.Event
	err := s.simple(ctx, agentproto.Request{Op: agentproto.OpContextCreate, Context: &spec}, &done)
	info := contextInfo(done)
	if err == nil {
		s.ctxLangs.Store(info.ID, info.Language)
	}
	return info, err
}

// Contexts lists the sandbox's code contexts.
func (s *Sandbox) Contexts(ctx context.Context) ([]agentproto.ContextInfo, error) {
	var done agentproto.Event
	err := s.simple(ctx, agentproto.Request{Op: agentproto.OpContextList}, &done)
	if done.Contexts == nil {
		done.Contexts = []agentproto.ContextInfo{}
	}
	for _, c := range done.Contexts {
		s.ctxLangs.Store(c.ID, c.Language)
	}
	return done.Contexts, err
}

// RestartContext restarts a context's interpreter: its state is gone.
func (s *Sandbox) RestartContext(ctx context.Context, id string) (agentproto.ContextInfo, error) {
	var done agentproto.Event
	err := s.simple(ctx, agentproto.Request{Op: agentproto.OpContextRestart, ContextID: id}, &done)
	return contextInfo(done), err
}

// DeleteContext stops a context.
func (s *Sandbox) DeleteContext(ctx context.Context, id string) error {
	err := s.simple(ctx, agentproto.Request{Op: agentproto.OpContextDelete, ContextID: id}, nil)
	if err == nil {
		s.ctxLangs.Delete(id)
	}
	return err
}

func contextInfo(ev agentproto.Event) agentproto.ContextInfo {
	if ev.Context == nil {
		return agentproto.ContextInfo{}
	}
	return *ev.Context
}

// simple sends a request that streams nothing and keeps its Done.
func (s *Sandbox) simple(ctx context.Context, req agentproto.Request, done *agentproto.Event) error {
	return s.do(ctx, req, nil, nil, nil, done)
}

// do sends one request to the agent of a running sandbox, keeps its Done
// and turns a vanished agent into a stopped sandbox. The call must make
// progress: each of its reads and writes has agentIdle.
func (s *Sandbox) do(ctx context.Context, req agentproto.Request, body io.Reader,
	onEvent func(agentproto.Event) error, onData func([]byte) error, done *agentproto.Event) error {
	end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	ev, err := s.agent.call(ctx, req, body, agentproto.Handlers{Event: onEvent, Data: onData}, callOptions{idle: agentIdle})
	if done != nil {
		*done = ev
	}
	return s.gone(err)
}
