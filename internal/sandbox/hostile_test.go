package sandbox_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// hostileRuntime is a runtime whose sandboxes are in-process fake agents
// that answer ping and context.list like a real one and answer every
// execution with the misbehaviour its code names (see misbehave): the
// engine must bound what they cost and keep each one's damage inside its
// own sandbox.
type hostileRuntime struct {
	dir string

	// mu guards agents.
	mu     sync.Mutex
	agents map[string]*hostileAgent
}

type hostileAgent struct {
	ln   net.Listener
	quit chan struct{} // closed by Destroy: every handler returns

	// mu guards conns.
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

var _ runtime.Runtime = (*hostileRuntime)(nil)

func (r *hostileRuntime) Name() string { return "hostile" }

func (r *hostileRuntime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	sock := filepath.Join(r.dir, s.ID+".sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	a := &hostileAgent{ln: ln, quit: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	r.mu.Lock()
	r.agents[s.ID] = a
	r.mu.Unlock()
	a.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns[nc] = struct{}{}
			a.mu.Unlock()
			a.wg.Go(func() {
				defer nc.Close()
				a.serve(nc)
			})
		}
	})
	return &runtime.Instance{ID: s.ID, Socket: sock}, nil
}

// die stops the agent as a crash would: no listener, every connection cut.
func (a *hostileAgent) die() {
	a.ln.Close()
	a.mu.Lock()
	select {
	case <-a.quit:
	default:
		close(a.quit)
	}
	for nc := range a.conns {
		nc.Close()
	}
	a.mu.Unlock()
}

func (r *hostileRuntime) Destroy(ctx context.Context, id string) error {
	r.mu.Lock()
	a := r.agents[id]
	delete(r.agents, id)
	r.mu.Unlock()
	if a != nil {
		a.die()
		a.wg.Wait()
		os.Remove(filepath.Join(r.dir, id+".sock"))
	}
	return nil
}

func (r *hostileRuntime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	return runtime.Usage{}, nil
}

func (r *hostileRuntime) List(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.agents {
		ids = append(ids, id)
	}
	return ids, nil
}

func (a *hostileAgent) serve(nc net.Conn) {
	c := agentproto.NewConn(nc)
	var req agentproto.Request
	if err := c.ReadJSON(&req); err != nil {
		return
	}
	switch req.Op {
	case agentproto.OpPing:
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Agent: &agentproto.AgentInfo{ProtocolVersion: agentproto.ProtocolVersion}})
	case agentproto.OpContextList:
		if a.misbehave(nc, c, "never") { // every other request: the same, or worse
			return
		}
	case agentproto.OpExecute:
		a.misbehave(nc, c, req.Execute.Code)
	default:
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Code: agentproto.CodeUnsupported, Message: "no"})
	}
}

// misbehave answers an execution as code says; it reports whether it
// answered at all.
func (a *hostileAgent) misbehave(nc net.Conn, c *agentproto.Conn, code string) bool {
	raw := func(b []byte) { nc.Write(b) }
	hang := func() { <-a.quit }
	switch code {
	case "ok":
		c.WriteJSON(agentproto.Event{Type: agentproto.EventStdout, Data: []byte("fine\n")})
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusOK})
	case "huge frame": // a length far over the protocol's limit, then silence
		raw(binary.BigEndian.AppendUint32(nil, 0xfffffff0))
		hang()
	case "malformed":
		agentproto.WriteFrame(nc, agentproto.FrameJSON, []byte(`{"type":"stdout","data":`))
		hang()
	case "unknown kind":
		raw(append(binary.BigEndian.AppendUint32(nil, 3), 'Z', 'z', 'z'))
		hang()
	case "out of order": // data frames and events nobody asked for, a second done
		c.WriteData([]byte("stray"))
		c.WriteJSON(agentproto.Event{Type: agentproto.EventFS, FS: &agentproto.FSEvent{Name: "x", Op: "create"}})
		c.WriteJSON(agentproto.Event{Type: agentproto.EventResult})
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusOK})
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusError})
		hang()
	case "cut": // a reply broken off by an agent that lives on
		c.WriteJSON(agentproto.Event{Type: agentproto.EventStdout, Data: []byte("partial")})
	case "slow": // a little output, then nothing, ever
		c.WriteJSON(agentproto.Event{Type: agentproto.EventStdout, Data: []byte("x")})
		hang()
	case "never":
		hang()
	case "result flood": // results as large as frames allow, as fast as possible
		res := agentproto.Event{Type: agentproto.EventResult, Result: &agentproto.Result{Text: strings.Repeat("r", agentproto.MaxFrame-200)}}
		for range floodResults {
			if c.WriteJSON(res) != nil {
				return true
			}
		}
		c.WriteJSON(agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusOK})
	case "die":
		go a.die()
		hang()
	default:
		return false
	}
	return true
}

// floodResults is how many frame-sized results the "result flood" agent
// sends: more than the execution's budget holds (4). The agent here runs
// in the test's process, which encodes and decodes each 4 MiB frame of
// JSON; under the race detector that is some fifty times slower, so the
// flood is shorter there and has longer to run.
var (
	floodResults = map[bool]int{false: 40, true: 6}[testutil.Race]
	floodTimeout = map[bool]time.Duration{false: 20 * time.Second, true: 90 * time.Second}[testutil.Race]
)

