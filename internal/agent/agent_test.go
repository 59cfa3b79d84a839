package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestPing(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{Version: "1.2.3"})
	r := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	info := r.done.Agent
	if info == nil || info.Version != "1.2.3" || info.ProtocolVersion != agentproto.ProtocolVersion ||
		!slices.Equal(info.Languages, []string{"python", "javascript", "bash"}) {
		t.Fatalf("agent info %+v", info)
	}
	if r.done.Type != agentproto.EventDone || len(r.events) != 0 {
		t.Fatalf("done %+v, events %+v", r.done, r.events)
	}
}

// TestBadRequests sends malformed frames and requests: each gets a Done
// with CodeBadRequest, and the agent keeps serving.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	frames := map[string][]byte{
		"unknown op":       jsonFrame(`{"op":"format.disk"}`),
		"no op":            jsonFrame(`{}`),
		"not JSON":         jsonFrame(`{op:`),
		"JSON array":       jsonFrame(`[1,2]`),
		"wrong field type": jsonFrame(`{"op":"process.signal","pid":"one"}`),
		"data frame first": append([]byte{0, 0, 0, 2}, 'D', 'x'),
		"unknown kind":     append([]byte{0, 0, 0, 2}, 'Q', 'x'),
		"zero length":      {0, 0, 0, 0},
		"too large":        {0xff, 0xff, 0xff, 0xff},
		"truncated":        append([]byte{0, 0, 0, 9}, 'J', '{'),
	}
	for name, frame := range frames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := a.dial(t)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(frame); err != nil {
				t.Fatal(err)
			}
			if name == "truncated" {
				c.(*net.UnixConn).CloseWrite()
			}
			var ev agentproto.Event
			if err := agentproto.NewConn(c).ReadJSON(&ev); err != nil {
				t.Fatalf("read done: %v", err)
			}
			if ev.Type != agentproto.EventDone || ev.Code != agentproto.CodeBadRequest {
				t.Fatalf("got %+v, want done with %s", ev, agentproto.CodeBadRequest)
			}
		})
	}
	reqs := map[string]agentproto.Request{
		"start without process":  {Op: agentproto.OpProcessStart},
		"start without command":  {Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{}},
		"negative timeout":       {Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "true", TimeoutMS: -1}},
		"NUL in argument":        {Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "echo", Args: []string{"a\x00b"}}},
		"bad env name":           {Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "true", Env: map[string]string{"A=B": "c"}}},
		"signal zero":            {Op: agentproto.OpProcessSignal, PID: 1},
		"signal 65":              {Op: agentproto.OpProcessSignal, PID: 1, Signal: 65},
		"create without context": {Op: agentproto.OpContextCreate},
		"execute without spec":   {Op: agentproto.OpExecute},
		"stat without path":      {Op: agentproto.OpFileStat},
		"NUL in path":            {Op: agentproto.OpFileStat, Path: "a\x00b"},
		"remove /":               {Op: agentproto.OpFileRemove, Path: "/"},
		"move /":                 {Op: agentproto.OpFileMove, Path: "/", NewPath: "/x"},
	}
	for name, req := range reqs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := a.call(t, req)
			if r.done.Code != agentproto.CodeBadRequest {
				t.Fatalf("done %+v, want %s", r.done, agentproto.CodeBadRequest)
			}
		})
	}
}

