package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// leaveCriuRoot leaves in runc's state dir of sandbox id what a runc
// killed in the middle of its restore leaves: its bind of the sandbox's
// root at criu-root, and returns that path.
func leaveCriuRoot(t *testing.T, o *OCI, id string) string {
	t.Helper()
	root := filepath.Join(o.runcDir, id, "criu-root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(o.bundle(id), "rootfs"), root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	return root
}

// checkpoint checkpoints sandbox id into dir, a second time if the first
// fails, as the engine does (internal/sandbox, pause.go): the agent may
// not yet have closed its end of the connection execPython just closed,
// a socket of the host's that fails the dump (and leaves the sandbox
// running as it was).
func checkpoint(t *testing.T, o *OCI, id, dir string) {
	t.Helper()
	if err := o.Checkpoint(context.Background(), id, dir); err != nil {
		t.Logf("checkpoint: %v; once more", err)
		if err := o.Checkpoint(context.Background(), id, dir); err != nil {
			t.Fatal(err)
		}
	}
}

// mountedAt says whether something is mounted at path.
func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// TestRestoreAfterKilledRestore: what a runc killed in the middle of a
// restore leaves mounted in its state dir (its bind of the sandbox's
// root) neither fails the next restore nor outlives the sandbox: the
// restore clears it and succeeds, and a destroy of a checkpointed
// sandbox that has it leaves no mount. (runc's restore makes criu-root
// with mkdir: a leftover failed every later restore of the sandbox, and
// the bind held its overlay and disk after a destroy.)
func TestRestoreAfterKilledRestore(t *testing.T) {
	ctx := context.Background()
	const id = "killr"
	o, inst := checkpointable(t, "killr", id, runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 64 << 20})
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, `x = "kept"`)
	dir := filepath.Join(checkpointsDir(t), "c")
	checkpoint(t, o, id, dir)
	root := leaveCriuRoot(t, o, id)
	defer unix.Unmount(root, unix.MNT_DETACH)
	inst, err := o.Restore(ctx, id, dir)
	if err != nil {
		t.Fatalf("restore over a killed restore's leftovers: %v", err)
	}
	if got := strings.TrimSpace(execPython(t, inst.Socket, `print(x)`)); got != "kept" {
		t.Errorf("after the restore: %q", got)
	}
	if mountedAt(t, root) {
		t.Errorf("the leftover bind at %s is still mounted after the restore", root)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	checkpoint(t, o, id, dir)
	root = leaveCriuRoot(t, o, id)
	defer unix.Unmount(root, unix.MNT_DETACH)
	if err := o.Destroy(ctx, id); err != nil {
		t.Errorf("destroy with a killed restore's leftovers: %v", err)
	}
	if mountedAt(t, root) {
		t.Errorf("the leftover bind at %s is still mounted after the destroy", root)
	}
	if _, err := os.Stat(filepath.Join(o.runcDir, id)); err == nil {
		t.Errorf("runc's state dir of the destroyed sandbox is left")
	}
}
