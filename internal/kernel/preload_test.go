package kernel

import (
	"context"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestPythonPreload checks the warm pool's preload request: modules land in
// sys.modules, no name is bound in the user's namespace, and the first
// real execution is still cell 1.
func TestPythonPreload(t *testing.T) {
	t.Parallel()
	dir := fakePyplot(t, "")
	k := start(t, "python", map[string]string{"PYTHONPATH": dir})
	r := run(t, k, agentproto.ExecuteSpec{Preload: []string{"fractions", "matplotlib.pyplot"}})
	if r.done.Status != agentproto.StatusOK || r.err != nil || len(r.results) != 0 || r.stdout != "" || r.stderr != "" {
		t.Fatalf("preload: %+v", r)
	}
	r = run(t, k, code("import sys\n[m in sys.modules for m in ('fractions', 'matplotlib.pyplot')]"))
	if got := main(r); got != "[True, True]" {
		t.Fatalf("preloaded modules in sys.modules: %s %+v", got, r.err)
	}
	// The namespace holds only what the user's cell bound (sys) and the
	// usual dunders; the first cell was numbered 1.
	r = run(t, k, code("sorted(k for k in globals() if not k.startswith('__'))"))
	if got := main(r); got != "['sys']" {
		t.Fatalf("globals after preload: %s", got)
	}
	r = run(t, k, code("raise ValueError('where')"))
	if r.err == nil || !strings.Contains(r.err.Traceback, "<cell-3>") {
		t.Fatalf("the third user execution is not cell 3: %+v", r.err)
	}

	// A module that cannot be imported fails the request, names the
	// module, and leaves the kernel usable.
	r = run(t, k, agentproto.ExecuteSpec{Preload: []string{"no_such_module_sheepfold"}})
	if r.done.Status != agentproto.StatusError || r.err == nil || !strings.Contains(r.err.Value, "no_such_module_sheepfold") {
		t.Fatalf("failed preload: %+v", r)
	}
	if r = run(t, k, code("1+1")); main(r) != "2" {
		t.Fatalf("kernel after a failed preload: %+v", r)
	}
}

func TestPreloadNeedsPython(t *testing.T) {
	t.Parallel()
	k := start(t, "bash", nil)
	r := run(t, k, agentproto.ExecuteSpec{Preload: []string{"x"}})
	if r.done.Code != agentproto.CodeUnsupported {
		t.Fatalf("preload in bash: %+v", r.done)
	}
}

// BenchmarkFirstExecutionAfterPreload is a warm pool member's first
// execution: a Python context that preloaded libraries runs print(1)
// under a sandbox's default policy, which its first execution applies.
// Everything that execution loads for the first time (an extension
// module is slow to load into a process that holds many shared objects)
// shows here; compare with BenchmarkSecondExecutionAfterPreload.
func BenchmarkFirstExecutionAfterPreload(b *testing.B) { benchmarkAfterPreload(b, 1) }

// BenchmarkSecondExecutionAfterPreload is the execution after that one.
func BenchmarkSecondExecutionAfterPreload(b *testing.B) { benchmarkAfterPreload(b, 2) }

// benchPreload stands in for the pool's pandas, numpy and matplotlib (not
// on the host): standard modules that load shared objects of their own.
var benchPreload = []string{"decimal", "sqlite3", "ssl", "ctypes", "asyncio", "lzma", "bz2", "hashlib", "csv", "xml.etree.ElementTree"}

func benchmarkAfterPreload(b *testing.B, nth int) {
	pol := &agentproto.KernelPolicy{} // network mode "none": a sandbox without a policy gets this
	b.StopTimer()
	for range b.N {
		k, err := Start(context.Background(), agentproto.ContextSpec{Language: "python", Cwd: b.TempDir()},
			Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}})
		if err != nil {
			b.Fatal(err)
		}
		exec := func(spec agentproto.ExecuteSpec) {
			var out string
			done := k.Execute(context.Background(), spec, func(ev agentproto.Event) error {
				if ev.Type == agentproto.EventStdout {
					out += string(ev.Data)
				}
				return nil
			})
			if done.Status != agentproto.StatusOK || spec.Preload == nil && out != "1\n" {
				b.Fatalf("%+v: %+v %q", spec, done, out)
			}
		}
		exec(agentproto.ExecuteSpec{Preload: benchPreload})
		for i := 1; i <= nth; i++ {
			if i == nth {
				b.StartTimer()
			}
			exec(agentproto.ExecuteSpec{Code: "print(1)", Policy: pol, PolicyGen: 1})
			b.StopTimer()
		}
		k.Close()
	}
}
