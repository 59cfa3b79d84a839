package kernel

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/fdpass"
)

// The supervisor side of the no-subprocess filter (internal/policy's
// NoSubprocessFilter), whose refusals reach a listener (seccomp user
// notification) instead of failing silently.
//
// The filter is installed with SECCOMP_FILTER_FLAG_NEW_LISTENER by the
// process it confines: the Python driver on itself when a policy asks for
// it, or the seccomp-exec helper (SeccompExec) just before it execs Node.
// Either sends the listener to the agent over a socket pair the kernel
// gave the interpreter as fd 5 (SCM_RIGHTS) and closes its own copy before
// any user code runs under the filter. The agent answers every
// notification with EPERM (never "continue", but for the helper's one exec
// of the interpreter) and counts it for the execution loop to report as a
// violation. If the agent is gone, the kernel fails the notified calls
// with ENOSYS: they are refused either way.

// listenerFD is the interpreter's end of the socket pair a filter's
// listener is sent over.
const listenerFD = 5

// The layout of the kernel's struct seccomp_notif and seccomp_notif_resp.
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// nativeSyscalls names the process-creating system calls of this
// architecture that the filter hands to the supervisor; audit is its
// AUDIT_ARCH value. x32 numbers (amd64 only) carry x32Bit.
var nativeSyscalls = map[string]struct {
	audit uint32
	names map[int32]string
}{
	"amd64": {0xc000003e, map[int32]string{59: "execve", 322: "execveat", 57: "fork", 58: "vfork", 56: "clone"}},
	"arm64": {0xc00000b7, map[int32]string{221: "execve", 281: "execveat", 220: "clone"}},
}

const x32Bit = 0x40000000

// classify names a notified system call: its violation kind and target.
func classify(d seccompData) (kind, target string) {
	a := nativeSyscalls[runtime.GOARCH]
	if d.Arch == a.audit && d.Nr&x32Bit == 0 {
		if name, ok := a.names[d.Nr]; ok {
			return "subprocess_denied", name
		}
		return "syscall_denied", "syscall " + strconv.Itoa(int(d.Nr))
	}
	if d.Arch == a.audit {
		return "syscall_denied", fmt.Sprintf("x32 syscall %d", d.Nr&^x32Bit)
	}
	return "syscall_denied", fmt.Sprintf("syscall %d of architecture %#x", d.Nr, d.Arch)
}

// denials counts what a filter refused, by violation, between two looks
// of the execution loop. A fork loop costs the agent one answer per
// attempt and the host at most two events per kind and target per
// execution (the first at once, the rest counted in one at the end).
type denials struct {
	// mu guards counts.
	mu     sync.Mutex
	counts map[agentproto.Violation]int64
	kick   chan struct{} // has a value when counts has news
}

func newDenials() *denials {
	return &denials{counts: map[agentproto.Violation]int64{}, kick: make(chan struct{}, 1)}
}

func (d *denials) add(v agentproto.Violation) {
	d.mu.Lock()
	d.counts[v]++
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// take returns the counts since the last take and resets them.
func (d *denials) take() map[agentproto.Violation]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.counts) == 0 {
		return nil
	}
	out := d.counts
	d.counts = map[agentproto.Violation]int64{}
	return out
}

// listenerChannel makes the socket pair a filter's listener comes back
// over: the interpreter's end (its fd 5) and the kernel's.
func listenerChannel() (child *os.File, own *net.UnixConn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("listener socket pair: %w", err)
	}
	child = os.NewFile(uintptr(fds[0]), "seccomp-listener-child")
	f := os.NewFile(uintptr(fds[1]), "seccomp-listener")
	c, err := net.FileConn(f) // dups it
	f.Close()
	if err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("listener socket: %w", err)
	}
	return child, c.(*net.UnixConn), nil
}

// receiveListener waits on own for the interpreter's filter listener and
// supervises the first one that arrives, until it or own is closed. Any
// other descriptor sent is closed. execPID, when not 0, is the
// seccomp-exec helper whose one exec of the interpreter is let through.
// The listener is kept in *keep (under mu) so that kill can close it.
func receiveListener(own *net.UnixConn, execPID int, d *denials, mu *sync.Mutex, keep **os.File) {
	defer own.Close()
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		_, oobn, _, _, err := own.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var listener *os.File
		for _, fd := range fdpass.Received(oob[:oobn]) {
			// Non-blocking, so that the File waits in the runtime's
			// poller and Close ends the wait.
			if listener == nil && isListener(fd) && unix.SetNonblock(fd, true) == nil {
				listener = os.NewFile(uintptr(fd), "seccomp-listener")
				continue
			}
			unix.Close(fd)
		}
		if listener == nil {
			continue
		}
		mu.Lock()
		*keep = listener
		mu.Unlock()
		own.Close() // one listener per interpreter: nothing more is read
		supervise(listener, execPID, d)
		return
	}
}