func jsonFrame(s string) []byte {
	b := []byte{0, 0, 0, 0, 'J'}
	b = append(b, s...)
	n := len(s) + 1
	b[0], b[1], b[2], b[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return b
}

// TestDialWithoutRequest: a connection that sends nothing or hangs up at
// once costs nothing and gets nothing.
func TestDialWithoutRequest(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	c := a.dial(t)
	c.Close()
	a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
}

func TestContexts(t *testing.T) {
	t.Parallel()
	fk := &fakeKernels{}
	a := startAgent(t, Config{
		NewKernel: fk.new,
		Languages: []string{"python", "javascript", "bash"},
		Canonical: func(lang string) (string, error) {
			switch strings.ToLower(lang) {
			case "python", "py", "python3":
				return "python", nil
			case "javascript", "js", "node":
				return "javascript", nil
			case "bash", "sh":
				return "bash", nil
			case "ruby":
				return "ruby", nil // known to the driver, not offered here
			}
			return "", errors.New("unknown")
		},
	})

	// a cwd that does not exist is refused, naming it, before any kernel
	r := a.call(t, agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "py", Cwd: "work"}})
	if r.done.Code != agentproto.CodeNotFound || !strings.Contains(r.done.Message, "/home/user/work") || fk.started.Load() != 0 {
		t.Fatalf("create in a missing cwd: %+v, %d kernels started", r.done, fk.started.Load())
	}
	if err := os.WriteFile(filepath.Join(a.cfg.Root, "home/user/work"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "py", Cwd: "work"}})
	if r.done.Code != agentproto.CodeNotDir || !strings.Contains(r.done.Message, "/home/user/work") || fk.started.Load() != 0 {
		t.Fatalf("create in a file: %+v, %d kernels started", r.done, fk.started.Load())
	}
	if err := os.Remove(filepath.Join(a.cfg.Root, "home/user/work")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(a.cfg.Root, "home/user/work"), 0o755); err != nil {
		t.Fatal(err)
	}
	// create, with an alias and a relative cwd
	r = a.call(t, agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "py", Cwd: "work"}}).mustOK(t)
	info := r.done.Context
	if info == nil || len(info.ID) != 16 || info.Language != "python" || info.Cwd != "/home/user/work" {
		t.Fatalf("created %+v", info)
	}
	id := info.ID

	// state survives between executions of one context
	a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "set x 42"}}).mustOK(t)
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "get x"}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "42" || r.done.Status != agentproto.StatusOK {
		t.Fatalf("get x = %q, done %+v", got, r.done)
	}
	// Request.ContextID works as well as ExecuteSpec.ContextID
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, ContextID: id, Execute: &agentproto.ExecuteSpec{Code: "get x"}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "42" {
		t.Fatalf("get x via Request.ContextID = %q", got)
	}

	// events stream in order, the error status passes through
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "raise boom"}}).mustOK(t)
	// (each execution's first event numbers it in its context)
	if len(r.events) != 2 || r.events[0].Type != agentproto.EventStart || r.events[0].ExecutionCount != 4 ||
		r.events[1].Type != agentproto.EventError || r.events[1].Error.Value != "boom" || r.done.Status != agentproto.StatusError {
		t.Fatalf("raise: events %+v, done %+v", r.events, r.done)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "result 7", Env: map[string]string{"A": "b"}}}).mustOK(t)
	if len(r.events) != 2 || r.events[1].Result == nil || r.events[1].Result.Text != "7" {
		t.Fatalf("result: events %+v", r.events)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "env A", Env: map[string]string{"A": "b"}}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "b" {
		t.Fatalf("execution env: %q", got)
	}

	// restart loses state, keeps the id
	r = a.call(t, agentproto.Request{Op: agentproto.OpContextRestart, ContextID: id}).mustOK(t)
	if r.done.Context == nil || r.done.Context.ID != id {
		t.Fatalf("restart: %+v", r.done)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "get x"}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "" || r.events[0].ExecutionCount != 1 {
		t.Fatalf("after restart get x = %q, execution %d (want 1: counted anew)", got, r.events[0].ExecutionCount)
	}
	// A preload (the warm pool's) is not one of the user's executions:
	// the next one is numbered 2 all the same.
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Preload: []string{"json"}}})
	if len(r.events) == 0 || r.events[0].Type != agentproto.EventStart || r.events[0].ExecutionCount != 0 {
		t.Fatalf("preload: events %+v", r.events)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "get x"}}).mustOK(t)
	if r.events[0].ExecutionCount != 2 {
		t.Fatalf("after a preload, execution %d (want 2)", r.events[0].ExecutionCount)
	}

	// default contexts: created on first use, per language, then reused
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "set y 1"}}).mustOK(t)
	r = a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Language: "python3", Code: "get y"}}).mustOK(t)
	if got := r.output(agentproto.EventStdout); got != "1" {
		t.Fatalf("default python context lost state: %q", got)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Language: "js", Code: "print hi"}}).mustOK(t)

	r = a.call(t, agentproto.Request{Op: agentproto.OpContextList}).mustOK(t)
	var ids []string
	for _, c := range r.done.Contexts {
		ids = append(ids, c.ID+"/"+c.Language)
	}
	want := []string{id + "/python", "default-javascript/javascript", "default-python/python"}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("contexts %v, want %v", ids, want)
	}
	if n := fk.started.Load(); n != 3 {
		t.Fatalf("%d kernels started, want 3", n)
	}

	// delete closes the kernel
	a.call(t, agentproto.Request{Op: agentproto.OpContextDelete, ContextID: id}).mustOK(t)
	r = a.call(t, agentproto.Request{Op: agentproto.OpContextList}).mustOK(t)
	if len(r.done.Contexts) != 2 {
		t.Fatalf("after delete: %+v", r.done.Contexts)
	}

	// errors
	errs := []struct {
		name string
		req  agentproto.Request
		code string
	}{
		{"unknown language", agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "cobol"}}, agentproto.CodeUnsupported},
		{"language not offered", agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "ruby"}}, agentproto.CodeUnsupported},
		{"execute unknown language", agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Language: "cobol", Code: "x"}}, agentproto.CodeUnsupported},
		{"kernel fails to start", agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "sh", Env: map[string]string{"FAIL": "1"}}}, agentproto.CodeInternal},
		{"execute deleted context", agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{ContextID: id, Code: "x"}}, agentproto.CodeNotFound},
		{"restart unknown", agentproto.Request{Op: agentproto.OpContextRestart, ContextID: "nope"}, agentproto.CodeNotFound},
		{"delete unknown", agentproto.Request{Op: agentproto.OpContextDelete, ContextID: id}, agentproto.CodeNotFound},
	}
	for _, e := range errs {
		if r := a.call(t, e.req); r.done.Code != e.code {
			t.Errorf("%s: done %+v, want %s", e.name, r.done, e.code)
		}
	}
}

