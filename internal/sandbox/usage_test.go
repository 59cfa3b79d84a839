package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// opCounter counts the agent calls of each operation (Hooks.AgentCall).
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) observe(op string, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// fakeCgroupV2 writes a container's cgroup v2 directory, as a Pod's agent
// sees it, into a temporary directory.
func fakeCgroupV2(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"cgroup.controllers": "cpu memory pids\n",
		"cpu.stat":           "usage_usec 1500000\n",
		"cpu.max":            "200000 100000\n",
		"memory.current":     "67108864\n",
		"memory.peak":        "134217728\n",
		"memory.max":         "268435456\n",
		"memory.stat":        "anon 1\nfile 16777216\n",
		"memory.events":      "oom 1\noom_kill 1\n",
		"pids.current":       "9\n",
		"pids.events":        "max 4\n",
		"memory.pressure":    "some avg10=3.00 avg60=0 avg300=0 total=1\nfull avg10=1.00 avg60=0 avg300=0 total=1\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A runtime that cannot measure its sandboxes (the kubernetes one): the
// engine reads their usage from their agents, at every reader (Usage,
// the limit reports).
func TestUsageFromAgent(t *testing.T) {
	t.Parallel()
	sink := &collector{}
	calls := &opCounter{}
	m, rt := fakeEngine(t, sandbox.Config{Events: sink})
	m.SetHooks(sandbox.Hooks{AgentCall: calls.observe})
	rt.Unmeasured, rt.CgroupRoot = true, fakeCgroupV2(t)
	if _, err := rt.Usage(context.Background(), "any"); err == nil {
		t.Fatal("the unmeasured fake runtime measured")
	}
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Usage{MemoryBytes: 64 << 20, MemoryCacheBytes: 16 << 20, MemoryPeakBytes: 128 << 20, MemoryLimit: 256 << 20,
		OOMKills: 1, CPUNanos: 1_500_000_000, CPULimit: 2, Pids: 9, PidsDenied: 4,
		Pressure: &runtime.Pressure{MemorySome: 3, MemoryFull: 1}}
	if !reflect.DeepEqual(u, want) {
		t.Fatalf("usage\n got %+v\nwant %+v", u, want)
	}
	if n := calls.get(agentproto.OpUsage); n != 1 {
		t.Fatalf("%d usage calls to the agent, want 1", n)
	}

	// A command that fails has the engine look for limits it hit: the
	// forks refused at the pids limit come from the agent too.
	res, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: "false"}, nil)
	if err != nil || res.ExitCode != 1 {
		t.Fatalf("run false: %+v, %v", res, err)
	}
	evs := sink.of(events.ResourceExceeded)
	if len(evs) != 2 {
		t.Fatalf("resource_exceeded events %+v, want pids and memory", evs)
	}
	for _, ev := range evs {
		switch ev.Details["resource"] {
		case events.ResourcePids:
			if ev.Details["refused"] != uint64(4) {
				t.Fatalf("pids event %+v", ev.Details)
			}
		case events.ResourceMemory:
			if ev.Details["oom_kills"] != uint64(1) || ev.Details["observed"] != int64(128<<20) {
				t.Fatalf("memory event %+v", ev.Details)
			}
		default:
			t.Fatalf("event %+v", ev.Details)
		}
	}
}

// An execution whose interpreter the OOM killer ended is told apart
// from another death by the OOM count the agent reads, before and after.
func TestOOMKillFromAgent(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	cg := fakeCgroupV2(t)
	rt.Unmeasured, rt.CgroupRoot = true, cg
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "1"}, nil); err != nil { // the context starts
		t.Fatal(err)
	}
	// A death without an OOM kill counted: not out of memory.
	ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "import os, time\ntime.sleep(0.3)\nos.kill(os.getpid(), 9)"}, nil)
	if err != nil || apierr.Code(ex.ErrorCode) == apierr.OutOfMemory {
		t.Fatalf("killed without an OOM kill: %+v, %v", ex, err)
	}
	// The "OOM killer" counts one more, then ends the interpreter.
	code := fmt.Sprintf("import os, time\ntime.sleep(0.3)\nopen(%q, 'w').write('oom 2\\noom_kill 2\\n')\nos.kill(os.getpid(), 9)",
		filepath.Join(cg, "memory.events"))
	ex, err = s.Execute(ctx, sandbox.ExecuteRequest{Code: code}, nil)
	if err != nil || apierr.Code(ex.ErrorCode) != apierr.OutOfMemory || ex.PeakMemoryBytes != 128<<20 {
		t.Fatalf("OOM-killed: %+v, %v", ex, err)
	}
}

// On a runtime that cannot count a sandbox's CPU time (no
// runtime.CPUCounter: Pods, and the fake), an execution's CPU time limit
// still holds: the agent counts its interpreter.
func TestCPUTimeLimitWithoutCounter(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	rt.Unmeasured, rt.CgroupRoot = true, fakeCgroupV2(t)
	if _, ok := any(rt).(runtime.CPUCounter); ok {
		t.Fatal("the fake runtime counts CPU time: this test would not test the agent's count")
	}
	limit := 0.5
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Policy: &policy.Policy{
		ResourceLimits: &policy.ResourceLimits{CPUTimeSeconds: &limit}}})
	if err != nil {
		t.Fatal(err)
	}
	spin := "import time\nt = time.process_time()\nwhile time.process_time() - t < 3: pass\n'spun'"
	ex, err := s.Execute(context.Background(), sandbox.ExecuteRequest{Code: spin, Timeout: 20 * time.Second}, nil)
	if err != nil || apierr.Code(ex.ErrorCode) != apierr.CPUTimeExceeded || ex.CPUTimeMS > 2000 {
		t.Fatalf("%+v, %v", ex, err)
	}
}

// A runtime that measures is asked alone: no agent call on its way.
func TestUsageFromRuntime(t *testing.T) {
	t.Parallel()
	calls := &opCounter{}
	m, rt := fakeEngine(t, sandbox.Config{})
	m.SetHooks(sandbox.Hooks{AgentCall: calls.observe})
	rt.Used = runtime.Usage{MemoryBytes: 1234, CPUNanos: 5678}
	rt.CgroupRoot = fakeCgroupV2(t) // what the agent would answer: not asked
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.Usage(context.Background())
	if err != nil || !reflect.DeepEqual(u, rt.Used) {
		t.Fatalf("usage %+v, %v; want the runtime's %+v", u, err, rt.Used)
	}
	if n := calls.get(agentproto.OpUsage); n != 0 {
		t.Fatalf("%d usage calls to the agent, want none", n)
	}
}

// An agent that finds no cgroup (the fake's, on a tree without one)
// leaves usage unsupported, as the runtime said.
func TestUsageAgentWithoutCgroup(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	rt.Unmeasured, rt.CgroupRoot = true, t.TempDir()
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage(context.Background()); err == nil || !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("usage %+v, %v; want ErrUnsupported", u, err)
	}
}
