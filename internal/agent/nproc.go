package agent

import "strconv"

// A bound on the sandbox user's tasks where no cgroup bounds the sandbox's.
//
// A Pod has no pids limit of its own in Kubernetes (only the kubelet's
// node-wide podPidsLimit). With a user namespace per Pod (hostUsers:
// false) uid 1000 inside is a host uid no other Pod has, so RLIMIT_NPROC
// on the user's processes (the kernel counts a uid's tasks, threads
// included) bounds this sandbox's user code alone. Config.UserNproc sets
// it: every process and interpreter the agent starts as a user other
// than root starts through the agent's own binary, "nproc-exec N PATH
// ARGV0 [ARG...]" (NprocExec), which lowers its RLIMIT_NPROC, soft and
// hard, to N and executes the program. Rlimits belong to a whole process,
// so the agent cannot set one on a child between fork and exec itself,
// and lowering its own would bound its threads (its uid's count) and, the
// hard limit being for good, everything it starts. No process can raise
// its hard limit again without CAP_SYS_RESOURCE, which no user process
// holds. A fork past the limit fails with EAGAIN; each start by the agent
// is let through (the kernel checks the count at fork, and at exec only
// after a setuid over the limit), so the user may hold N tasks plus the
// ones the agent started.
//
// The local engine never sets it: there uid 1000 is one host uid shared
// by every sandbox, and each sandbox's pids cgroup bounds it.

// NprocExecCommand is the agent binary's sub-command NprocExec.
const NprocExecCommand = "nproc-exec"

// NprocCommand returns the path and argv that start path with argv under
// RLIMIT_NPROC n, through helper (the agent's binary).
func NprocCommand(helper string, n int64, path string, argv []string) (string, []string) {
	return helper, append([]string{helper, NprocExecCommand, strconv.FormatInt(n, 10), path}, argv...)
}