func TestContextsDisabled(t *testing.T) {
	t.Parallel()
	a := startAgentWith(t, Config{}, false)
	r := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "1"}})
	if r.done.Code != agentproto.CodeUnsupported {
		t.Fatalf("done %+v", r.done)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	if r.done.Agent.Languages == nil || len(r.done.Agent.Languages) != 0 {
		t.Fatalf("languages %v", r.done.Agent.Languages)
	}
}

// TestDefaultContextCreatedOnce races first executions of a language: one
// kernel starts, and executions in one context never overlap.
func TestDefaultContextCreatedOnce(t *testing.T) {
	t.Parallel()
	fk := &fakeKernels{startDelay: 100 * time.Millisecond}
	a := startAgent(t, Config{NewKernel: fk.new, Languages: []string{"python"}})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			r := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: fmt.Sprintf("print %d", i)}})
			if r.done.Code != "" || r.output(agentproto.EventStdout) != fmt.Sprint(i) {
				t.Errorf("execution %d: %+v %q", i, r.done, r.output(agentproto.EventStdout))
			}
		})
	}
	wg.Wait()
	if n := fk.started.Load(); n != 1 {
		t.Fatalf("%d kernels started, want 1", n)
	}
	s := <-a.srv
	a.srv <- s
	k := s.ctxs.get("default-python").k.(*fakeKernel)
	if k.overlap {
		t.Fatal("executions overlapped in one context")
	}
}

// TestExecuteHangupCancels: a client that hangs up mid-execution cancels
// it (the kernel sees ctx end), and the context serves the next one.
func TestExecuteHangupCancels(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	s := a.open(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "block"}})
	if ev := s.next(); ev.Type != agentproto.EventStart || ev.ExecutionCount != 1 {
		t.Fatalf("first event %+v", ev)
	}
	if ev := s.next(); ev.Type != agentproto.EventStdout || string(ev.Data) != "blocking" {
		t.Fatalf("first event %+v", ev)
	}
	start := time.Now()
	s.nc.Close()
	r := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "print next"}}).mustOK(t)
	if r.output(agentproto.EventStdout) != "next" || time.Since(start) > 5*time.Second {
		t.Fatalf("next execution: %q after %v", r.output(agentproto.EventStdout), time.Since(start))
	}
}

// TestPanicIsContained: a panic while serving a request ends that request
// with CodeInternal; the agent goes on.
func TestPanicIsContained(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	r := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "panic"}})
	if r.done.Code != agentproto.CodeInternal {
		t.Fatalf("done %+v", r.done)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	s := <-a.srv
	a.srv <- s
	if s.panics.Load() != 1 {
		t.Fatalf("panics = %d", s.panics.Load())
	}
	s.panics.Store(0) // expected; do not fail the clean-up check
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"relative home": {Root: t.TempDir(), Home: "home"},
		"missing root":  {Root: "/nonexistent/sheepfold"},
	} {
		ln, err := net.Listen("unix", t.TempDir()+"/s")
		if err != nil {
			t.Fatal(err)
		}
		if err := Serve(context.Background(), ln, cfg); err == nil {
			t.Errorf("%s: Serve returned nil", name)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s: listener left open (%v)", name, err)
		}
	}
}

