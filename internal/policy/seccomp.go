package policy

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/net/bpf"
)

// The seccomp return values and data offsets the filter uses
// (linux/seccomp.h, linux/audit.h).
const (
	seccompRetAllow  = 0x7fff0000
	seccompRetErrno  = 0x00050000
	seccompRetNotify = 0x7fc00000 // SECCOMP_RET_USER_NOTIF
	errnoENOSYS      = 38
	cloneThread      = 0x00010000
	offNr            = 0  // seccomp_data.nr
	offArch          = 4  // seccomp_data.arch
	offArg0          = 16 // seccomp_data.args[0], its low 32 bits on little-endian machines
	x32SyscallBit    = 0x40000000
)

// seccompArch holds what the no-subprocess filter needs to know of one
// architecture. fork and vfork are -1 where they do not exist.
type seccompArch struct {
	audit                                uint32
	seccomp                              int
	execve, execveat, fork, vfork, clone int
	clone3                               int
	x32                                  bool // the x32 ABI shares the audit arch: deny its numbers
}

var seccompArches = map[string]seccompArch{
	"amd64": {audit: 0xc000003e, seccomp: 317, execve: 59, execveat: 322, fork: 57, vfork: 58, clone: 56, clone3: 435, x32: true},
	"arm64": {audit: 0xc00000b7, seccomp: 277, execve: 221, execveat: 281, fork: -1, vfork: -1, clone: 220, clone3: 435},
}

// NoSubprocessFilter returns the seccomp filter of allow_subprocess:
// false for an architecture (GOARCH name) as struct sock_filter records in
// little-endian order, and the number of the seccomp system call there.
//
// The filter hands to a supervisor (SECCOMP_RET_USER_NOTIF): execve,
// execveat, fork, vfork, and clone unless CLONE_THREAD is set (so threads
// keep working), and any system call made with another architecture's
// convention (32-bit int 0x80, x32). It is installed with
// SECCOMP_FILTER_FLAG_NEW_LISTENER and the listener goes to the agent
// (internal/kernel), which answers every such call with EPERM and reports
// it; if no supervisor holds the listener any more, the kernel fails those
// calls with ENOSYS, so they are refused either way. clone3 fails with
// ENOSYS at once, which makes the C library fall back to clone, whose flags
// a filter can read (clone3 passes them in memory). Python installs it on
// itself after it has started (filters cannot be removed, and
// no_new_privs is already set for the whole sandbox); Node starts under it
// (the agent's seccomp-exec helper).
func NoSubprocessFilter(goarch string) ([]byte, int, error) {
	a, ok := seccompArches[goarch]
	if !ok {
		return nil, 0, fmt.Errorf("no seccomp filter for architecture %s", goarch)
	}
	// Jumps are relative; build with labels and resolve at the end.
	var prog []bpf.Instruction
	labels := map[string]int{}
	var jumps []struct {
		at            int
		trueL, falseL string
	}
	emit := func(i bpf.Instruction) { prog = append(prog, i) }
	cond := func(c bpf.JumpTest, val uint32, trueL, falseL string) {
		jumps = append(jumps, struct {
			at            int
			trueL, falseL string
		}{len(prog), trueL, falseL})
		emit(bpf.JumpIf{Cond: c, Val: val})
	}
	emit(bpf.LoadAbsolute{Off: offArch, Size: 4})
	cond(bpf.JumpEqual, a.audit, "", "deny")
	emit(bpf.LoadAbsolute{Off: offNr, Size: 4})
	if a.x32 {
		cond(bpf.JumpGreaterOrEqual, x32SyscallBit, "deny", "")
	}
	for _, nr := range []int{a.execve, a.execveat, a.fork, a.vfork} {
		if nr >= 0 {
			cond(bpf.JumpEqual, uint32(nr), "deny", "")
		}
	}
	cond(bpf.JumpEqual, uint32(a.clone3), "enosys", "")
	cond(bpf.JumpEqual, uint32(a.clone), "", "allow")
	emit(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	cond(bpf.JumpBitsSet, cloneThread, "allow", "deny")
	labels["allow"] = len(prog)
	emit(bpf.RetConstant{Val: seccompRetAllow})
	labels["deny"] = len(prog)
	emit(bpf.RetConstant{Val: seccompRetNotify})
	labels["enosys"] = len(prog)
	emit(bpf.RetConstant{Val: seccompRetErrno | errnoENOSYS})

	for _, j := range jumps {
		ji := prog[j.at].(bpf.JumpIf)
		for _, side := range []struct {
			label string
			skip  *uint8
		}{{j.trueL, &ji.SkipTrue}, {j.falseL, &ji.SkipFalse}} {
			if side.label == "" {
				continue // fall through to the next instruction
			}
			skip := labels[side.label] - j.at - 1
			if skip < 0 || skip > 255 {
				return nil, 0, fmt.Errorf("seccomp filter: jump to %s out of range", side.label)
			}
			*side.skip = uint8(skip)
		}
		prog[j.at] = ji
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, 0, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.LittleEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.LittleEndian.AppendUint32(out, r.K)
	}
	return out, a.seccomp, nil
}
