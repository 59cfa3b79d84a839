package agent

import "strconv"

// A bound on each uid's tasks where no cgroup bounds the sandbox's.
//
// A Pod has no pids limit of its own in Kubernetes (only the kubelet's
// node-wide podPidsLimit). With a user namespace per Pod (hostUsers:
// false) every uid inside is a host uid no other Pod has, so an
// RLIMIT_NPROC (the kernel counts a uid's tasks, threads included)
// bounds this sandbox's tasks of that uid alone. Config.Nproc sets it:
// every process, interpreter and sudo command the agent starts starts
// through the agent's own binary, "nproc-exec N PATH ARGV0 [ARG...]"
// (NprocExec), which lowers its RLIMIT_NPROC, soft and hard, to N and
// executes the program. Root's commands too: "user" may run `sudo CMD`
// (sudo_linux.go), and unbounded root processes would undo the user's
// bound. Rlimits belong to a whole process, so the agent cannot set one
// on a child between fork and exec itself, and it keeps its own
// unlimited: its threads count in root's tasks (so root's processes get
// N less the agent's threads) but are never refused. No process can
// raise its hard limit again without CAP_SYS_RESOURCE in the host's
// namespace, which nothing in a sandbox holds. A fork past the limit
// fails with EAGAIN; each start by the agent is let through (the kernel
// checks the count at fork, and at exec only after a setuid over the
// limit), so a uid may hold N tasks plus the ones the agent started.
//
// No runtime sets it now: a per-uid bound lets root, which may take any
// of the sandbox's uids, hold it once per uid. Each local sandbox's pids
// cgroup, and each Pod's container cgroup (pidsmax.go), bounds all its
// tasks together, whatever their uid.

// NprocExecCommand is the agent binary's sub-command NprocExec.
const NprocExecCommand = "nproc-exec"

// NprocCommand returns the path and argv that start path with argv under
// RLIMIT_NPROC n, through helper (the agent's binary).
func NprocCommand(helper string, n int64, path string, argv []string) (string, []string) {
	return helper, append([]string{helper, NprocExecCommand, strconv.FormatInt(n, 10), path}, argv...)
}
