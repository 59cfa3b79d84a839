package sandbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// stallAt is a cell that imports pandas with an import hook that hangs
// when the import reaches module target (saying "stalled" first), so that
// the execution's timeout always lands at that point of the import.
func stallAt(target string) string {
	return fmt.Sprintf(`import sys, time
class _Stall:
    def find_spec(self, name, path=None, target=None):
        if name == %q:
            sys.meta_path.remove(self)
            print("stalled", flush=True)
            while True:
                time.sleep(0.01)
sys.meta_path.insert(0, _Stall())
import pandas`, target)
}

// usePandas is what a ticket does with pandas once it is imported.
const usePandas = `import io
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
by = pd.read_csv(io.StringIO("k,v\na,1\nb,2\na,3\n")).groupby("k").v.sum()
by.plot(kind="bar")
plt.savefig(io.BytesIO(), format="png")
plt.close("all")
print(by.to_dict(), keep)`

// TestRuncInterruptedPandasImport: an execution whose timeout cuts off
// `import pandas` leaves the context usable: the next import of pandas
// works and the context's state is kept. Before the kernel dropped the
// submodules of a cut-off import, the next import failed with "partially
// initialized module 'pandas' has no attribute 'core'" (a timeout inside
// pandas.core.frame or pandas.plotting) or "module 'numpy' has no
// attribute 'void'" (one early in numpy's import).
func TestRuncInterruptedPandasImport(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		code    string
		timeout time.Duration
		stalled bool // the timeout must have landed at the hook
	}{
		// Where the import is held, the timeout lands there: a generous
		// timeout, reached on any machine long after the hook.
		{"at pandas.core.frame", stallAt("pandas.core.frame"), 10 * time.Second, true},
		{"at pandas.plotting", stallAt("pandas.plotting"), 10 * time.Second, true},
		// Plain timeouts land wherever the import happens to be.
		{"after 50ms", "import pandas", 50 * time.Millisecond, false},
		{"after 150ms", "import pandas", 150 * time.Millisecond, false},
		{"after 300ms", "import pandas", 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := s.CreateContext(ctx, agentproto.ContextSpec{Language: "python"})
			if err != nil {
				t.Fatal(err)
			}
			if ex := runReq(t, s, sandbox.ExecuteRequest{ContextID: info.ID, Code: "keep = 7"}); ex.Status != sandbox.ExecSuccess {
				t.Fatalf("keep = 7: %+v", ex)
			}
			ex := runReq(t, s, sandbox.ExecuteRequest{ContextID: info.ID, Code: tc.code, Timeout: tc.timeout})
			if tc.stalled && (ex.Status != sandbox.ExecTimeout || ex.Stdout != "stalled\n") {
				t.Fatalf("the timeout did not land at the hook: %+v", ex)
			}
			ex = runReq(t, s, sandbox.ExecuteRequest{ContextID: info.ID, Code: usePandas, Timeout: 2 * time.Minute})
			if ex.Status != sandbox.ExecSuccess || ex.Stdout != "{'a': 4, 'b': 2} 7\n" {
				t.Fatalf("pandas after an import cut off %s: %s %+v", tc.name, ex.Status, ex.Error)
			}
		})
	}
}
