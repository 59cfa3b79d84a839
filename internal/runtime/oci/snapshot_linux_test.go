package oci

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestSnapshotClone snapshots a running sandbox whose Python kernel holds
// a variable and which wrote a file, and clones it twice: each clone has
// the variable and the file, runs in a host id range of its own (its
// user namespace maps it, its files are owned in it), and is independent
// of the original and of the other clone; the original runs on.
func TestSnapshotClone(t *testing.T) {
	ctx := context.Background()
	const id = "snap"
	lim := runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20}
	o, inst := checkpointable(t, "snap", id, lim)
	defer destroyChecked(t, o, id)
	// A background process writing to a file it holds open: the clone
	// must find the file as the process left it at the snapshot (CRIU
	// checks an open file's size) and the process goes on in it.
	if out := execPython(t, inst.Socket, `
import subprocess
marker = "baa"
open("/home/user/note.txt", "w").write("wool")
loop = subprocess.Popen(["sh", "-c", "exec 3>>/tmp/ticks; while true; do echo tick >&3; sleep 0.01; done"], start_new_session=True)
print(marker)`); strings.TrimSpace(out) != "baa" {
		t.Fatalf("set up: %q", out)
	}
	dir := filepath.Join(checkpointsDir(t), "s1")
	if err := o.Snapshot(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	// The original runs on, and what it does next is not in the snapshot.
	if out := execPython(t, inst.Socket, `marker = "ram"; print(marker)`); strings.TrimSpace(out) != "ram" {
		t.Fatalf("original after the snapshot: %q", out)
	}
	if _, err := os.Stat(filepath.Join(o.bundle(id), criuConfig)); err == nil {
		t.Error("the snapshot left the dump's options in the running sandbox's bundle (it would look checkpointed)")
	}
	spec := runtime.Spec{RootFS: testutil.TemplateRootFS(t, "python"), Limits: lim}
	var bases []uint32
	for _, cid := range []string{"snap-c1", "snap-c2"} {
		spec.ID = cid
		c, err := o.Clone(ctx, spec, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer destroyChecked(t, o, cid)
		out := execPython(t, c.Socket, `print(marker, open("/home/user/note.txt").read()); marker = "`+cid+`"`)
		if strings.TrimSpace(out) != "baa wool" {
			t.Fatalf("clone %s: %q, want the variable and the file of the snapshot", cid, out)
		}
		out = execPython(t, c.Socket, `
import time
n = len(open("/tmp/ticks").readlines())
for _ in range(500):
    if len(open("/tmp/ticks").readlines()) > n:
        break
    time.sleep(0.01)
print(loop.poll() is None, len(open("/tmp/ticks").readlines()) > n)`)
		if strings.TrimSpace(out) != "True True" {
			t.Errorf("clone %s: the background writer: %q, want it running and writing", cid, out)
		}
		var st unix.Stat_t
		if err := unix.Stat(o.bundle(cid), &st); err != nil {
			t.Fatal(err)
		}
		owner, err := nsOwner(c.PID)
		if err != nil {
			t.Fatal(err)
		}
		uidMap, err := os.ReadFile("/proc/" + strconv.Itoa(c.PID) + "/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(uidMap)); len(f) != 3 || f[1] != strconv.Itoa(int(st.Gid)) || owner != st.Gid {
			t.Errorf("clone %s: uid_map %q, namespace owner %d; want its own range at %d", cid, uidMap, owner, st.Gid)
		}
		var fst unix.Stat_t
		if err := unix.Stat(filepath.Join(o.bundle(cid), "rootfs/home/user/note.txt"), &fst); err != nil {
			t.Fatal(err)
		}
		if fst.Uid < st.Gid || fst.Uid >= st.Gid+o.cfg.IDMap.Size {
			t.Errorf("clone %s: its file is owned by host uid %d, outside its range at %d", cid, fst.Uid, st.Gid)
		}
		bases = append(bases, st.Gid)
	}
	var ost unix.Stat_t
	if err := unix.Stat(o.bundle(id), &ost); err != nil {
		t.Fatal(err)
	}
	if bases[0] == bases[1] || bases[0] == ost.Gid || bases[1] == ost.Gid {
		t.Errorf("ranges: original %d, clones %v: each must be its own", ost.Gid, bases)
	}
	if out := execPython(t, inst.Socket, `print(marker)`); strings.TrimSpace(out) != "ram" {
		t.Errorf("original after the clones: %q", out)
	}
}

// TestCloneFailureLeavesNothing: a clone whose restore fails (its
// snapshot's process images are broken) fails and leaves nothing behind:
// no process, mount, cgroup, bundle or id range; the snapshot itself is
// left as it was, and a clone of an intact copy of it (the control)
// starts.
func TestCloneFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	const id = "snapf"
	lim := runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20}
	o, inst := checkpointable(t, "snapf", id, lim)
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, `x = 1`)
	root := checkpointsDir(t)
	good, bad := filepath.Join(root, "good"), filepath.Join(root, "bad")
	for _, d := range []string{good, bad} {
		if err := o.Snapshot(ctx, id, d); err != nil {
			t.Fatal(err)
		}
	}
	cores, _ := filepath.Glob(filepath.Join(bad, snapshotImages, "core-*.img"))
	if len(cores) == 0 {
		t.Fatal("no core images in the snapshot")
	}
	for _, c := range cores {
		if err := os.WriteFile(c, []byte("broken"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	spec := runtime.Spec{ID: "snapf-bad", RootFS: testutil.TemplateRootFS(t, "python"), Limits: lim}
	if _, err := o.Clone(ctx, spec, bad); err == nil {
		destroyChecked(t, o, spec.ID)
		t.Fatal("a clone of broken images started")
	}
	assertGone(t, o, spec.ID)
	if _, err := os.Stat(filepath.Join(bad, snapshotMeta)); err != nil {
		t.Errorf("the failed clone touched its snapshot: %v", err)
	}
	spec.ID = "snapf-good"
	c, err := o.Clone(ctx, spec, good)
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, spec.ID)
	if out := execPython(t, c.Socket, `print(x)`); strings.TrimSpace(out) != "1" {
		t.Errorf("control clone: %q", out)
	}
}

// TestRestoreUnmountsCriuYard: CRIU mounts its cgroup yard in the
// restore's work dir, in the host's mount namespace, and now and then
// leaves it there (seen after clones under load): a restore (a clone's
// or a resume's, criuRestore) unmounts whatever is mounted under its work
// dir. Here such a leftover is mounted before the restore; none is left
// after it.
func TestRestoreUnmountsCriuYard(t *testing.T) {
	ctx := context.Background()
	const id = "yard"
	o, inst := checkpointable(t, "yard", id, runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20})
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, `x = 1`)
	dir := filepath.Join(checkpointsDir(t), id)
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	yard := filepath.Join(dir, ".criu.cgyard.test")
	if err := os.Mkdir(yard, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("none", yard, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(yard, unix.MNT_DETACH)
	inst, err := o.Restore(ctx, id, dir)
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), yard) {
		t.Errorf("%s is still mounted after the restore", yard)
	}
	if out := execPython(t, inst.Socket, `print(x)`); strings.TrimSpace(out) != "1" {
		t.Errorf("after the restore: %q", out)
	}
}
