package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Who may ask the agent to start a process from inside the sandbox.
//
// Code that runs under allow_subprocess: false runs under the
// no-subprocess seccomp filter (internal/kernel), which the kernel adds
// to the interpreter's own: the kernel counts a process's filters
// (/proc/PID/status, Seccomp_filters, Linux 5.9). Every other process of
// the sandbox carries exactly the agent's (those the runtime put on the
// sandbox's first process, which everything inherits), unless it added
// one of its own. A helper of the agent that starts processes for a
// caller inside the sandbox (sudo) refuses a caller with more filters
// than the agent: the kernel's record of the caller, not anything the
// caller says, decides.
//
// The caller is the process that connected the socket (the kernel
// records it at connect). Where the kernel can (SO_PEERPIDFD, Linux 6.5)
// it hands over a pidfd of that very process; elsewhere the pid it
// records is opened as a pidfd. Its status is read, and the pidfd then
// shows the process still alive, so that the status read was the
// caller's and not that of a process that got its pid after it died. A
// caller that is gone is refused: nothing can be said of it.
//
// gVisor's kernel does not count filters (its status shows only the
// mode). There the check stands on what the agent knows instead: no code
// of this sandbox has run under allow_subprocess: false
// (Config.SubprocessDenied; the engine refuses the policy under gVisor,
// so there none ever does), hence no caller is under the no-subprocess
// filter; a filter a process installed itself is not seen there. Once
// any code has run under it, a caller that cannot be counted is refused.

// errCallerGone is a caller that exited before it could be looked at.
var errCallerGone = errors.New("the calling process is gone")

// ownFilters is the number of seccomp filters the agent runs under.
var ownFilters = sync.OnceValues(func() (int, error) { return seccompFilters("self") })

// errNoFilterCount is a kernel that does not count seccomp filters.
var errNoFilterCount = errors.New("the kernel does not count seccomp filters (Linux 5.9 or later does)")

// seccompFilters reads Seccomp_filters of /proc/<pid>/status.
func seccompFilters(pid string) (int, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Seccomp_filters:")); ok {
			return strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	return 0, errNoFilterCount
}

// callerConfined reports whether the process that connected c runs under
// more seccomp filters than the agent (the no-subprocess filter, or one
// of its own making). denied reports whether any code of this sandbox
// has run under allow_subprocess: false (nil: assume so); it decides
// where the kernel does not count filters.
func callerConfined(c *net.UnixConn, denied func() bool) (bool, error) {
	own, err := ownFilters()
	if errors.Is(err, errNoFilterCount) && denied != nil && !denied() {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	pidfd, pid, err := peerPidfd(c)
	if err != nil {
		return false, err
	}
	defer unix.Close(pidfd)
	n, err := seccompFilters(strconv.Itoa(pid))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	// The status read was the caller's only if the caller still lives.
	if serr := unix.PidfdSendSignal(pidfd, 0, nil, 0); serr != nil || errors.Is(err, os.ErrNotExist) {
		return false, errCallerGone
	}
	return n > own, nil
}

// peerPidfd returns a pidfd of the process that connected c, and its pid
// in the agent's pid namespace.
func peerPidfd(c *net.UnixConn) (pidfd, pid int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, 0, err
	}
	var cred *unix.Ucred
	pidfd = -1
	var cerr, perr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		pidfd, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return -1, 0, err
	}
	if cerr != nil {
		return -1, 0, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred.Pid <= 0 {
		return -1, 0, errCallerGone
	}
	switch {
	case perr == nil:
		return pidfd, int(cred.Pid), nil
	case errors.Is(perr, unix.ESRCH):
		return -1, 0, errCallerGone
	case !errors.Is(perr, unix.ENOPROTOOPT):
		return -1, 0, fmt.Errorf("SO_PEERPIDFD: %w", perr)
	}
	// Before Linux 6.5: the pid the kernel recorded at connect.
	pidfd, err = unix.PidfdOpen(int(cred.Pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return -1, 0, errCallerGone
	}
	if err != nil {
		return -1, 0, fmt.Errorf("pidfd_open: %w", err)
	}
	return pidfd, int(cred.Pid), nil
}
