package sandbox_test

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestRuncOOMScore: every process of a sandbox is the kernel's first
// choice when the host runs out of memory; the engine's own score is not
// raised.
func TestRuncOOMScore(t *testing.T) {
	testutil.SkipUnderGVisor(t, "oom_score_adj inside is the Sentry's; the host holds it on the Sentry")
	m := runcEngine(t)
	before, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t, m, sandbox.CreateOptions{})
	ex := run(t, s, "bash", "cat /proc/1/oom_score_adj /proc/self/oom_score_adj")
	if got := strings.Fields(ex.Stdout); len(got) != 2 || got[0] != "500" || got[1] != "1000" {
		t.Fatalf("oom_score_adj of the agent and of user code: %q, want 500 1000", ex.Stdout)
	}
	if after, _ := os.ReadFile("/proc/self/oom_score_adj"); string(after) != string(before) {
		t.Fatalf("the engine's own oom_score_adj changed from %q to %q", before, after)
	}
}

// TestRuncLifetimeHoldsWithoutEngine: with no engine around (as after a
// kill -9 of the server), the agent ends its sandbox at the deadline it
// was given: every process, background jobs included, is gone.
func TestRuncLifetimeHoldsWithoutEngine(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	rt, noLeaks := runcRuntime(t)
	ctx := context.Background()
	const id = "lifetime"
	inst, err := rt.Create(ctx, runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Error(err)
		}
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
		noLeaks()
	})
	call := func(req agentproto.Request) agentproto.Event {
		t.Helper()
		var c net.Conn
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if c, err = net.Dial("unix", inst.Socket); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		defer c.Close()
		done, err := agentproto.Call(c, req, nil, agentproto.Handlers{})
		if err != nil || done.Code != "" {
			t.Fatalf("%s: %v %+v", req.Op, err, done)
		}
		return done
	}
	call(agentproto.Request{Op: agentproto.OpPing, LifetimeMS: 1500})
	call(agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "sh", Args: []string{"-c", "sleep 1000 >/dev/null 2>&1 &"}}})
	// Usage counts the tenant's tasks (the job); the agent's init is
	// inst.PID.
	if u, err := rt.Usage(ctx, id); err != nil || u.Pids < 1 || syscall.Kill(inst.PID, 0) != nil {
		t.Fatalf("before the deadline: %+v %v, want the job and the agent", u, err)
	}
	waitFor(t, "every process of the sandbox to end", func() bool {
		u, err := rt.Usage(ctx, id)
		return err == nil && u.Pids == 0 && syscall.Kill(inst.PID, 0) == syscall.ESRCH
	})
}
