package sandbox_test

import (
	"encoding/json"
	"testing"

	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestRuncCharts checks the chart data that accompanies each matplotlib
// figure (E2B's "chart" result) for the kinds of plot clients ask for.
func TestRuncCharts(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	chartOf := func(code string) []map[string]any {
		t.Helper()
		ex := run(t, s, "python", code)
		if ex.Status != sandbox.ExecSuccess {
			t.Fatalf("%s: %+v", code, ex)
		}
		var out []map[string]any
		for _, r := range ex.Results {
			if r.PNG == "" {
				continue
			}
			b, _ := json.Marshal(r.Extra["e2b/chart"])
			var c map[string]any
			if err := json.Unmarshal(b, &c); err != nil || c == nil {
				t.Fatalf("figure without chart data: %+v", r.Extra)
			}
			out = append(out, c)
		}
		return out
	}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }

	c := chartOf("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [10, 20, 15], label='sales')\n" +
		"plt.title('Stock'); plt.xlabel('day'); plt.ylabel('units (pcs)')\nplt.show()")
	if len(c) != 1 || c[0]["type"] != "line" || c[0]["title"] != "Stock" || c[0]["y_unit"] != "pcs" ||
		js(c[0]["elements"]) != `[{"label":"sales","points":[[1,10],[2,20],[3,15]]}]` || c[0]["x_scale"] != "linear" {
		t.Fatalf("line chart: %v", c)
	}
	c = chartOf("plt.bar(['DE', 'FR'], [3, 4], label='orders')")
	if len(c) != 1 || c[0]["type"] != "bar" ||
		js(c[0]["elements"]) != `[{"group":"orders","label":"DE","value":3},{"group":"orders","label":"FR","value":4}]` {
		t.Fatalf("bar chart: %v", c)
	}
	// An unlabelled collection keeps matplotlib's own label, as in E2B's
	// extractor.
	c = chartOf("plt.scatter([1, 2], [3, 4])\nplt.yscale('log')")
	if len(c) != 1 || c[0]["type"] != "scatter" || c[0]["y_scale"] != "log" || js(c[0]["elements"]) != `[{"label":"_child0","points":[[1,3],[2,4]]}]` {
		t.Fatalf("scatter chart: %v", c)
	}
	c = chartOf("plt.pie([1, 3], labels=['a', 'b'])")
	if len(c) != 1 || c[0]["type"] != "pie" || js(c[0]["elements"]) != `[{"angle":90,"label":"a","radius":1},{"angle":270,"label":"b","radius":1}]` {
		t.Fatalf("pie chart: %v", c)
	}
	c = chartOf("fig, (a, b) = plt.subplots(1, 2)\nfig.suptitle('both')\na.plot([1, 2])\nb.bar(['x'], [1])")
	if len(c) != 1 || c[0]["type"] != "superchart" || c[0]["title"] != "both" || len(c[0]["elements"].([]any)) != 2 {
		t.Fatalf("superchart: %v", c)
	}
	// Two plt.show() calls are two figures, in order.
	if c = chartOf("plt.plot([1]); plt.title('one'); plt.show()\nplt.plot([2]); plt.title('two'); plt.show()"); len(c) != 2 || c[0]["title"] != "one" || c[1]["title"] != "two" {
		t.Fatalf("two shows: %v", c)
	}
	// A shell escape runs in the sandbox, as the user, in the cwd.
	if ex := run(t, s, "python", "!whoami\n!pwd"); ex.Stdout != "user\n/home/user\n" {
		t.Fatalf("shell escape: %q %+v", ex.Stdout, ex.Error)
	}
}
