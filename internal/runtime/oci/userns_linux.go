package oci

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/osthread"
)

// A user namespace is owned by the effective uid of the process that
// creates it, and runc creates them as root. To give each sandbox a
// namespace owned by its own host uid (see ids_linux.go), the engine
// creates it: it starts "agent hold" (which only waits for its stdin to
// close) in a new user namespace from an OS thread whose uids are the
// owner's, writes the id maps from a privileged thread, and runc joins the
// namespace through /proc/<holder>/ns/user. The thread that switched uids
// ends once the holder has started (osthread.Discarded).
//
// The holder runs the host's agent binary in the host's mount namespace,
// with no capabilities (it execs before its uid is mapped, so the kernel
// gives it none), and exits when the engine closes its stdin, or when the
// engine dies.

// idRange maps Size ids from Inside (in the new namespace) to Host.
type idRange struct{ Inside, Host, Size uint32 }

// nsHolder keeps a user namespace alive while it is joined or opened.
type nsHolder struct {
	cmd   *exec.Cmd
	stdin *os.File
}

// newUserns starts a holder in a new user namespace owned by host uid and
// gid owner (0: the engine's own root) with ids mapped by m.
func newUserns(agentBin string, owner uint32, m idRange) (*nsHolder, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(agentBin, "hold")
	cmd.Stdin = r
	cmd.Env = []string{}
	// No parent-death signal: the parent thread exits at once. A dying
	// engine closes the pipe, which ends the holder.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
	if err := startAs(cmd, owner); err != nil {
		w.Close()
		return nil, fmt.Errorf("start user namespace holder: %w", err)
	}
	h := &nsHolder{cmd: cmd, stdin: w}
	line := []byte(fmt.Sprintf("%d %d %d\n", m.Inside, m.Host, m.Size))
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", cmd.Process.Pid, f), line, 0); err != nil {
			h.close()
			return nil, fmt.Errorf("write %s of user namespace holder: %w", f, err)
		}
	}
	return h, nil
}

// startAs starts cmd from a thread whose real, effective and saved uids
// and gids are owner and that has no supplementary groups, so that a
// CLONE_NEWUSER in cmd's SysProcAttr makes a namespace owned by owner.
func startAs(cmd *exec.Cmd, owner uint32) error {
	if owner == 0 {
		return cmd.Start()
	}
	return osthread.Discarded(func() error {
		// Raw system calls: x/sys's and syscall's wrappers change the
		// credentials of every thread of the process.
		id := uintptr(owner)
		for _, c := range []struct {
			name string
			nr   uintptr
			args [3]uintptr
		}{
			{"setgroups", unix.SYS_SETGROUPS, [3]uintptr{0, 0, 0}},
			{"setresgid", unix.SYS_SETRESGID, [3]uintptr{id, id, id}},
			{"setresuid", unix.SYS_SETRESUID, [3]uintptr{id, id, id}},
		} {
			if _, _, e := unix.RawSyscall(c.nr, c.args[0], c.args[1], c.args[2]); e != 0 {
				return fmt.Errorf("%s: %w", c.name, e)
			}
		}
		return cmd.Start()
	})
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
	if err := h.cmd.Wait(); err != nil {
		// It only waits for EOF; anything else means it was killed.
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			_ = h.cmd.Process.Kill()
		}
	}
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
