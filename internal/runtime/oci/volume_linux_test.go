package oci

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// shell runs script with /bin/sh in the sandbox as user ("" is "user",
// agentproto.UserRoot root) and returns its output and exit code.
func shell(t *testing.T, sock, user, script string) (string, int) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out strings.Builder
	done, err := agentproto.Call(c, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "/bin/sh", Args: []string{"-c", script}, User: user, TimeoutMS: 60_000}}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventStdout || ev.Type == agentproto.EventStderr {
				out.Write(ev.Data)
			}
			return nil
		}})
	if err != nil || done.ExitCode == nil {
		t.Fatalf("run %q: %v %+v", script, err, done)
	}
	return out.String(), *done.ExitCode
}

func volumeRuntime(t *testing.T, instance string) *OCI {
	t.Helper()
	cfg := testConfig(t, instance)
	cfg.VolumesDir = filepath.Join(testutil.ShortTempDir(t), "volumes")
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left: its sandboxes first (Close wants
		// none), then its volumes.
		ids, _ := o.List(context.Background())
		for _, id := range ids {
			o.Destroy(context.Background(), id)
		}
		vols, _ := os.ReadDir(cfg.VolumesDir)
		for _, v := range vols {
			if err := o.RemoveVolume(context.Background(), v.Name()); err != nil {
				t.Errorf("remove volume %s: %v", v.Name(), err)
			}
		}
		if err := o.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if l := loopsLeft(t, cfg.VolumesDir); len(l) > 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})
	requireDisks(t, o)
	return o
}

func volumeSandbox(t *testing.T, o *OCI, id string, vols ...runtime.VolumeMount) string {
	t.Helper()
	inst, err := o.Create(context.Background(), runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 96 << 20}, Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Destroy(context.Background(), id) })
	return inst.Socket
}

// TestVolumeOutlivesSandboxes: what a sandbox writes to a volume is
// there, owned by the same user, for a sandbox that mounts it later, also
// after its filesystem was unmounted on the host (a restart of the host);
// a destroy leaves the volume and removes only the sandbox's attachment;
// RemoveVolume leaves nothing.
func TestVolumeOutlivesSandboxes(t *testing.T) {
	o := volumeRuntime(t, "vol-keep")
	ctx := context.Background()
	if err := o.MakeVolume(ctx, "vol-a", 16<<20); err != nil {
		t.Fatal(err)
	}
	used, total, err := o.VolumeUsage(ctx, "vol-a")
	if err != nil || total < 16<<20 || total > 20<<20 {
		t.Fatalf("a volume of 16 MiB holds %d of %d bytes (%v)", used, total, err)
	}
	sock := volumeSandbox(t, o, "vol-w", runtime.VolumeMount{ID: "vol-a", Path: "/data"})
	if out, code := shell(t, sock, "", "echo kept > /data/hello && mkdir /data/sub && stat -c %u:%g /data/hello"); code != 0 || strings.TrimSpace(out) != "1000:1000" {
		t.Fatalf("write as user: %d %q", code, out)
	}
	if err := o.Destroy(ctx, "vol-w"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, o, "vol-w")
	mnt := filepath.Join(o.volumeDir("vol-a"), "mnt")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "hello"), &st); err != nil || st.Uid != o.cfg.IDMap.HostID+1000 {
		t.Fatalf("on the host after the destroy: uid %d, %v; want %d", st.Uid, err, o.cfg.IDMap.HostID+1000)
	}
	// As after a reboot: the next sandbox mounts the image again.
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	sock = volumeSandbox(t, o, "vol-r", runtime.VolumeMount{ID: "vol-a", Path: "/home/user/data"})
	if out, code := shell(t, sock, "", "cat /home/user/data/hello && echo more >> /home/user/data/hello && stat -c %U /home/user/data/sub"); code != 0 || out != "kept\nuser\n" {
		t.Fatalf("second sandbox: %d %q", code, out)
	}
	if err := o.Destroy(ctx, "vol-r"); err != nil {
		t.Fatal(err)
	}
	if err := o.RemoveVolume(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.volumeDir("vol-a")); !os.IsNotExist(err) {
		t.Fatalf("volume dir left: %v", err)
	}
	if _, err := o.Create(ctx, runtime.Spec{ID: "vol-gone", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, DiskBytes: 32 << 20}, Volumes: []runtime.VolumeMount{{ID: "vol-a", Path: "/data"}}}); err == nil || !strings.Contains(err.Error(), runtime.ErrVolumeNotFound.Error()) {
		t.Fatalf("mount a removed volume: %v, want ErrVolumeNotFound", err)
	}
	assertGone(t, o, "vol-gone")
}