// TestHostileAgent drives the engine through agents that send huge,
// malformed, slow, never-ending and out-of-order replies: each call fails
// or ends within its deadline, the sandbox whose agent misbehaved is the
// only one affected (and lives on unless its agent died), and what the
// engine holds stays bounded. Not parallel: it shortens the engine's
// deadlines.
func TestHostileAgent(t *testing.T) {
	defer sandbox.SetAgentDeadlines(2*time.Second, 2*time.Second)()
	rt := &hostileRuntime{dir: testutil.ShortTempDir(t), agents: map[string]*hostileAgent{}}
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: rt,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil }),
		// The least the engine allows: two frames in flight.
		MaxResultMemory: 2 * agentproto.MaxFrame})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	ctx := context.Background()
	neighbour, err := m.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The neighbour answers 1+1 all along.
	stopNeighbour := make(chan struct{})
	var neighbourErr error
	var neighbourRuns int
	var nwg sync.WaitGroup
	nwg.Go(func() {
		for {
			select {
			case <-stopNeighbour:
				return
			default:
			}
			ex, err := neighbour.Execute(ctx, sandbox.ExecuteRequest{Code: "ok", Timeout: time.Second}, nil)
			if err != nil {
				neighbourErr = fmt.Errorf("neighbour: %w", err)
				return
			}
			if ex.Status != sandbox.ExecSuccess || ex.Stdout != "fine\n" {
				neighbourErr = fmt.Errorf("neighbour: status %s, stdout %q", ex.Status, ex.Stdout)
				return
			}
			neighbourRuns++
		}
	})

	tests := []struct {
		code  string
		want  apierr.Code // the call's error; "" means it succeeds
		alive bool        // the sandbox is still running afterwards
	}{
		{"ok", "", true},
		{"huge frame", apierr.Internal, true},
		{"malformed", apierr.Internal, true},
		{"unknown kind", apierr.Internal, true},
		{"out of order", "", true},
		{"cut", apierr.Internal, true},
		{"slow", apierr.SandboxTimeout, true},
		{"never", apierr.SandboxTimeout, true},
		{"result flood", "", true},
		{"die", apierr.SandboxState, false},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			s, err := m.Create(ctx, sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			debug.FreeOSMemory()
			start := time.Now()
			timeout := time.Second
			if tt.code == "result flood" {
				timeout = floodTimeout
			}
			ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: tt.code, Timeout: timeout}, nil)
			took := time.Since(start)
			if took > timeout+5*time.Second {
				t.Errorf("the call took %s", took)
			}
			if got := apierr.CodeOf(err); err != nil && got != tt.want || err == nil && tt.want != "" {
				t.Fatalf("Execute = %+v, %v (%s); want code %q", ex, err, got, tt.want)
			}
			if alive := s.State() == sandbox.StateRunning; alive != tt.alive {
				t.Fatalf("after %q the sandbox is %s", tt.code, s.State())
			}
			if tt.code == "result flood" && (ex.Dropped == nil || len(ex.Results)+ex.Dropped.Results != floodResults || len(ex.Results) > 4) {
				t.Fatalf("a flood of results was not bounded: kept %d, dropped %+v", len(ex.Results), ex.Dropped)
			}
			// A call that is not an execution has a deadline too.
			if tt.code == "never" {
				start := time.Now()
				_, err := s.Contexts(ctx)
				if apierr.CodeOf(err) != apierr.SandboxTimeout || time.Since(start) > 5*time.Second {
					t.Fatalf("Contexts on a silent agent: %v after %s", err, time.Since(start))
				}
			}
			if neighbour.State() != sandbox.StateRunning {
				t.Fatalf("the neighbour is %s", neighbour.State())
			}
		})
	}
	close(stopNeighbour)
	nwg.Wait()
	if neighbourErr != nil || neighbourRuns == 0 {
		t.Fatalf("the neighbour failed after %d runs: %v", neighbourRuns, neighbourErr)
	}
}

// TestOutputRate: past its burst, a sandbox's output passes at
// Config.OutputRate, so a flood is slowed at its source; everything still
// arrives.
func TestOutputRate(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{OutputRate: 1 << 20})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var n int
	ex, err := s.Execute(context.Background(), sandbox.ExecuteRequest{
		Code: "import sys\nsys.stdout.write('x' * (11 << 20))", MaxOutput: 16 << 20, Timeout: time.Minute,
	}, func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventStdout {
			n += len(ev.Data)
		}
		return nil
	})
	took := time.Since(start)
	if err != nil || ex.Status != sandbox.ExecSuccess || n != 11<<20 {
		t.Fatalf("Execute = %+v, %v; %d bytes", ex, err, n)
	}
	// 8 MiB of burst, then 3 MiB at 1 MiB/s.
	if took < 2500*time.Millisecond {
		t.Fatalf("11 MiB of output took %s: not held to 1 MiB/s past the burst", took)
	}
}
