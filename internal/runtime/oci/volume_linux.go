package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Persistent volumes (runtime.Volumes).
//
// A volume is an ext4 filesystem of its own, as a sandbox's disk is
// (disk_linux.go), but kept: an image at Config.VolumesDir/<id>/disk.img,
// formatted with a journal (it outlives sandboxes, engines and host
// crashes), attached to a loop device and mounted at <id>/mnt on first
// use, where it stays mounted until the volume is removed (a restarted
// engine finds the mount, or mounts the image again). The image's size
// bounds what every sandbox mounting it can write: past it a write fails
// with ENOSPC, whoever writes. The filesystem's root belongs to the
// template's "user" (uid 1000, shifted by Config.IDMap) and no host user
// other than root can reach it (VolumesDir is 0700).
//
// A sandbox mounting a volume sees it through an idmapped mount made for
// its own id range (the same user namespace that maps the template:
// idmapUserns), so that its files keep one owner on disk whichever
// sandbox wrote them: what uid 1000 of one sandbox writes, uid 1000 of
// the next owns. The idmapped mount, read-only when asked
// (MOUNT_ATTR_RDONLY, which the sandbox cannot lift: it has no
// CAP_SYS_ADMIN, and its seccomp profile refuses mount system calls), is
// attached in the bundle (volumes/<i>) and bound by runc at its path; a
// destroy detaches it before anything of the bundle is removed.

const volumeUser = 1000 // the template's "user", who owns a volume's root

// volumeLock serialises making, mounting and removing volumes.
var volumeLock sync.Mutex

func (o *OCI) volumeDir(id string) string { return filepath.Join(o.cfg.VolumesDir, id) }

func (o *OCI) volumesOn() error {
	if o.cfg.VolumesDir == "" {
		return fmt.Errorf("%w: this engine keeps no volumes (Config.VolumesDir)", runtime.ErrUnsupported)
	}
	return nil
}

var _ runtime.Volumes = (*OCI)(nil)

// MakeVolume implements runtime.Volumes.
func (o *OCI) MakeVolume(ctx context.Context, id string, size int64) (err error) {
	if err := o.volumesOn(); err != nil {
		return err
	}
	if !validID(id) || size <= 0 {
		return fmt.Errorf("invalid volume %q of %d bytes", id, size)
	}
	mkfs, err := findMkfs()
	if err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	volumeLock.Lock()
	defer volumeLock.Unlock()
	if err := mkdirs(0o700, o.cfg.VolumesDir); err != nil {
		return err
	}
	dir := o.volumeDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("volume %s already exists", id)
		}
		return err
	}
	defer func() {
		if err != nil {
			o.removeVolume(id)
		}
	}()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return err
	}
	inodes := inodesFor(size)
	journal := min(max(size/32, 4<<20), 128<<20)
	img := roundBlock(size + inodes*256 + journal + min(size/50, 16<<20) + size/64 + 2<<20)
	if free := int64(fs.Bavail) * fs.Bsize; free-img < o.cfg.MinFreeDiskBytes {
		return fmt.Errorf("%w: the data dir has %d MiB free; a volume of %d MiB would leave less than %d MiB",
			runtime.ErrCapacity, free>>20, img>>20, o.cfg.MinFreeDiskBytes>>20)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	for range 4 {
		if err := formatVolume(mkfs, filepath.Join(dir, diskImage), img, inodes, journal, int(o.cfg.IDMap.HostID+volumeUser)); err != nil {
			return err
		}
		if err := o.mountVolume(id); err != nil {
			return err
		}
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			return err
		}
		free := int64(st.Bavail) * st.Bsize
		if free >= size {
			return os.Remove(filepath.Join(mnt, "lost+found"))
		}
		// Short of the size asked for: again, larger.
		if err := unmount(mnt); err != nil {
			return err
		}
		img = roundBlock(img + size - free + diskBlock)
	}
	return fmt.Errorf("format a volume of %d MiB: no size held it", size>>20)
}

// formatVolume makes an ext4 of size bytes, with a journal, at path: its
// root owned by uid (and gid), 0755.
func formatVolume(mkfs, path string, size, inodes, journal int64, uid int) error {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	switch err := unix.Fallocate(int(f.Fd()), 0, 0, size); {
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%w: no room on the data dir for a volume of %d MiB", runtime.ErrCapacity, size>>20)
	case errors.Is(err, unix.EOPNOTSUPP):
		if err := f.Truncate(size); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("allocate the volume's image: %w", err)
	}
	owner := strconv.Itoa(uid)
	cmd := exec.Command(mkfs, "-q", "-F", "-t", "ext4", "-b", strconv.Itoa(diskBlock), "-I", "256",
		"-N", strconv.FormatInt(inodes, 10), "-m", "0", "-J", "size="+strconv.FormatInt(journal>>20, 10),
		"-E", "lazy_itable_init=1,nodiscard,root_owner="+owner+":"+owner, "-L", "volume", path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, tail(out))
	}
	return nil
}

