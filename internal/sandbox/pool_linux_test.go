package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestPoolPreloadsPythonLibraries checks a pooled runc sandbox of the
// python template: pandas, numpy and matplotlib are in sys.modules with
// the Agg backend, the user's namespace is empty and the user's first
// execution is cell 1. A sandbox that missed the pool is the control.
func TestPoolPreloadsPythonLibraries(t *testing.T) {
	m := runcEngine(t, func(c *sandbox.Config) { c.PoolSize = 1 })
	deadline := time.Now().Add(90 * time.Second)
	for m.PoolStats().Ready != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", m.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx := context.Background()
	const probe = "all(m in __import__('sys').modules for m in ('numpy', 'pandas', 'matplotlib.pyplot')), " +
		"sorted(k for k in globals() if not k.startswith('__')), __import__('matplotlib').get_backend().lower()"
	check := func(s *sandbox.Sandbox, want string) {
		t.Helper()
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "raise ValueError('first')"}, nil)
		if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Traceback, "<cell-1>") {
			t.Fatalf("the first execution is not cell 1: %v %+v", err, ex)
		}
		ex, err = s.Execute(ctx, sandbox.ExecuteRequest{Code: probe}, nil)
		if err != nil || len(ex.Results) != 1 || ex.Results[0].Text != want {
			t.Fatalf("probe: %v %+v, want %s", err, ex, want)
		}
	}
	hit, err := m.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hit.FromPool() {
		t.Fatal("a default create missed a full pool")
	}
	check(hit, "(True, [], 'agg')")

	miss, err := m.Create(ctx, sandbox.CreateOptions{Env: map[string]string{"MISS": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if miss.FromPool() {
		t.Fatal("a create with env vars was handed a pooled sandbox")
	}
	check(miss, "(False, [], 'agg')")
}