func isListener(fd int) bool {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return err == nil && target == "anon_inode:seccomp notify"
}

// supervise answers the listener's notifications until the filter has no
// process left or the listener is closed: EPERM for each (counted in d),
// but, when execPID is not 0 (the seccomp-exec helper), the listener's
// first notification when it is that helper's execve, which continues.
func supervise(listener *os.File, execPID int, d *denials) {
	defer listener.Close()
	rc, err := listener.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n seccompNotif
		got, hup := false, false
		err := rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			k, err := unix.Poll(pfd, 0)
			if err == unix.EINTR || err == nil && k == 0 {
				return false // wait until readable
			}
			if err != nil {
				hup = true
				return true
			}
			if pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 && pfd[0].Revents&unix.POLLIN == 0 {
				hup = true
				return true
			}
			n = seccompNotif{}
			_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n)))
			got = errno == 0 // ENOENT: the caller died before it was read
			return true
		})
		if err != nil || hup {
			return
		}
		if !got {
			continue
		}
		resp := seccompNotifResp{ID: n.ID, Error: -int32(unix.EPERM)}
		kind, target := classify(n.Data)
		if execPID != 0 && (target != "execve" || kind != "subprocess_denied") {
			execPID = 0 // the first call was not the exec: nothing is let through
		}
		if execPID != 0 && target == "execve" && kind == "subprocess_denied" {
			// The listener's first notification is the helper's exec of
			// the interpreter: the filter is on the helper alone, which
			// makes no other call the filter hands over before it, and no
			// user code has run. (Matching the caller's thread group
			// through /proc, as before, failed now and then.)
			resp = seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
			execPID = 0
		} else {
			// Counted before the answer, so that the execution that
			// made the call sees it before the call returns.
			d.add(agentproto.Violation{Kind: kind, Target: target})
		}
		rc.Control(func(fd uintptr) {
			unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
		})
	}
}

// installFilter installs prog (struct sock_filter records) on every thread
// of this process with a new listener, whose descriptor it returns.
func installFilter(prog []byte, nr int) (int, error) {
	if len(prog) == 0 || len(prog)%8 != 0 {
		return -1, errors.New("seccomp filter: bad program length")
	}
	fprog := unix.SockFprog{Len: uint16(len(prog) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	const flags = unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH
	fd, _, errno := unix.Syscall(uintptr(nr), 1 /* SECCOMP_SET_MODE_FILTER */, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	}
	return int(fd), nil
}

// landlockSelf puts the calling thread, and what it execs, in a Landlock
// domain of its own, as the Python driver does for itself (_landlock): it
// handles only the making of block devices (which a sandbox never may), so
// nothing of the file system changes, but a process in a domain fails
// ptrace's access check against every process outside it: no
// /proc/PID/mem, fd/N, environ or maps of another process, no
// pidfd_getfd, and so no way to make an unfiltered process of the same
// user start one. Where the kernel has no Landlock (before 5.13, or not
// enabled), or a seccomp profile refuses it, it does nothing.
func landlockSelf() error {
	attr := uint64(1 << 11) // struct landlock_ruleset_attr: handled_access_fs = LANDLOCK_ACCESS_FS_MAKE_BLOCK
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), 8, 0)
	runtime.KeepAlive(&attr)
	if errno == unix.ENOSYS || errno == unix.EOPNOTSUPP || errno == unix.EPERM {
		return nil // no Landlock, or the runtime's seccomp profile refuses it
	}
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return nil
}

// SeccompExec is the agent's "seccomp-exec" sub-command, which starts an
// interpreter under the no-subprocess filter: args are the filter
// (base64), the number of the seccomp system call, the program and its
// arguments. It installs the filter on itself and enters a Landlock domain
// (landlockSelf), sends the listener over fd 5 to the agent, closes it and
// fd 5, and execs the program, an exec the agent lets through as the only
// one. It returns only on failure.
func SeccompExec(args []string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "seccomp-exec:", err)
		return 126
	}
	if len(args) < 3 {
		return fail(errors.New("usage: seccomp-exec FILTER SYSCALL PROGRAM [ARG...]"))
	}
	prog, err := base64.StdEncoding.DecodeString(args[0])
	if err != nil {
		return fail(fmt.Errorf("filter: %w", err))
	}
	nr, err := strconv.Atoi(args[1])
	if err != nil {
		return fail(fmt.Errorf("syscall number: %w", err))
	}
	runtime.LockOSThread()
	fd, err := installFilter(prog, nr)
	if err != nil {
		return fail(err)
	}
	if err := landlockSelf(); err != nil {
		unix.Close(fd)
		return fail(err)
	}
	err = unix.Sendmsg(listenerFD, []byte{'L'}, unix.UnixRights(fd), nil, 0)
	unix.Close(fd)
	unix.Close(listenerFD)
	if err != nil {
		return fail(fmt.Errorf("send the listener: %w", err))
	}
	return fail(unix.Exec(args[2], args[2:], os.Environ()))
}
