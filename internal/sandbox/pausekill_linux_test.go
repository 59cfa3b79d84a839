package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// A kill or an engine's Close that comes while a pause's CRIU dump runs
// (the runtime holds the sandbox for it) must still leave nothing of the
// sandbox on the host: no mount, cgroup, runc state, process or
// checkpoint.

// dumpingEngine is pauseEngine whose end the test does itself: it returns
// the Manager, the runtime's cgroup and end, which closes the Manager and
// the runtime and checks that nothing of them is left on the host.
func dumpingEngine(t *testing.T) (m *sandbox.Manager, cgroup string, end func() error) {
	t.Helper()
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: pause is refused (TestGVisorSandbox)")
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	rt, noLeaks := runcRuntime(t)
	dir := testutil.ShortTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	checkpoints := filepath.Join(dir, "checkpoints")
	m, err := sandbox.New(context.Background(), sandbox.Config{
		Runtime: rt, CheckpointDir: checkpoints,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	ended := false
	end = func() error {
		if ended {
			return nil
		}
		ended = true
		err := m.Close(context.Background())
		if cerr := rt.Close(); cerr != nil {
			t.Errorf("close runtime: %v", cerr)
		}
		noLeaks()
		if left, _ := os.ReadDir(checkpoints); len(left) > 0 {
			t.Errorf("checkpoints left: %v", left)
		}
		return err
	}
	t.Cleanup(func() {
		if err := end(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
	return m, rt.CgroupPath(), end
}

// dumpFrozen says whether sandbox id's cgroup is frozen (v1 freezer.state
// FREEZING or FROZEN; v2 cgroup.freeze 1), as the runtime and then CRIU
// hold it for a dump; gone: the cgroup is no more (the dump is over).
func dumpFrozen(cgroup, id string) (frozen, gone bool) {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", cgroup, id, "freezer.state")); err == nil {
		st := strings.TrimSpace(string(b))
		return st == "FROZEN" || st == "FREEZING", false
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cgroup, id, "cgroup.freeze")); err == nil {
		return strings.TrimSpace(string(b)) == "1", false
	}
	return false, true
}

// duringDump pauses s and calls stop once the sandbox is frozen for the
// dump; it returns stop's error and Pause's.
func duringDump(t *testing.T, m *sandbox.Manager, cgroup string, s *sandbox.Sandbox, stop func() error) (stopErr, pauseErr error) {
	t.Helper()
	stopped := make(chan error, 1)
	m.SetHooks(sandbox.Hooks{Pausing: func(sb *sandbox.Sandbox) {
		go func() {
			deadline := time.Now().Add(30 * time.Second)
			for {
				frozen, gone := dumpFrozen(cgroup, sb.ID)
				if frozen {
					break
				}
				if gone || time.Now().After(deadline) {
					t.Errorf("the dump was not seen (its cgroup gone: %v)", gone)
					stopped <- nil
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
			stopped <- stop()
		}()
	}})
	defer m.SetHooks(sandbox.Hooks{})
	pauseErr = s.Pause(context.Background())
	return <-stopped, pauseErr
}

// dumpingSandbox starts a sandbox whose Python kernel holds 64 MiB, so
// that its dump lasts a while.
func dumpingSandbox(t *testing.T, m *sandbox.Manager) *sandbox.Sandbox {
	t.Helper()
	s := newSandbox(t, m, sandbox.CreateOptions{})
	run(t, s, "python", "import os\nheld = os.urandom(64 << 20)")
	return s
}

// TestKillDuringPauseDump: a kill that comes while the pause's CRIU dump
// runs succeeds (it waits for the dump, then destroys the checkpointed
// sandbox), and nothing of the sandbox is left: no mount under the
// runtime's state, no cgroup (so no process), no runc state, no
// checkpoint (end checks all of it).
func TestKillDuringPauseDump(t *testing.T) {
	m, cgroup, end := dumpingEngine(t)
	s := dumpingSandbox(t, m)
	killErr, pauseErr := duringDump(t, m, cgroup, s, func() error { return m.Kill(context.Background(), s.ID) })
	t.Logf("pause: %v", pauseErr)
	if killErr != nil {
		t.Errorf("kill during the dump: %v", killErr)
	}
	if st := s.State(); st != sandbox.StateStopped {
		t.Errorf("state %s after the kill", st)
	}
	if pauseErr == nil {
		t.Error("the pause of a sandbox stopped during its dump reported success")
	}
	if left := sandboxCgroups(cgroup, s.ID); len(left) > 0 {
		t.Errorf("cgroups left after the kill: %v", left)
	}
	if left := m.Leftovers(); len(left) > 0 {
		t.Errorf("left to the reaper: %v", left)
	}
	if err := end(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestCloseDuringPauseDump: the engine's Close while a pause's dump runs
// destroys the sandbox all the same and returns no error; nothing is
// left.
func TestCloseDuringPauseDump(t *testing.T) {
	m, cgroup, end := dumpingEngine(t)
	s := dumpingSandbox(t, m)
	closeErr, pauseErr := duringDump(t, m, cgroup, s, func() error { return m.Close(context.Background()) })
	t.Logf("pause: %v", pauseErr)
	if closeErr != nil {
		t.Errorf("close during the dump: %v", closeErr)
	}
	if st := s.State(); st != sandbox.StateStopped {
		t.Errorf("state %s after the close", st)
	}
	if pauseErr == nil {
		t.Error("the pause of a sandbox stopped during its dump reported success")
	}
	if err := end(); err != nil { // closed again: the runtime too, and the checks
		t.Errorf("close: %v", err)
	}
}

// TestKillDuringSnapshotDump: a kill that comes while a snapshot's dump
// runs (the sandbox is to run on after it) waits for it and destroys the
// sandbox; nothing of the sandbox is left.
func TestKillDuringSnapshotDump(t *testing.T) {
	m, cgroup, end := dumpingEngine(t)
	s := dumpingSandbox(t, m)
	snapDone := make(chan struct{})
	killed := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Microsecond) {
			if frozen, _ := dumpFrozen(cgroup, s.ID); frozen {
				break
			}
			select {
			case <-snapDone:
				t.Error("the snapshot's dump was not seen")
				killed <- nil
				return
			default:
			}
			if time.Now().After(deadline) {
				t.Error("the snapshot's dump was not seen in 30 s")
				killed <- nil
				return
			}
		}
		killed <- m.Kill(context.Background(), s.ID)
	}()
	snapErr := s.Snapshot(context.Background(), filepath.Join(testutil.ShortTempDir(t), "snap"))
	close(snapDone)
	t.Logf("snapshot: %v", snapErr)
	if err := <-killed; err != nil {
		t.Errorf("kill during the snapshot's dump: %v", err)
	}
	if st := s.State(); st != sandbox.StateStopped {
		t.Errorf("state %s after the kill", st)
	}
	if left := m.Leftovers(); len(left) > 0 {
		t.Errorf("left to the reaper: %v", left)
	}
	if err := end(); err != nil {
		t.Errorf("close: %v", err)
	}
}