// TestVolumeConfinement: the kernel keeps a sandbox within what it was
// given of a volume. Read-only: no write, by user or root, nor a remount
// (control: the same writes in a read-write mount succeed). Size: a write
// past the volume's size fails with ENOSPC (control: the same write fits
// the sandbox's own disk). Escape: a symlink to a host file, and "..",
// resolve in the sandbox's own root, never the host's (control: on the
// host the same link reaches the file, and ".." of the volume's root
// holds its image).
func TestVolumeConfinement(t *testing.T) {
	o := volumeRuntime(t, "vol-conf")
	ctx := context.Background()
	if err := o.MakeVolume(ctx, "vol-c", 8<<20); err != nil {
		t.Fatal(err)
	}
	defer o.RemoveVolume(ctx, "vol-c")
	secret := filepath.Join(testutil.ShortTempDir(t), "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o644); err != nil {
		t.Fatal(err)
	}
	rw := volumeSandbox(t, o, "vol-rw", runtime.VolumeMount{ID: "vol-c", Path: "/data"})
	ro := volumeSandbox(t, o, "vol-ro", runtime.VolumeMount{ID: "vol-c", Path: "/data", ReadOnly: true})

	t.Run("ReadOnly", func(t *testing.T) {
		if out, code := shell(t, rw, "", "echo w > /data/w && echo ok"); code != 0 {
			t.Fatalf("control: write in the read-write mount: %d %q", code, out)
		}
		for _, c := range []struct{ user, script string }{
			{"", "echo x > /data/x"},
			{agentproto.UserRoot, "echo x > /data/x"},
			{agentproto.UserRoot, "rm /data/w"},
			{agentproto.UserRoot, "mount -o remount,rw /data && echo x > /data/x"},
			{agentproto.UserRoot, "mount -o remount,bind,rw /data && echo x > /data/x"},
		} {
			if out, code := shell(t, ro, c.user, c.script); code == 0 {
				t.Errorf("%s as %q in the read-only mount succeeded: %q", c.script, c.user, out)
			}
		}
		if out, code := shell(t, ro, "", "cat /data/w"); code != 0 || out != "w\n" {
			t.Errorf("read in the read-only mount: %d %q", code, out)
		}
	})
	t.Run("Size", func(t *testing.T) {
		if out, code := shell(t, rw, "", "dd if=/dev/zero of=/tmp/big bs=1M count=12 2>&1 && rm /tmp/big"); code != 0 {
			t.Fatalf("control: 12 MiB on the sandbox's own disk: %d %q", code, out)
		}
		out, code := shell(t, rw, "", "dd if=/dev/zero of=/data/big bs=1M count=12 2>&1")
		if code == 0 || !strings.Contains(out, "No space left on device") {
			t.Fatalf("12 MiB in a volume of 8: %d %q", code, out)
		}
		if used, total, err := o.VolumeUsage(ctx, "vol-c"); err != nil || used > total || total > 10<<20 {
			t.Fatalf("volume usage %d of %d (%v)", used, total, err)
		}
		shell(t, rw, "", "rm -f /data/big")
	})
	t.Run("Escape", func(t *testing.T) {
		if out, code := shell(t, rw, "", "ln -s "+secret+" /data/esc && ln -s ../../../../../../../.. /data/up"); code != 0 {
			t.Fatal(out)
		}
		mnt := filepath.Join(o.volumeDir("vol-c"), "mnt")
		if b, err := os.ReadFile(filepath.Join(mnt, "esc")); err != nil || string(b) != "host only" {
			t.Fatalf("control: the link resolved on the host reads %q, %v", b, err)
		}
		if _, err := os.Stat(filepath.Join(mnt, "..", diskImage)); err != nil {
			t.Fatalf("control: the image beside the volume's root on the host: %v", err)
		}
		for _, script := range []string{"cat /data/esc", "cat /data/up" + secret, "ls /data/../" + diskImage, "ls /data/../../" + diskImage,
			"cat /data/../loop", "ls /data/up/volumes"} {
			for _, sock := range []string{rw, ro} {
				if out, code := shell(t, sock, agentproto.UserRoot, script); code == 0 {
					t.Errorf("%s reached the host: %q", script, out)
				}
			}
		}
		if out, code := shell(t, rw, "", "ls /data/up/usr/bin/python3"); code != 0 {
			t.Errorf("the link ends in the sandbox's own root: %d %q", code, out)
		}
	})
}

// TestVolumeCheckpointRestore: a sandbox that mounts a volume is
// checkpointed and restored with its mount: what it wrote before is
// there, and it writes on after.
func TestVolumeCheckpointRestore(t *testing.T) {
	o := volumeRuntime(t, "vol-ckpt")
	if err := o.criuReady(); err != nil {
		t.Fatalf("%v: run `make setup`", err)
	}
	ctx := context.Background()
	if err := o.MakeVolume(ctx, "vol-p", 8<<20); err != nil {
		t.Fatal(err)
	}
	sock := volumeSandbox(t, o, "vol-p1", runtime.VolumeMount{ID: "vol-p", Path: "/data"})
	if out, code := shell(t, sock, "", "echo before > /data/f"); code != 0 {
		t.Fatal(out)
	}
	dir := checkpointsDir(t)
	if err := o.Checkpoint(ctx, "vol-p1", dir); err != nil {
		t.Fatal(err)
	}
	inst, err := o.Restore(ctx, "vol-p1", dir)
	if err != nil {
		t.Fatal(err)
	}
	if out, code := shell(t, inst.Socket, "", "cat /data/f && echo after >> /data/f && cat /data/f"); code != 0 || out != "before\nbefore\nafter\n" {
		t.Fatalf("after the restore: %d %q", code, out)
	}
}
