package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestHelperConfinedCaller is not a test: TestCallerConfined runs the test
// binary as this helper, which connects to the socket named by
// CONFINED_SOCKET (after putting itself under an allow-all seccomp filter
// when CONFINED_FILTER is set) and waits for its stdin to close.
func TestHelperConfinedCaller(t *testing.T) {
	name := os.Getenv("CONFINED_SOCKET")
	if name == "" {
		t.Skip("a helper process of TestCallerConfined")
	}
	if os.Getenv("CONFINED_FILTER") != "" {
		prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW}}
		fprog := unix.SockFprog{Len: 1, Filter: &prog[0]}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
			uintptr(unsafe.Pointer(&fprog))); errno != 0 {
			t.Fatal(errno)
		}
	}
	c, err := net.Dial("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte{'x'})
	if os.Getenv("CONFINED_EXIT") != "" {
		os.Exit(0)
	}
	var b [1]byte
	os.Stdin.Read(b[:])
}

// TestCallerConfined: the agent tells a caller under a seccomp filter of
// its own (as code under allow_subprocess: false is) from one without,
// from the kernel's records; a caller that is gone is refused.
func TestCallerConfined(t *testing.T) {
	t.Parallel()
	if _, err := seccompFilters("self"); err != nil {
		t.Skipf("this kernel cannot tell: %v", err)
	}
	name := fmt.Sprintf("@sheepfold-confined-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	caller := func(env ...string) (*net.UnixConn, *exec.Cmd) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperConfinedCaller$")
		cmd.Env = append(os.Environ(), append(env, "CONFINED_SOCKET="+name)...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Wait() })
		c, err := ln.AcceptUnix()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		return c, cmd
	}
	c, _ := caller()
	if confined, err := callerConfined(c, nil); err != nil || confined {
		t.Fatalf("a caller without a filter of its own: %v %v", confined, err)
	}
	c, _ = caller("CONFINED_FILTER=1")
	if confined, err := callerConfined(c, nil); err != nil || !confined {
		t.Fatalf("a caller under a filter of its own: %v %v", confined, err)
	}
	c, cmd := caller("CONFINED_EXIT=1")
	cmd.Wait()
	if _, err := callerConfined(c, nil); !errors.Is(err, errCallerGone) {
		t.Fatalf("a caller that is gone: %v, want errCallerGone", err)
	}
}

// TestCallerConfinedWithoutCount: where the kernel does not count seccomp
// filters (gVisor), a caller is taken as unconfined only while no code of
// the sandbox has run under allow_subprocess: false; once some has, or
// when the agent cannot tell, the caller is refused.
func TestCallerConfinedWithoutCount(t *testing.T) {
	old := ownFilters
	ownFilters = func() (int, error) { return 0, errNoFilterCount }
	t.Cleanup(func() { ownFilters = old })
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	no, yes := func() bool { return false }, func() bool { return true }
	if confined, err := callerConfined(a, no); err != nil || confined {
		t.Fatalf("no code under allow_subprocess: false: %v %v", confined, err)
	}
	for name, denied := range map[string]func() bool{"some code under it": yes, "unknown": nil} {
		if _, err := callerConfined(a, denied); !errors.Is(err, errNoFilterCount) {
			t.Fatalf("%s: %v, want a refusal", name, err)
		}
	}
}

// socketPair is a connected pair of unix sockets.
func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) (*net.UnixConn, error) {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}
	a, err := conn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	b, err := conn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}
