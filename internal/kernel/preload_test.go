package kernel

import (
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
