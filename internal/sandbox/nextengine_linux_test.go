package sandbox_test

import (
	"context"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// nextEngine starts the engine that follows a closed (or crashed) one on
// the same runtime instance: a new runtime of rcfg under cfg. When t ends
// it closes both, checks that nothing of the instance is left (state,
// cgroup), then runs after.
func nextEngine(t *testing.T, rcfg oci.Config, cfg sandbox.Config, state, cgroup string, after ...func()) (*sandbox.Manager, *oci.OCI) {
	t.Helper()
	rt, err := oci.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Runtime = rt
	m, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("close the next engine: %v", err)
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close the next runtime: %v", err)
		}
		assertNoLeaks(t, state, rcfg.Instance, cgroup)
		for _, f := range after {
			f()
		}
	})
	return m, rt
}
