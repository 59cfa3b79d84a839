package batch

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// nobody is the host id the check runs as, in a user namespace that maps
// it alone.
const nobody = 65534

// confinement says which layers a run applies; tests turn them off one
// at a time to show what each stops (the controls).
type confinement struct {
	namespaces bool
	rlimits    bool
	seccomp    bool
}

var confined = confinement{namespaces: true, rlimits: true, seccomp: true}

// Version returns the host Python's major.minor ("3.11"), asked of it in
// the same confinement as a check.
func (h HostCheck) Version(ctx context.Context) (string, error) {
	out, err := h.withDefaults().run(ctx, versionScript, nil, confined)
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(out))
	if !pythonVersion.MatchString(v) {
		return "", fmt.Errorf("%w: %s printed %q for its version", ErrCheckUnavailable, h.Python, v)
	}
	return v, nil
}

// Check parses and compiles code with the host's Python in its
// confinement, running none of it. Its error is an ErrCheckUnavailable
// (check elsewhere) or a *CheckFailure (the code is refused).
func (h HostCheck) Check(ctx context.Context, code string) (CheckResult, error) {
	return h.check(ctx, code, confined)
}

func (h HostCheck) check(ctx context.Context, code string, c confinement) (CheckResult, error) {
	var res CheckResult
	out, err := h.withDefaults().run(ctx, hostCheckScript, []byte(code), c)
	if err != nil {
		return res, err
	}
	line, _, _ := bytes.Cut(out, []byte("\n"))
	if json.Unmarshal(line, &res) != nil {
		return res, &CheckFailure{Reason: "the check gave no verdict"}
	}
	return res, nil
}