// TestOversizeEvents: events too large for a frame are split (output), cut
// (an error's text) or replaced by a dropped event, and the execution goes
// on to its end: nothing is lost silently and the connection survives.
func TestOversizeEvents(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	r := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "oversize"}})
	var dropped []agentproto.Dropped
	var stdout bytes.Buffer
	var execErr *agentproto.ExecError
	for _, ev := range r.events {
		switch ev.Type {
		case agentproto.EventDropped:
			dropped = append(dropped, *ev.Dropped)
		case agentproto.EventStdout:
			stdout.Write(ev.Data)
		case agentproto.EventError:
			execErr = ev.Error
		case agentproto.EventResult:
			t.Fatalf("a result over a frame was sent: %d bytes", len(ev.Result.Text))
		}
	}
	if len(dropped) != 1 || dropped[0].Type != agentproto.EventResult || dropped[0].Bytes < agentproto.MaxFrame {
		t.Fatalf("dropped %+v", dropped)
	}
	if want := append(bytes.Repeat([]byte{0xff}, 4<<20), "after"...); !bytes.Equal(stdout.Bytes(), want) {
		t.Fatalf("stdout: %d bytes, want %d", stdout.Len(), len(want))
	}
	if execErr == nil || execErr.Name != "Huge" || len(execErr.Value) > maxErrorValue+64 || !strings.Contains(execErr.Value, "bytes cut]") {
		t.Fatalf("error not cut: %d bytes", len(execErr.Value))
	}
	if r.done.Status != agentproto.StatusError || r.done.Code != "" {
		t.Fatalf("done %+v", r.done)
	}
}

// TestStartingLifetime: an agent given a lifetime at start (a Pod's, as
// its server may die before the first ping) sets it before it serves
// anything, and pings report it, with no ping having set one. The
// control, without it, has no deadline until a ping sets one.
func TestStartingLifetime(t *testing.T) {
	t.Parallel()
	for _, start := range []time.Duration{0, time.Minute} {
		var set atomic.Int64
		a := startAgent(t, Config{Lifetime: start, SetLifetime: func(d time.Duration) error { set.Store(int64(d)); return nil }})
		r := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
		left := r.done.Agent.LifetimeLeftMS
		switch {
		case start == 0 && (left != 0 || set.Load() != 0):
			t.Fatalf("no starting lifetime, yet %d ms left, %v set", left, time.Duration(set.Load()))
		case start > 0 && (left < 59_000 || left > 60_000 || set.Load() != int64(start)):
			t.Fatalf("starting lifetime %v: %d ms left, %v set", start, left, time.Duration(set.Load()))
		}
	}
	// A starting lifetime the agent cannot keep refuses to serve.
	ln, err := net.Listen("unix", filepath.Join(testutil.ShortTempDir(t), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Serve(context.Background(), ln, Config{Root: root, Home: "/home/user", Lifetime: time.Minute}); err == nil || !strings.Contains(err.Error(), "lifetime") {
		t.Fatalf("served with a starting lifetime and no SetLifetime: %v", err)
	}
}

// TestPingReportsActivity: a ping says how long the sandbox has to live
// and whether anyone uses it; pings themselves are not use.
func TestPingReportsActivity(t *testing.T) {
	t.Parallel()
	var set atomic.Int64
	a := startAgent(t, Config{SetLifetime: func(d time.Duration) error { set.Store(int64(d)); return nil }})
	r := a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	if r.done.Agent.LifetimeLeftMS != 0 {
		t.Fatalf("no deadline set, yet %d ms left", r.done.Agent.LifetimeLeftMS)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpPing, LifetimeMS: 60_000}).mustOK(t)
	if left := r.done.Agent.LifetimeLeftMS; left < 59_000 || left > 60_000 || set.Load() != int64(time.Minute) {
		t.Fatalf("lifetime left %d ms, set %v", left, time.Duration(set.Load()))
	}
	time.Sleep(30 * time.Millisecond)
	r = a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	if r.done.Agent.IdleMS < 30 || r.done.Agent.Busy != 0 {
		t.Fatalf("after pings only: idle %d ms, busy %d", r.done.Agent.IdleMS, r.done.Agent.Busy)
	}
	// The ping right after an execution's Done sees it over: not busy,
	// idle for no longer than since the execution began (the sleep
	// above would count otherwise).
	began := time.Now()
	a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "print 1"}}).mustOK(t)
	r = a.call(t, agentproto.Request{Op: agentproto.OpPing}).mustOK(t)
	if since := time.Since(began).Milliseconds(); r.done.Agent.IdleMS > since || r.done.Agent.Busy != 0 {
		t.Fatalf("an execution just ended, yet idle %d ms (it began %d ms ago), busy %d", r.done.Agent.IdleMS, since, r.done.Agent.Busy)
	}
}
