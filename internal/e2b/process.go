package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb/processpbconnect"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// defaultKeepalive is the interval of keepalive events on streams whose
// client did not ask for one (envd's default).
const defaultKeepalive = 90 * time.Second

// processService implements process.Process over the sandbox's agent.
// Processes outlive the stream that started them, as in envd: closing a
// Start stream detaches from the process; SendSignal stops it.
type processService struct {
	processpbconnect.UnimplementedProcessHandler
	h *Handler
}

var _ processpbconnect.ProcessHandler = (*processService)(nil)

func (p *processService) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	procs, err := sandboxFrom(ctx).Processes(ctx)
	if err != nil {
		return nil, connectError(ctx, err)
	}
	out := &processpb.ListResponse{Processes: make([]*processpb.ProcessInfo, 0, len(procs))}
	for _, pi := range procs {
		info := &processpb.ProcessInfo{Pid: uint32(pi.PID), Config: &processpb.ProcessConfig{
			Cmd: pi.Cmd, Args: pi.Args, Envs: pi.Env, Cwd: &pi.Cwd}}
		if pi.Tag != "" {
			info.Tag = &pi.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// eventStream sends ProcessEvents on a server stream, with keepalives
// during silences. Send is safe for concurrent use.
type eventStream struct {
	send   func(*processpb.ProcessEvent) error
	failed func() // called once, when a send fails

	// mu guards err and serialises sends.
	mu  sync.Mutex
	err error // the first failed send
}

func (s *eventStream) event(ev *processpb.ProcessEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if s.err = s.send(ev); s.err != nil && s.failed != nil {
		s.failed()
	}
}

func (s *eventStream) sendErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// keepalive sends keepalive events every interval until stop is closed.
func (s *eventStream) keepalive(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}})
		}
	}
}

// maxKeepalive is the longest keepalive interval a client may ask for.
const maxKeepalive = time.Hour

// keepaliveInterval reads the client's Keepalive-Ping-Interval (whole
// seconds), cut to maxKeepalive: a number of seconds whose nanoseconds
// wrapped int64 once made a negative interval, whose ticker panicked on
// a goroutine nothing recovers, which stopped the server.
func keepaliveInterval(h http.Header) time.Duration {
	if s, err := strconv.ParseInt(h.Get("Keepalive-Ping-Interval"), 10, 64); err == nil && s > 0 {
		return time.Duration(min(s, int64(maxKeepalive/time.Second))) * time.Second
	}
	return defaultKeepalive
}

// forward turns agent events into ProcessEvents.
func (s *eventStream) forward(ev agentproto.Event) {
	switch ev.Type {
	case agentproto.EventStart:
		s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(ev.PID)}}})
	case agentproto.EventStdout:
		s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: &processpb.ProcessEvent_DataEvent{
			Output: &processpb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}}}})
	case agentproto.EventStderr:
		s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: &processpb.ProcessEvent_DataEvent{
			Output: &processpb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}}}})
	case agentproto.EventPTY:
		s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: &processpb.ProcessEvent_DataEvent{
			Output: &processpb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}}}})
	}
}

// end sends the end event of a finished process.
func (s *eventStream) end(res *sandbox.ProcessResult) {
	end := &processpb.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: res.Signal == 0}
	switch {
	case res.Signal != 0:
		end.ExitCode = -1
		end.Status = "signal: " + syscall.Signal(res.Signal).String()
	default:
		end.Status = fmt.Sprintf("exit status %d", res.ExitCode)
	}
	if res.Status == agentproto.StatusTimeout {
		end.Status = "timeout: the process was killed at its deadline"
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		msg := end.Status
		end.Error = &msg
	}
	s.event(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: end}})
}

func (p *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	m := req.Msg
	if m.GetProcess().GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	spec := sandbox.ProcessSpec{
		Cmd: m.Process.Cmd, Args: m.Process.Args, Env: m.Process.Envs, Cwd: m.Process.GetCwd(),
		Tag: m.GetTag(), Stdin: m.Stdin == nil || *m.Stdin,
	}
	if pty := m.GetPty(); pty != nil {
		size, err := termSize(pty)
		if err != nil {
			return err
		}
		spec.PTY, spec.Stdin = size, false
	}
	setUser(&spec, userFrom(ctx))
	if dl, ok := ctx.Deadline(); ok {
		// envd kills a process at its request's deadline.
		spec.TimeoutMS = max(1, time.Until(dl).Milliseconds())
	}
	runErr, sendErr := streamProcess(ctx, req.Header(), func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.StartResponse{Event: ev})
	}, func(ctx context.Context, onEvent func(agentproto.Event)) (*sandbox.ProcessResult, error) {
		// A pause cuts the stream, as E2B's does; the process runs on
		// (the SDK's background commands keep such a stream open).
		return sandboxFrom(ctx).Run(sandbox.WithFollower(ctx), spec, onEvent)
	})
	if apierrIsNotFound(runErr) && spec.Cwd != "" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q: %w", spec.Cwd, runErr))
	}
	if runErr != nil {
		return connectError(ctx, runErr)
	}
	return sendErr
}

