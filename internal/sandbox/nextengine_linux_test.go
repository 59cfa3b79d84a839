package sandbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// restartRig makes what a test that restarts the engine keeps across the
// restart: a runtime instance of its own (rcfg, its first runtime rt,
// its state dir and cgroup) and a directory for the checkpoints (dir),
// with the python template's rootfs.
func restartRig(t *testing.T) (rootfs string, rcfg oci.Config, rt *oci.OCI, state, cgroup, dir string) {
	t.Helper()
	rootfs = testutil.TemplateRootFS(t, "python")
	state = testutil.ShortTempDir(t)
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	rcfg = oci.Config{RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
		CgroupParent: testCgroupParent, Instance: "t" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	rt, err := oci.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	dir = testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return rootfs, rcfg, rt, state, rt.CgroupPath(), dir
}

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
