package doctor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// probeUserns starts /bin/true in a new user namespace.
func probeUserns() error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	return cmd.Run()
}

// probeOverlay mounts, in a private directory under dataDir, an overlay
// whose lower layer is on dataDir's filesystem and whose upper layer is a
// tmpfs (as a sandbox's root is), then takes it all down again.
func probeOverlay(dataDir string) (err error) {
	dir, err := os.MkdirTemp(dataDir, ".doctor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lower, rw, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "rw"), filepath.Join(dir, "merged")
	for _, d := range []string{lower, rw, merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0700"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer unix.Unmount(rw, unix.MNT_DETACH)
	upper, work := filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return unix.Unmount(merged, unix.MNT_DETACH)
}

func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}
