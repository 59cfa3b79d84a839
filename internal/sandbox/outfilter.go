package sandbox

import (
	"encoding/json"
	"maps"
	"slices"
	"unicode/utf8"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// outputFilter applies a sandbox policy's output_filtering (the pure
// filters of internal/policy/filter.go) to one execution, on the host,
// to every field of its answer: stdout and stderr as they stream
// (secrets held back until their line is whole), every rendering of
// every result whatever its MIME type (a _repr_png_ may return text),
// JSON and data-frame data whole, and the error's name, value and
// traceback. Redaction applies to each; max_output_length to the answer
// as a whole, in the order its parts come (Cap), so that no combination
// of fields and results passes it. Execute (execute_hooks.go) puts it
// between the execution and its caller; nil when the policy filters
// nothing, which costs nothing.
type outputFilter struct {
	f        *policy.OutputFilter
	out, err *policy.Redactor
	cap      policy.Cap
	forward  func(agentproto.Event) error // the caller's onEvent; nil when not streaming
	// errIn is the error event as the agent sent it and errOut as it was
	// forwarded, so that the Execution ends with that same filtered
	// error (the streamed answer repeats it in its end), counted once.
	errIn, errOut *agentproto.ExecError
	// dropped counts the results the cap left nothing of.
	dropped      int
	droppedBytes int64
}

// MaxErrorName bounds an error's name under max_output_length: kept
// beside the cap (the answer says what was raised even when the output
// spent it), and no longer than a class name.
const MaxErrorName = 128

// droppedByCap is the reason of a result the cap left nothing of.
const droppedByCap = "output_filtering.max_output_length was reached"

// newOutputFilter returns the filter of the sandbox's current policy, or
// nil. The secret env vars are the sandbox's and the execution's.
func (s *Sandbox) newOutputFilter(req ExecuteRequest, forward func(agentproto.Event) error) *outputFilter {
	f := s.policyFilter(req.Env)
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
			r, ok := o.result(*ev.Result)
			if !ok {
				// Said once; the Execution's Dropped counts them all.
				n := resultSize(ev.Result)
				if o.drop(n); o.dropped > 1 {
					return nil
				}
				ev = agentproto.Event{Type: agentproto.EventDropped, Dropped: &agentproto.Dropped{Type: agentproto.EventResult,
					Bytes: n, Reason: droppedByCap}}
				break
			}
			ev.Result = &r
		}
	case agentproto.EventError:
		if err := o.flush(); err != nil {
			return err
		}
		if ev.Error != nil {
			e := o.error(*ev.Error)
			o.errIn, o.errOut = ev.Error, &e
			ev.Error = &e
		}
	case agentproto.EventDropped:
		if ev.Dropped != nil {
			// The agent words it from what the code sent: a notice, not
			// output, redacted and cut like an event's text.
			d := *ev.Dropped
			d.Type, d.Reason = o.f.Text(d.Type), o.f.Text(d.Reason)
			ev.Dropped = &d
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
// filters what the Execution kept, in the order of its answer: stdout,
// stderr, results, error.
func (o *outputFilter) finish(ex *Execution) {
	if o.forward != nil {
		_ = o.flush()
	} else {
		ex.Stdout = string(o.cap.Take([]byte(o.f.Redact(ex.Stdout))))
		ex.Stderr = string(o.cap.Take([]byte(o.f.Redact(ex.Stderr))))
		kept := ex.Results[:0]
		for _, r := range ex.Results {
			if fr, ok := o.result(r); ok {
				kept = append(kept, fr)
			} else {
				o.drop(resultSize(&r))
			}
		}
		ex.Results = kept
	}
	switch {
	case ex.Error == nil:
	case ex.Error == o.errIn:
		ex.Error = o.errOut // streamed already: the same, counted once
	default:
		e := o.error(*ex.Error)
		ex.Error = &e
	}
	if o.cap.Dropped > 0 {
		ex.Truncated = true
		if o.forward != nil {
			_ = o.forward(agentproto.Event{Type: agentproto.EventStdout, Data: []byte(o.cap.Marker())})
		} else {
			ex.Stdout += o.cap.Marker()
		}
	}
	if ex.Dropped != nil {
		ex.Dropped.Reason = o.f.Text(ex.Dropped.Reason)
	}
	if o.dropped > 0 {
		if ex.Dropped == nil {
			ex.Dropped = &Dropped{Reason: droppedByCap}
		}
		ex.Dropped.Results += o.dropped
		ex.Dropped.Bytes += o.droppedBytes
		ex.Truncated = true
	}
}

// drop counts a result the cap left nothing of.
func (o *outputFilter) drop(n int64) {
	o.dropped++
	o.droppedBytes += n
}

// result filters a result: every rendering is redacted (images and PDF
// too: their base64 may hold an encoded secret, and code may return any
// text for them); then, under max_output_length, its text renderings are
// cut and the rest (JSON, images, other MIME types) kept whole or left
// out. ok is false when nothing of it is left.
func (o *outputFilter) result(r agentproto.Result) (_ agentproto.Result, ok bool) {
	f := o.f
	texts := []*string{&r.Text, &r.HTML, &r.Markdown, &r.LaTeX, &r.SVG, &r.JavaScript}
	binary := []*string{&r.PNG, &r.JPEG, &r.PDF}
	if f.Redacts() {
		for _, p := range append(texts, binary...) {
			if *p != "" {
				*p = f.Redact(*p)
			}
		}
		if r.JSON != nil {
			r.JSON = f.JSON(r.JSON)
		}
		if len(r.Extra) > 0 {
			extra := make(map[string]any, len(r.Extra))
			for mime, v := range r.Extra {
				extra[f.Redact(mime)] = f.JSON(v)
			}
			r.Extra = extra
		}
	}
	if o.cap.Limit <= 0 {
		return r, true
	}
	kept := false
	for _, p := range texts {
		if *p != "" {
			*p = o.cap.TakeText(*p)
			kept = kept || *p != ""
		}
	}
	if r.JSON != nil {
		if o.cap.TakeWhole(jsonSize(r.JSON)) {
			kept = true
		} else {
			r.JSON = nil
		}
	}
	if len(r.Extra) > 0 {
		extra := make(map[string]any, len(r.Extra))
		for _, mime := range slices.Sorted(maps.Keys(r.Extra)) {
			v := r.Extra[mime]
			if t, isText := v.(string); isText && policy.TextualMIME(mime) {
				if t = o.cap.TakeText(t); t != "" {
					extra[mime] = t
				}
			} else if o.cap.TakeWhole(int64(len(mime)) + jsonSize(v)) {
				extra[mime] = v
			}
		}
		r.Extra = extra
		kept = kept || len(extra) > 0
	}
	for _, p := range binary {
		if *p != "" {
			if o.cap.TakeWhole(int64(len(*p))) {
				kept = true
			} else {
				*p = ""
			}
		}
	}
	return r, kept
}

// jsonSize is the size of v's JSON encoding.
func jsonSize(v any) int64 {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return int64(len(b))
}

// error sanitizes (sanitize_errors), redacts and cuts an error: its name
// within MaxErrorName, its value and traceback within the answer's cap.
func (o *outputFilter) error(e agentproto.ExecError) agentproto.ExecError {
	if o.f.Sanitizes() {
		e.Traceback = policy.SanitizeTraceback(e.Traceback)
		e.Value = policy.SanitizePaths(e.Value)
	}
	e.Name, e.Value, e.Traceback = o.f.Redact(e.Name), o.f.Redact(e.Value), o.f.Redact(e.Traceback)
	if o.cap.Limit > 0 {
		e.Name = cutUTF8(e.Name, MaxErrorName)
		e.Value, e.Traceback = o.cap.TakeText(e.Value), o.cap.TakeText(e.Traceback)
	}
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
	if forward == nil {
		return nil
	}
	f := s.policyFilter(env)
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

// policyFilter is the output filter of the sandbox's current policy with
// its secret env vars and extra's (an execution's or a command's), or nil
// when the policy filters nothing. The sandbox's own is built once per
// policy; one with extra secrets is built for the call.
func (s *Sandbox) policyFilter(extra map[string]string) *policy.OutputFilter {
	s.mu.Lock()
	p, cached, of := s.pol.pol, s.pol.filter, s.pol.filterOf
	s.mu.Unlock()
	if p == nil || p.OutputFiltering == nil {
		return nil
	}
	for name, v := range extra {
		if policy.SecretEnv(name, v) {
			return policy.NewOutputFilter(p.OutputFiltering, s.Env, extra)
		}
	}
	if of == p {
		return cached
	}
	f := policy.NewOutputFilter(p.OutputFiltering, s.Env)
	s.mu.Lock()
	if s.pol.pol == p {
		s.pol.filter, s.pol.filterOf = f, p
	}
	s.mu.Unlock()
	return f
}

// cutUTF8 is s cut to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
