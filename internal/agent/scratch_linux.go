package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/homeseed"
)

// A Pod's scratch volume. The local engine gives a sandbox a tmpfs of its
// disk size as the writable layer of its whole root. A Pod's writable
// layer is its node's (the container runtime's snapshot), which the
// sandbox can neither size nor measure; so the Kubernetes runtime mounts
// a memory-backed emptyDir of the disk size over the home and /tmp,
// where the user's files go, and the agent prepares it before it serves
// (PrepareScratch): the template's home, which the volume hides, unpacked
// from the image's home seed; /tmp world-writable and sticky. The usage
// op then reports the volume's use as the sandbox's disk (Config.Disk).

// PrepareScratch readies a scratch volume mounted (as two sub-directories
// of one volume) over home and tmp, sandbox paths under root: it unpacks
// the home seed archive at seed into home, owned by the sandbox's user,
// and makes tmp root's, mode 1777.
func PrepareScratch(root, home, tmp, seed string) error {
	f, err := os.Open(hostPath(root, seed))
	if err != nil {
		return fmt.Errorf("the image's home seed: %w (export the template with this version: sheepfold template export)", err)
	}
	defer f.Close()
	if err := homeseed.Unpack(f, hostPath(root, home), defaultUID, defaultGID); err != nil {
		return err
	}
	t := hostPath(root, tmp)
	if err := os.Lchown(t, 0, 0); err != nil {
		return err
	}
	return os.Chmod(t, os.ModeSticky|0o777)
}

// diskUsage is the use and size of the file system at path (statfs).
func diskUsage(path string) (used, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// OwnVolume gives the root of a persistent volume mounted read-write at
// sandbox path p (under root) to the sandbox's user when it is root's: a
// fresh claim's storage is made by its provisioner as root's, where the
// code (uid 1000) could not write. Only that directory, never what is in
// it, and never through a symlink (p is a mount point the runtime made;
// nothing of the sandbox has run yet). A root owned by anyone else is
// left as it is: the volume was given before, or its storage says whose
// it is.
func OwnVolume(root, p string) error {
	f, err := os.OpenFile(hostPath(root, p), os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the volume: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat the volume: %w", err)
	}
	if st.Uid != 0 {
		return nil
	}
	if err := unix.Fchown(int(f.Fd()), defaultUID, defaultGID); err != nil {
		return fmt.Errorf("give the volume to the user: %w", err)
	}
	return nil
}
