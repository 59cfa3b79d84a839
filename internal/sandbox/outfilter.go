package sandbox

import (
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// outputFilter applies a sandbox policy's output_filtering (the pure
// filters of internal/policy/filter.go) to one execution, on the host:
// stdout and stderr as they stream (secrets held back until their line
// is whole), results' text renderings, and the error. Execute
// (execute_hooks.go) puts it between the execution and its caller; nil
// when the policy filters nothing, which costs nothing.
type outputFilter struct {
	f        *policy.OutputFilter
	out, err *policy.Redactor
	cap      policy.Cap
	forward  func(agentproto.Event) error // the caller's onEvent; nil when not streaming
}

// newOutputFilter returns the filter of the sandbox's current policy, or
// nil. The secret env vars are the sandbox's and the execution's.
func (s *Sandbox) newOutputFilter(req ExecuteRequest, forward func(agentproto.Event) error) *outputFilter {
	p := s.Policy()
	if p == nil || p.OutputFiltering == nil {
		return nil
	}
	f := policy.NewOutputFilter(p.OutputFiltering, s.Env, req.Env)
	if f == nil {
		return nil
	}
	return &outputFilter{f: f, out: f.NewRedactor(), err: f.NewRedactor(), cap: policy.Cap{Limit: f.MaxOutputLength()},
		forward: forward}
}

// event is the onEvent the execution streams to.
func (o *outputFilter) event(ev agentproto.Event) error {
	switch ev.Type {
	case agentproto.EventStdout:
		return o.text(ev.Type, o.out.Write(ev.Data))
	case agentproto.EventStderr:
		return o.text(ev.Type, o.err.Write(ev.Data))
	case agentproto.EventResult:
		if err := o.flush(); err != nil {
			return err
		}
		if ev.Result != nil {
			r := o.result(*ev.Result)
			ev.Result = &r
		}
	case agentproto.EventError:
		if err := o.flush(); err != nil {
			return err
		}
		if ev.Error != nil {
			e := o.error(*ev.Error)
			ev.Error = &e
		}
	}
	return o.forward(ev)
}

// text forwards released output, within max_output_length.
func (o *outputFilter) text(typ string, p []byte) error {
	if p = o.cap.Take(p); len(p) == 0 {
		return nil
	}
	return o.forward(agentproto.Event{Type: typ, Data: p})
}

// flush releases what the redactors hold (before a result or an error,
// so that output keeps its place before them).
func (o *outputFilter) flush() error {
	if err := o.text(agentproto.EventStdout, o.out.Flush()); err != nil {
		return err
	}
	return o.text(agentproto.EventStderr, o.err.Flush())
}

// finish ends the stream (what is held back, the truncation marker) and
// filters what the Execution kept.
func (o *outputFilter) finish(ex *Execution) {
	if o.forward != nil {
		if o.flush() == nil && o.cap.Dropped > 0 {
			_ = o.forward(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(o.cap.Marker())})
		}
	} else {
		ex.Stdout = string(o.cap.Take([]byte(o.f.Redact(ex.Stdout))))
		ex.Stderr = string(o.cap.Take([]byte(o.f.Redact(ex.Stderr))))
		ex.Stdout += o.cap.Marker()
	}
	if o.cap.Dropped > 0 {
		ex.Truncated = true
	}
	for i := range ex.Results {
		ex.Results[i] = o.result(ex.Results[i])
	}
	if ex.Error != nil {
		e := o.error(*ex.Error)
		ex.Error = &e
	}
}

// result filters a result's text renderings, its JSON (every string in
// it) and its other textual MIME types; not images or PDF.
func (o *outputFilter) result(r agentproto.Result) agentproto.Result {
	for _, p := range []*string{&r.Text, &r.HTML, &r.Markdown, &r.LaTeX, &r.SVG, &r.JavaScript} {
		if *p != "" {
			*p = o.f.Text(*p)
		}
	}
	if r.JSON != nil {
		r.JSON = o.f.JSON(r.JSON)
	}
	if len(r.Extra) > 0 {
		extra := make(map[string]any, len(r.Extra))
		for mime, v := range r.Extra {
			if policy.TextualMIME(mime) {
				v = o.f.JSON(v)
			}
			extra[mime] = v
		}
		r.Extra = extra
	}
	return r
}

// error sanitizes (sanitize_errors) and then redacts and cuts an error.
func (o *outputFilter) error(e agentproto.ExecError) agentproto.ExecError {
	if o.f.Sanitizes() {
		e.Traceback = policy.SanitizeTraceback(e.Traceback)
		e.Value = policy.SanitizePaths(e.Value)
	}
	e.Value, e.Traceback = o.f.Text(e.Value), o.f.Text(e.Traceback)
	return e
}

// commandFilter applies the policy's output_filtering to a command's
// streamed stdout and stderr (/v1 commands and E2B processes alike):
// redacted per stream as they come (a secret split across writes is held
// back until its line is whole) and cut at max_output_length per call,
// with the marker at the end. nil when the policy filters nothing.
type commandFilter struct {
	f        *policy.OutputFilter
	out, err *policy.Redactor
	cap      policy.Cap
	forward  func(agentproto.Event)
}

// newCommandFilter returns the filter of the sandbox's current policy for
// one command's stream to forward, or nil. The secret env vars are the
// sandbox's and the command's.
func (s *Sandbox) newCommandFilter(env map[string]string, forward func(agentproto.Event)) *commandFilter {
	p := s.Policy()
	if p == nil || p.OutputFiltering == nil || forward == nil {
		return nil
	}
	f := policy.NewOutputFilter(p.OutputFiltering, s.Env, env)
	if f == nil {
		return nil
	}
	return &commandFilter{f: f, out: f.NewRedactor(), err: f.NewRedactor(), cap: policy.Cap{Limit: f.MaxOutputLength()},
		forward: forward}
}

// event is the onEvent the command streams to.
func (c *commandFilter) event(ev agentproto.Event) {
	switch ev.Type {
	case agentproto.EventStdout, agentproto.EventPTY: // a terminal's output is filtered as stdout
		c.text(ev.Type, c.out.Write(ev.Data))
	case agentproto.EventStderr:
		c.text(ev.Type, c.err.Write(ev.Data))
	default:
		c.forward(ev)
	}
}

func (c *commandFilter) text(typ string, p []byte) {
	if p = c.cap.Take(p); len(p) > 0 {
		c.forward(agentproto.Event{Type: typ, Data: p})
	}
}

// finish releases what the redactors hold and the truncation marker, and
// reports a cut (resource_exceeded output).
func (c *commandFilter) finish(s *Sandbox, res *ProcessResult) {
	c.text(agentproto.EventStdout, c.out.Flush())
	c.text(agentproto.EventStderr, c.err.Flush())
	if c.cap.Dropped == 0 {
		return
	}
	c.forward(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(c.cap.Marker())})
	if res != nil {
		res.Truncated = true
	}
	s.emit(events.ResourceExceeded, "", map[string]any{"resource": events.ResourceOutput, "limit": c.cap.Limit,
		"observed": c.cap.Used + c.cap.Dropped, "unit": "bytes", "rule": "output_filtering.max_output_length", "pid": pidOf(res)})
}

func pidOf(res *ProcessResult) int {
	if res == nil {
		return 0
	}
	return res.PID
}