// run runs script with the host's Python in the confinement c, stdin
// given once the process is confined, and returns what it printed.
func (h HostCheck) run(ctx context.Context, script string, stdin []byte, c confinement) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	if _, err := os.Stat(h.Python); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
	}
	dir, err := os.MkdirTemp("", "sheepfold-check-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
	}
	defer os.Remove(dir)
	// Empty, and nobody may write in it.
	if err := os.Chmod(dir, 0o555); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
	}
	args := []string{"-I", "-S", "-c", script, "-"}
	if c.seccomp {
		prog, nr, err := checkFilter()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
		}
		args = []string{"-I", "-S", "-c", script, hex.EncodeToString(prog), strconv.Itoa(nr)}
	}
	cmd := exec.CommandContext(ctx, h.Python, args...)
	cmd.Env = []string{}
	cmd.Dir = dir
	var stdout, stderr capped
	stdout.n, stderr.n = checkOutputBytes, 4<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if c.namespaces {
		cmd.SysProcAttr.Cloneflags = unix.CLONE_NEWUSER | unix.CLONE_NEWNET | unix.CLONE_NEWPID | unix.CLONE_NEWIPC |
			unix.CLONE_NEWUTS | unix.CLONE_NEWNS
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: nobody, HostID: nobody, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: nobody, HostID: nobody, Size: 1}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = false
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody, NoSetGroups: true}
	}
	cmd.WaitDelay = h.Timeout
	// Pdeathsig is sent when the thread that started the child ends:
	// keep it until the child is gone.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %v", ErrCheckUnavailable, h.Python, err)
	}
	if c.rlimits {
		if err := h.limit(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
		}
	}
	// The code reaches the process only now, limited.
	go func() {
		_, _ = in.Write(stdin)
		in.Close()
	}()
	err = cmd.Wait()
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, &CheckFailure{Reason: fmt.Sprintf("it took more than %s", h.Timeout)}
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, exitFailure(cmd.ProcessState, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// limit sets the check's resource limits on pid.
func (h HostCheck) limit(pid int) error {
	for _, l := range []struct {
		name     string
		resource int
		cur, max uint64
	}{
		{"RLIMIT_AS", unix.RLIMIT_AS, h.MemoryBytes, h.MemoryBytes},
		{"RLIMIT_CPU", unix.RLIMIT_CPU, h.CPUSeconds, h.CPUSeconds + 1},
		{"RLIMIT_FSIZE", unix.RLIMIT_FSIZE, 0, 0},
		{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, 16, 16},
		{"RLIMIT_NPROC", unix.RLIMIT_NPROC, 0, 0},
		{"RLIMIT_CORE", unix.RLIMIT_CORE, 0, 0},
		{"RLIMIT_MEMLOCK", unix.RLIMIT_MEMLOCK, 0, 0},
	} {
		if err := unix.Prlimit(pid, l.resource, &unix.Rlimit{Cur: l.cur, Max: l.max}, nil); err != nil {
			return fmt.Errorf("prlimit %s: %w", l.name, err)
		}
	}
	return nil
}

// exitFailure says how a check that ended without a verdict ended.
func exitFailure(ps *os.ProcessState, err error, stderr string) error {
	if ps == nil {
		return fmt.Errorf("%w: %v", ErrCheckUnavailable, err)
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		switch ws.Signal() {
		case syscall.SIGXCPU, syscall.SIGKILL:
			return &CheckFailure{Reason: "it used more than its CPU time"}
		case syscall.SIGSEGV, syscall.SIGABRT:
			return &CheckFailure{Reason: "the parser ran out of memory or stack"}
		}
		return &CheckFailure{Reason: "the parser was killed by " + ws.Signal().String()}
	}
	if strings.Contains(stderr, "MemoryError") {
		return &CheckFailure{Reason: "it needs more memory than the check may use"}
	}
	if strings.Contains(stderr, "seccomp") || strings.Contains(stderr, "PR_SET_NO_NEW_PRIVS") {
		return fmt.Errorf("%w: %s", ErrCheckUnavailable, lastLine(stderr))
	}
	return &CheckFailure{Reason: "the parser failed: " + lastLine(stderr)}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// capped keeps the first n bytes written to it and drops the rest.
type capped struct {
	bytes.Buffer
	n int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.n - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

var _ io.Writer = (*capped)(nil)

// checkSyscalls are what the check needs once it holds the code: read
// the pipe, parse and compile in its memory, write the pipe, exit.
var checkSyscalls = []uint32{
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_CLOSE, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_LSEEK,
	unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MREMAP, unix.SYS_BRK, unix.SYS_MADVISE, unix.SYS_MPROTECT,
	unix.SYS_FUTEX, unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN, unix.SYS_SIGALTSTACK,
	unix.SYS_GETRANDOM, unix.SYS_CLOCK_GETTIME, unix.SYS_GETPID, unix.SYS_GETTID,
	unix.SYS_EXIT, unix.SYS_EXIT_GROUP,
}

// checkFilter is the check's seccomp filter, as struct sock_filter records
// (native byte order), and the number of the seccomp system call: the
// host's architecture only, and of its system calls checkSyscalls; any
// other fails with EPERM.
func checkFilter() ([]byte, int, error) {
	var audit uint32
	switch goruntime.GOARCH {
	case "amd64":
		audit = unix.AUDIT_ARCH_X86_64
	case "arm64":
		audit = unix.AUDIT_ARCH_AARCH64
	default:
		return nil, 0, fmt.Errorf("no seccomp filter for the check on %s", goruntime.GOARCH)
	}
	const (
		retAllow = 0x7fff0000
		retErrno = 0x00050000
	)
	n := len(checkSyscalls)
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: audit, SkipFalse: uint8(n + 1)},
		bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr (x32's numbers match none)
	}
	for i, nr := range checkSyscalls {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(n - i)})
	}
	prog = append(prog, bpf.RetConstant{Val: retErrno | uint32(unix.EPERM)}, bpf.RetConstant{Val: retAllow})
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, 0, err
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, unix.SYS_SECCOMP, nil
}
