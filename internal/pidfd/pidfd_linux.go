// Package pidfd waits for a child process to exit without holding an OS
// thread. A goroutine blocked in wait4 or waitid holds its thread for as
// long as the child runs, so a program that waits for N children holds N
// threads. The agent cannot afford that: it runs within a small reserve of
// tasks beyond its sandbox's pids limit (internal/runtime/oci AgentPids),
// and the Go runtime cannot survive failing to make a thread. A pidfd is
// readable once its process has exited, so the runtime's poller parks
// the waiting goroutine instead.
//
// Imports: the standard library and x/sys only (the agent and the kernel
// drivers use it).
package pidfd

import (
	"os"

	"golang.org/x/sys/unix"
)

// AwaitExit returns once the child process pid has exited, leaving it to
// be reaped (os.Process.Wait, exec.Cmd.Wait then return at once). The
// child must not have been reaped yet, so that pid is still it. An error
// (a kernel without pidfds, 5.10 for PIDFD_NONBLOCK) means nothing was
// waited for: the caller waits as it did before.
func AwaitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: on the poller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
		if werr == unix.EINTR {
			return false
		}
		// A child found is reported with SIGCHLD; none yet leaves it 0.
		return werr != nil || info.Signo == int32(unix.SIGCHLD)
	}); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	return nil
}
