package oci

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// A user namespace is owned by the effective uid of the process that
// creates it, and runc creates them as root. To give each sandbox a
// namespace owned by its own host uid (see ids_linux.go), the engine
// creates it: as that uid it runs util-linux's `unshare --user cat`,
// which makes the namespace and execs cat in it; cat echoing a byte back
// says the namespace exists; the engine writes the id maps, and runc joins
// the namespace through /proc/<cat>/ns/user. Small C programs, not the
// engine itself (Go forks rather than vforks for CLONE_NEWUSER, copying
// the engine's page tables: about 7 ms of CPU per sandbox, more as the
// engine grows) nor the Go agent (whose start costs as much).
//
// cat runs in the host's mount namespace as the owner uid, with no
// capabilities (it execs before its uid is mapped, so the kernel gives it
// none), until the engine closes its stdin or dies.
//
// Two programs started cost about 7 ms of CPU here (an exec alone is 2-3
// ms on the development VM), so the runtime makes a few of these ahead of
// need, off a create's path (spare_linux.go).

// idRange maps Size ids from Inside (in the new namespace) to Host.
type idRange struct{ Inside, Host, Size uint32 }

// nsTools are the programs that make a user namespace and hold it, and
// nsenter, which a restore runs in one (setNamespaceLimits).
type nsTools struct{ unshare, cat, nsenter string }

// findNSTools looks the programs up on the host.
func findNSTools() (nsTools, error) {
	var t nsTools
	var err error
	if t.unshare, err = exec.LookPath("unshare"); err != nil {
		return t, fmt.Errorf("util-linux's unshare: %w", err)
	}
	if t.cat, err = exec.LookPath("cat"); err != nil {
		return t, err
	}
	if t.nsenter, err = exec.LookPath("nsenter"); err != nil {
		return t, fmt.Errorf("util-linux's nsenter: %w", err)
	}
	return t, nil
}

// nsHolder keeps a user namespace alive while it is joined or opened.
type nsHolder struct {
	cmd   *exec.Cmd
	stdin *os.File // closing it ends the holder
}

// newUserns makes a user namespace owned by host uid and gid owner (0: the
// engine's own root) with ids mapped by m, kept alive until close.
func (t nsTools) newUserns(owner uint32, m idRange) (*nsHolder, error) {
	stdin, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer stdin.Close()
	cmd := exec.Command(t.unshare, "--user", t.cat)
	cmd.Stdin = stdin
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: owner, Gid: owner, Groups: []uint32{}}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start user namespace holder: %w", err)
	}
	h := &nsHolder{cmd: cmd, stdin: w}
	// cat answers only once it runs, which is after unshare made the
	// namespace.
	var b [1]byte
	if _, err := w.Write([]byte{'\n'}); err != nil {
		h.close()
		return nil, fmt.Errorf("user namespace holder: %w", err)
	}
	if _, err := io.ReadFull(out, b[:]); err != nil {
		h.close()
		return nil, fmt.Errorf("user namespace holder did not start: %w", err)
	}
	maps := []byte(fmt.Sprintf("%d %d %d\n", m.Inside, m.Host, m.Size))
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", cmd.Process.Pid, f), maps, 0); err != nil {
			h.close()
			return nil, fmt.Errorf("write %s of user namespace holder: %w", f, err)
		}
	}
	return h, nil
}

// path names the namespace for runc.
func (h *nsHolder) path() string { return fmt.Sprintf("/proc/%d/ns/user", h.cmd.Process.Pid) }

// open returns a descriptor of the namespace.
func (h *nsHolder) open() (*os.File, error) {
	return os.OpenFile(h.path(), os.O_RDONLY|unix.O_CLOEXEC, 0)
}

// close ends the holder and reaps it; the namespace lives on while
// anything else holds it.
func (h *nsHolder) close() {
	h.stdin.Close()
	_ = h.cmd.Wait()
}

// idmappedTree returns a detached mount of dir, read-only, whose owners
// appear mapped through the user namespace userns (an idmapped mount):
// an owner k on disk appears as the host id k maps to in userns.
func idmappedTree(dir string, userns *os.File) (int, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", dir, err)
	}
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("idmap %s: %w", dir, err)
	}
	return tree, nil
}
