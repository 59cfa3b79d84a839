package server_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestBatchCheckTakesNoSandbox: a batch whose handler is bad fails at
// once with ERR_INVALID_HANDLER and the error's line, checked by the
// host's Python (of the template's version): no sandbox is created, from
// the pool or not, and the account holds none. Controls: with the host
// check off, or a template whose Python is of another version, the same
// refusal takes a sandbox.
func TestBatchCheckTakesNoSandbox(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	t.Parallel()
	// A root filesystem whose Python is another version than the host's.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("python3.2", filepath.Join(other, "usr", "bin", "python3")); err != nil {
		t.Fatal(err)
	}
	otherTemplate := func(c *sandbox.Config) {
		c.Templates = sandbox.TemplatesFunc(func(name string) (string, error) {
			if name != "python" {
				return "", os.ErrNotExist
			}
			return other, nil
		})
	}
	for _, c := range []struct {
		name    string
		cfg     server.Config
		opts    []func(*sandbox.Config)
		creates float64
	}{
		{"host", server.Config{}, nil, 0},
		{"control: host check off", server.Config{BatchCheckPython: "-"}, nil, 1},
		{"control: another Python", server.Config{}, []func(*sandbox.Config){otherTemplate}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.cfg, c.opts...)
			admin := e.adminKey()
			for _, bad := range []struct {
				code, name string
				line       int
			}{
				{"x = 1\n\ndef handler(item)\n    return 1\n", "SyntaxError", 3},
				{"import os\ndef other(item):\n    return 1\n", "NameError", 0},
			} {
				r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": bad.code, "inputs": lenInputs(3)})
				want(t, r, http.StatusBadRequest, "ERR_INVALID_HANDLER")
				msg, _ := r.json(t)["error"].(map[string]any)["message"].(string)
				if !strings.HasPrefix(msg, bad.name+": ") || strings.Contains(msg, "line") != (bad.line > 0) ||
					(bad.line > 0 && !strings.HasSuffix(msg, "(line 3)")) {
					t.Fatalf("refusal %s; want %s at line %d", r.body, bad.name, bad.line)
				}
			}
			fams := e.scrape(admin)
			creates := value(fams, "sheepfold_sandbox_creates_total", "pool", "miss") + value(fams, "sheepfold_sandbox_creates_total", "pool", "hit")
			if creates != 2*c.creates {
				t.Fatalf("%g sandboxes created for 2 refused batches; want %g", creates, 2*c.creates)
			}
			if p := e.engine.PoolStats(); p.Hits+p.Misses != uint64(2*c.creates) && p.Hits+p.Misses != 0 {
				t.Fatalf("pool %+v", p)
			}
			if n := e.do("GET", "/v1/account", e.keyA, nil).json(t)["running_sandboxes"]; n != 0.0 {
				t.Fatalf("the account holds %v sandboxes", n)
			}
			// A good handler is accepted the same way, and runs.
			r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": "handler = len\n", "inputs": []string{"ab"}})
			want(t, r, http.StatusCreated, "")
			id := r.json(t)["id"].(string)
			if b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended); b["done"] != 1.0 {
				t.Fatalf("batch %v", b)
			}
		})
	}
}
