package sandbox_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// pandasCell is typical analysis: a frame to CSV and back, a groupby, a
// chart, HTML. pandas, numpy and matplotlib import what they need for
// themselves (os, datetime, the C modules of each) whatever the rules say
// of the user's own imports.
const pandasCell = `import pandas as pd, numpy as np, matplotlib.pyplot as plt
df = pd.DataFrame({'k': ['a', 'b', 'a'], 'v': [1, 2, 3], 'd': pd.to_datetime(['2024-01-01', '2024-01-02', '2024-01-03'])})
df.to_csv('/tmp/t.csv', index=False)
back = pd.read_csv('/tmp/t.csv', parse_dates=['d'])
g = back.groupby('k').v.sum()
back.plot(x='d', y='v', title='v by day')
plt.show()
(int(g['a']), int(back.d.dt.year.iloc[0]), df.to_html()[:6], int(np.arange(3).sum()), len(back.describe()))`

// TestPolicyImportRulesWithLibraries: under the seeds' kind of policy (an
// allowlist of the analysis libraries, os, subprocess and socket
// blocked) and under a blocklist alone, pandas, numpy and matplotlib work,
// while the user's own imports of what the rules refuse fail, also
// through the C-level twins and through pandas' own name-resolving helper.
func TestPolicyImportRulesWithLibraries(t *testing.T) {
	log := &policyLog{}
	m := runcEngine(t, func(c *sandbox.Config) { c.Events = log })
	pols := map[string]*policy.Policy{
		"free": nil,
		"allow": {AccessControl: &policy.AccessControl{AllowedImports: []string{"pandas", "numpy", "matplotlib"},
			BlockedModules: []string{"os", "subprocess", "socket"}}},
		"block": {AccessControl: &policy.AccessControl{BlockedModules: []string{"os", "subprocess", "socket"}}},
	}
	boxes := map[string]*sandbox.Sandbox{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, p := range pols {
		wg.Go(func() {
			s := newSandbox(t, m, sandbox.CreateOptions{Policy: p})
			mu.Lock()
			boxes[name] = s
			mu.Unlock()
		})
	}
	wg.Wait()

	for _, name := range []string{"free", "allow", "block"} {
		ex, _ := inContext(t, boxes[name], "python", pandasCell)
		if mainText(ex) != "(4, 2024, '<table', 3, 8)" || ex.Error != nil {
			t.Fatalf("%s: pandas: %+v %+v", name, ex, ex.Error)
		}
		if len(ex.Results) < 2 || ex.Results[0].PNG == "" {
			t.Fatalf("%s: the chart: %+v", name, ex.Results)
		}
	}

	cases := []struct {
		name, box, code, target string
		wrapped                 bool // the helper raises an ImportError of its own over the refusal
	}{
		{"posix for os", "block", "import posix\nposix.getpid()", "posix", false},
		{"_socket for socket", "block", "import _socket\n_socket.socket().close()", "_socket", false},
		{"_posixsubprocess for subprocess", "block", "import _posixsubprocess\n_posixsubprocess.fork_exec", "_posixsubprocess", false},
		{"pandas' import_optional_dependency", "allow", "from pandas.compat._optional import import_optional_dependency\n" +
			"import_optional_dependency('socket').socket().close()", "socket", true},
		{"pandas' import_optional_dependency, blocklist", "block", "from pandas.compat._optional import import_optional_dependency\n" +
			"import_optional_dependency('subprocess').run(['true'])", "subprocess", true},
		{"outside the allowlist", "allow", "import json", "json", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ex, _ := inContext(t, boxes["free"], "python", c.code); ex.Error != nil {
				t.Fatalf("unconfined, it must work: %+v", ex.Error)
			}
			ex, id := inContext(t, boxes[c.box], "python", c.code)
			if c.wrapped && (ex.Error == nil || ex.Error.Name != "ImportError" || !strings.Contains(ex.Error.Traceback, "ModuleBlockedError")) {
				t.Fatalf("confined, through the helper: %+v %+v", ex, ex.Error)
			}
			if !c.wrapped && (ex.Error == nil || ex.Error.Name != "ModuleBlockedError" || apierr.Code(ex.ErrorCode) != apierr.ModuleBlocked) {
				t.Fatalf("confined: %+v %+v", ex, ex.Error)
			}
			vs := log.of(events.SecurityViolation, boxes[c.box].ID, id)
			if len(vs) == 0 || vs[0].Details["kind"] != events.KindModuleBlocked || vs[0].Details["target"] != c.target {
				t.Fatalf("events %+v, want module_blocked %s", vs, c.target)
			}
		})
	}
	if !strings.HasPrefix(mainText(run(t, boxes["allow"], "python", "import pandas\npandas.__version__")), "'") {
		t.Fatal("pandas in the default context")
	}
}