// Connect streams a running process's events; the agent begins the stream
// with the start event, as after Start.
func (p *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	sb := sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	runErr, sendErr := streamProcess(ctx, req.Header(), func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.ConnectResponse{Event: ev})
	}, func(ctx context.Context, onEvent func(agentproto.Event)) (*sandbox.ProcessResult, error) {
		return sb.Connect(ctx, pid, onEvent)
	})
	if runErr != nil {
		return connectError(ctx, runErr)
	}
	return sendErr
}

// streamProcess sends a process's events (start, data, then end) with
// keepalives during silences. A send that fails (the client went, or
// stopped reading past its write deadline) ends run's context: the
// stream detaches from the process, which runs on. runErr is run's
// failure, sendErr the stream's.
func streamProcess(ctx context.Context, hdr http.Header, send func(*processpb.ProcessEvent) error,
	run func(ctx context.Context, onEvent func(agentproto.Event)) (*sandbox.ProcessResult, error)) (runErr, sendErr error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	es := &eventStream{send: send, failed: cancel}
	stop := make(chan struct{})
	defer close(stop)
	go es.keepalive(keepaliveInterval(hdr), stop)
	res, err := run(ctx, es.forward)
	if serr := es.sendErr(); serr != nil {
		return nil, serr
	}
	if err != nil {
		return err, nil
	}
	es.end(res)
	return nil, es.sendErr()
}

// pid resolves a selector: a pid, or the tag of a running process.
func (p *processService) pid(ctx context.Context, sb *sandbox.Sandbox, sel *processpb.ProcessSelector) (int, error) {
	switch s := sel.GetSelector().(type) {
	case *processpb.ProcessSelector_Pid:
		return int(s.Pid), nil
	case *processpb.ProcessSelector_Tag:
		procs, err := sb.Processes(ctx)
		if err != nil {
			return 0, connectError(ctx, err)
		}
		for _, pi := range procs {
			if pi.Tag == s.Tag {
				return pi.PID, nil
			}
		}
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("no running process has tag %q", s.Tag))
	}
	return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector (pid or tag) is required"))
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	if err := p.input(ctx, req.Msg.GetProcess(), req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func (p *processService) input(ctx context.Context, sel *processpb.ProcessSelector, in *processpb.ProcessInput) error {
	sb := sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, sel)
	if err != nil {
		return err
	}
	if in.GetPty() != nil {
		return connectError(ctx, sb.SendInput(ctx, pid, in.GetPty(), false)) // typed on its terminal
	}
	return connectError(ctx, sb.SendInput(ctx, pid, in.GetStdin(), false))
}

// StreamInput takes input as a client stream: a start event naming the
// process, then data events.
func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var sel *processpb.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *processpb.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the first event must be start"))
			}
			if err := p.input(ctx, sel, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	sb := sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := sb.SendInput(ctx, pid, nil, true); err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	sb := sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig int
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = int(syscall.SIGKILL)
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = int(syscall.SIGTERM)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM"))
	}
	if err := sb.Signal(ctx, pid, sig); err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// Update resizes a process's terminal (the SDK's pty.resize).
func (p *processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	sb := sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.GetPty(); pty != nil {
		size, err := termSize(pty)
		if err != nil {
			return nil, err
		}
		if err := sb.Resize(ctx, pid, *size); err != nil {
			return nil, connectError(ctx, err)
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

// termSize checks a terminal size of a request.
func termSize(pty *processpb.PTY) (*agentproto.TermSize, error) {
	c, r := pty.GetSize().GetCols(), pty.GetSize().GetRows()
	if c == 0 || r == 0 || c > 65535 || r > 65535 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("a terminal of %dx%d: cols and rows must be 1 to 65535", c, r))
	}
	return &agentproto.TermSize{Cols: uint16(c), Rows: uint16(r)}, nil
}