// mounted reports whether dir is a mount point (its device is not its
// parent's).
func mounted(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// mountVolume mounts volume id's image at its mnt, unless it is mounted
// already. volumeLock is held.
func (o *OCI) mountVolume(id string) error {
	dir := o.volumeDir(id)
	mnt := filepath.Join(dir, "mnt")
	switch ok, err := mounted(mnt); {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w: %s", runtime.ErrVolumeNotFound, id)
	case err != nil:
		return err
	case ok:
		return nil
	}
	img, err := os.OpenFile(filepath.Join(dir, diskImage), os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s", runtime.ErrVolumeNotFound, id)
	}
	if err != nil {
		return err
	}
	defer img.Close()
	dev, err := attach(img, func(n int) error {
		return os.WriteFile(filepath.Join(dir, diskLoop), []byte(strconv.Itoa(n)), 0o600)
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := unix.Mount(dev.Name(), mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount volume %s: %w", id, err)
	}
	return nil
}

// RemoveVolume implements runtime.Volumes.
func (o *OCI) RemoveVolume(_ context.Context, id string) error {
	if err := o.volumesOn(); err != nil {
		return err
	}
	if !validID(id) {
		return nil
	}
	volumeLock.Lock()
	defer volumeLock.Unlock()
	return o.removeVolume(id)
}

// removeVolume unmounts and removes volume id; nothing is removed while
// its filesystem stays mounted. volumeLock is held.
func (o *OCI) removeVolume(id string) error {
	dir := o.volumeDir(id)
	mnt := filepath.Join(dir, "mnt")
	if err := unmount(mnt); err != nil {
		return err
	}
	if ok, err := mounted(mnt); err == nil && ok {
		return fmt.Errorf("volume %s is still mounted at %s", id, mnt)
	}
	if err := detachLoop(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// VolumeUsage implements runtime.Volumes.
func (o *OCI) VolumeUsage(_ context.Context, id string) (used, total int64, err error) {
	if err := o.volumesOn(); err != nil {
		return 0, 0, err
	}
	if !validID(id) {
		return 0, 0, runtime.ErrVolumeNotFound
	}
	volumeLock.Lock()
	defer volumeLock.Unlock()
	if err := o.mountVolume(id); err != nil {
		return 0, 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(o.volumeDir(id), "mnt"), &st); err != nil {
		return 0, 0, err
	}
	used = int64(st.Blocks-st.Bfree) * st.Bsize
	return used, used + int64(st.Bavail)*st.Bsize, nil
}

var _ runtime.VolumeOpener = (*OCI)(nil)

// OpenVolume implements runtime.VolumeOpener: the volume's root, owned
// as sandboxes' "user" owns it on disk.
func (o *OCI) OpenVolume(_ context.Context, id string) (*os.File, int, int, error) {
	if err := o.volumesOn(); err != nil {
		return nil, 0, 0, err
	}
	if !validID(id) {
		return nil, 0, 0, runtime.ErrVolumeNotFound
	}
	volumeLock.Lock()
	defer volumeLock.Unlock()
	if err := o.mountVolume(id); err != nil {
		return nil, 0, 0, err
	}
	f, err := os.OpenFile(filepath.Join(o.volumeDir(id), "mnt"), os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, 0, err
	}
	owner := int(o.cfg.IDMap.HostID + volumeUser)
	return f, owner, owner, nil
}

// volumeAt is where a sandbox's i-th volume is attached in its bundle.
func volumeAt(b string, i int) string { return filepath.Join(b, "volumes", strconv.Itoa(i)) }

// attachVolumes attaches an idmapped mount of each of s's volumes, for
// the id range at base, in bundle b (volumeAt), and returns the spec's
// mounts that bind them at their paths.
func (o *OCI) attachVolumes(b string, s runtime.Spec, base uint32) ([]specs.Mount, error) {
	if len(s.Volumes) == 0 {
		return nil, nil
	}
	if err := o.volumesOn(); err != nil {
		return nil, err
	}
	userns, err := o.idmapUserns(base)
	if err != nil {
		return nil, err
	}
	// As the bundle: its own root and the sandbox's pass (a restore's
	// CRIU, as the sandbox's root, opens each attachment again).
	vols := filepath.Join(b, "volumes")
	if err := os.Mkdir(vols, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(vols, 0, int(base)); err != nil {
		return nil, err
	}
	if err := os.Chmod(vols, 0o710); err != nil {
		return nil, err
	}
	volumeLock.Lock()
	defer volumeLock.Unlock()
	var out []specs.Mount
	for i, v := range s.Volumes {
		if !validID(v.ID) {
			return nil, fmt.Errorf("%w: %q", runtime.ErrVolumeNotFound, v.ID)
		}
		if err := o.mountVolume(v.ID); err != nil {
			return nil, err
		}
		tree, err := unix.OpenTree(unix.AT_FDCWD, filepath.Join(o.volumeDir(v.ID), "mnt"), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("open_tree volume %s: %w", v.ID, err)
		}
		attr := &unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(userns.Fd()),
		}
		if v.ReadOnly {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
			unix.Close(tree)
			return nil, fmt.Errorf("idmap volume %s: %w", v.ID, err)
		}
		at := volumeAt(b, i)
		if err := os.Mkdir(at, 0o700); err != nil {
			unix.Close(tree)
			return nil, err
		}
		err = unix.MoveMount(tree, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(tree)
		if err != nil {
			return nil, fmt.Errorf("attach volume %s: %w", v.ID, err)
		}
		opts := []string{"rbind", "rw", "nosuid", "nodev"}
		if v.ReadOnly {
			opts[1] = "ro"
		}
		out = append(out, specs.Mount{Destination: v.Path, Type: "bind", Source: at, Options: opts})
	}
	return out, nil
}

// detachVolumes detaches every volume attached in bundle b; it fails
// while one stays, so that nothing removes the bundle over a volume.
func detachVolumes(b string) error {
	entries, err := os.ReadDir(filepath.Join(b, "volumes"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		at := filepath.Join(b, "volumes", e.Name())
		if err := unmount(at); err != nil {
			errs = append(errs, err)
			continue
		}
		if ok, err := mounted(at); err != nil || ok {
			errs = append(errs, fmt.Errorf("volume still attached at %s: %v", at, err))
		}
	}
	return errors.Join(errs...)
}
