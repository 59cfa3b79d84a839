package oci

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// maskedPaths are hidden from the sandbox (Docker's list plus the kernel
// address files this host leaves readable: kernel.kptr_restrict=0).
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
	"/proc/scsi", "/proc/kallsyms", "/proc/vmallocinfo",
	"/sys/firmware", "/sys/devices/virtual/powercap", "/sys/kernel/debug",
}

// readonlyPaths are visible but not writable (Docker's list).
var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// deniedSyscalls are removed from the allow rules of Docker's default
// profile, which allows them on kernels since 4.8: a sandbox has no reason
// to trace or read another process's memory.
var deniedSyscalls = []string{"ptrace", "process_vm_readv", "process_vm_writev"}

// RootCapabilities are what processes run as root keep: the agent's
// capabilities less CAP_SETPCAP, in their bounding, permitted and
// effective sets. User processes have none in any set: the kernel clears
// permitted and effective when they leave uid 0, the agent empties their
// bounding set (agent.StartBounded), and no_new_privs keeps setuid
// binaries and file capabilities from giving any back. Being capabilities
// of the sandbox's user namespace, they act only on its own objects
// (inodes owned by its mapped ids, its own processes), never on the
// host's. Each is needed:
//   - CAP_SETUID, CAP_SETGID: start processes and kernels as "user" (or
//     another user), and act as the requested user for file operations
//     (setfsuid, setfsgid, setgroups);
//   - CAP_KILL: signal and kill the process groups of those processes,
//     which run as another uid (timeouts, output caps, process.signal,
//     kernel interrupts);
//   - CAP_DAC_OVERRIDE: root's file operations (and root processes) reach
//     every path in the overlay, including /home/user and files of "user"
//     whose modes shut others out, as E2B's root can;
//   - CAP_FOWNER: root may replace, remove and chmod other users' files,
//     also in sticky directories such as /tmp (a file.write renames over
//     the old file);
//   - CAP_CHOWN: root processes can give files away (chown -R user, dpkg,
//     apt's _apt download sandbox), as in Docker's and Podman's defaults.
//     The agent itself creates files with the requested user's fsuid and
//     never chowns.
//
// Not granted, among others: CAP_SYS_ADMIN (mounts, namespaces), CAP_NET_*,
// CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_MKNOD, CAP_SETFCAP, CAP_FSETID,
// CAP_SYS_CHROOT and CAP_DAC_READ_SEARCH (open_by_handle_at). Docker's
// seccomp profile, built from AgentCapabilities, therefore keeps refusing
// the system calls it ties to those (mount, unshare, setns, clone with
// namespace flags, ptrace, module loading...); unshare only with
// CLONE_FS alone, which makes no namespace, is let through
// (ownWorkdirRule).
var RootCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
}

// AgentCapabilities are the capabilities of the agent (uid 0 in the
// sandbox's user namespace) in its bounding, permitted and effective sets:
// RootCapabilities and CAP_SETPCAP, which it uses only to shrink the
// bounding set of the processes it starts.
var AgentCapabilities = append(slices.Clone(RootCapabilities), "CAP_SETPCAP")

// NamespaceLimits are the per-user limits of each sandbox's user
// namespace (its /proc/sys/user), which runc's init writes once it is in
// the namespace. The kernel checks a sandbox's uid against these, and the
// sandbox as a whole (charged to its namespace's owner, a host uid of its
// own) against the host's per-user limits, which raiseHostLimits keeps at
// twice these or more: the agent (uid 0) and the user's code (uid 1000)
// can each use all of theirs. No namespace of any kind may be made inside
// (seccomp refuses it too): runc has made the sandbox's before it writes
// these.
var NamespaceLimits = map[string]string{
	"user.max_inotify_instances": "128",
	"user.max_inotify_watches":   "16384",
	"user.max_fanotify_groups":   "16",
	"user.max_fanotify_marks":    "8192",
	"user.max_user_namespaces":   "0",
	"user.max_mnt_namespaces":    "0",
	"user.max_pid_namespaces":    "0",
	"user.max_net_namespaces":    "0",
	"user.max_ipc_namespaces":    "0",
	"user.max_uts_namespaces":    "0",
	"user.max_cgroup_namespaces": "0",
	"user.max_time_namespaces":   "0",
}

// RlimitFlags are the sandbox's rlimits (no core dumps, 4096 open files,
// 64 KiB locked memory), which the agent's init sets on itself before
// anything else runs and everything inherits. They are not the spec's
// process.rlimits: runc sets those from the host with prlimit, which needs
// CAP_SYS_RESOURCE over the sandbox's user namespace; host root is not
// that namespace's owner (the sandbox's own uid is), and some hosts, this
// one included, withhold CAP_SYS_RESOURCE from root.
var RlimitFlags = []string{"--rlimit=core=0", "--rlimit=nofile=4096", fmt.Sprintf("--rlimit=memlock=%d", 64<<10)}

// specInput is everything buildSpec needs; it does no I/O.
type specInput struct {
	Spec      runtime.Spec
	RootFS    string // the merged overlay mount
	AgentBin  string // host path of the agent binary
	CgroupDir string // cgroupsPath, e.g. /sheepfold/<id>
	Userns    string // path of the sandbox's user namespace, which runc joins
	ShmBytes  int64
	// ResolvConf is the host path of the sandbox's /etc/resolv.conf, for
	// a sandbox with a network; "" leaves the template's.
	ResolvConf string
	Writable   string // the host dir holding the writable paths' contents (writableDir)
	// DiskInMemory is the size of a disk kept in memory (a tmpfs, charged
	// to the memory cgroup), added to the memory limit; 0 for a disk of
	// its own.
	DiskInMemory int64
	// Volumes are the bind mounts of the sandbox's volumes
	// (attachVolumes), after every other mount.
	Volumes []specs.Mount
	// AgentSocket is the key ("socket:[inode]") of the agent's listening
	// socket, and CriuConfig the file of the sandbox's CRIU options, which
	// a checkpoint and a restore write (checkpoint_linux.go); both are
	// annotations of the spec.
	AgentSocket, CriuConfig string
	// Netns, for a gVisor sandbox with a network, is the namespace (a
	// bind mount of it) that runsc's Sentry joins (runsc_linux.go).
	Netns string
}

// writableDir is where the contents of Spec.WritablePaths[i] live on the host.
func writableDir(rw string, i int) string { return fmt.Sprintf("%s/paths/%d", rw, i) }

// buildSpec writes the OCI spec for one sandbox. The agent runs as uid 0
// of the user namespace at Userns (made by the engine, with the sandbox's
// own host ids) with AgentCapabilities; see the package doc for the list
// of defences.
func buildSpec(in specInput) (*specs.Spec, error) {
	s := in.Spec
	if in.Userns == "" {
		return nil, errors.New("no user namespace to join")
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	env := slices.Concat(BaseEnv, s.Env)
	caps := &specs.LinuxCapabilities{
		Bounding: slices.Clone(AgentCapabilities), Effective: slices.Clone(AgentCapabilities),
		Permitted: slices.Clone(AgentCapabilities), Inheritable: []string{}, Ambient: []string{},
	}
	shm := in.ShmBytes
	if shm <= 0 {
		shm = 64 << 20
	}
	oomScoreAdj := SandboxOOMScoreAdj
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0}, // no supplementary groups

			Args:            initArgs(s),
			Env:             env,
			Cwd:             SandboxHome,
			Capabilities:    caps,
			NoNewPrivileges: true,
			OOMScoreAdj:     &oomScoreAdj,
		},
		Root:     &specs.Root{Path: in.RootFS, Readonly: s.ReadOnly},
		Hostname: hostname,
		// runc gives CRIU the file named by criuConfigAnnotation (an
		// empty name: none, not even runc's default /etc/criu/runc.conf).
		Annotations: map[string]string{criuConfigAnnotation: in.CriuConfig, agentSocketAnnotation: in.AgentSocket},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", shm)}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: AgentPath, Type: "bind", Source: in.AgentBin, Options: []string{"bind", "ro", "nosuid", "nodev"}},
			// The agent binary is also the sandbox's sudo (agent.Sudo).
			{Destination: SudoPath, Type: "bind", Source: in.AgentBin, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: in.CgroupDir,
			Resources:   resources(s.Limits, in.DiskInMemory),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace, Path: in.Userns},
				{Type: specs.CgroupNamespace},
			},
			Sysctl:        maps.Clone(NamespaceLimits),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if in.ResolvConf != "" {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind",
			Source: in.ResolvConf, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	// A read-only root with writable paths: each is a bind of its own
	// directory on the sandbox's writable storage.
	if s.ReadOnly {
		for i, p := range s.WritablePaths {
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: p, Type: "bind", Source: writableDir(in.Writable, i),
				Options: []string{"rbind", "rw", "nosuid", "nodev"}})
		}
	}
	spec.Mounts = append(spec.Mounts, in.Volumes...)
	sc, err := SeccompProfile()
	if err != nil {
		return nil, err
	}
	spec.Linux.Seccomp = sc
	return spec, nil
}

// PidsCgroupFD is the descriptor of the sandbox's pids cgroup (openPids)
// in the agent's init: runc passes it with --preserve-fds 2, after the
// agent's listening socket (3).
const PidsCgroupFD = 4

// initArgs is the agent's command line: init with the sandbox's rlimits,
// for a sandbox with a pids limit the cgroup its processes start in, and
// its template's default user and working directory (passed to serve).
func initArgs(s runtime.Spec) []string {
	args := append([]string{AgentPath, "init"}, RlimitFlags...)
	if s.Limits.Pids > 0 {
		args = append(args, fmt.Sprintf("--pids-cgroup-fd=%d", PidsCgroupFD))
	}
	return append(args, runtime.AgentDefaults(s)...)
}

// ownWorkdirRule lets unshare(2) through with exactly CLONE_FS, which
// gives the calling thread a working directory (and root and umask) of
// its own and makes no namespace: every child made by fork has that
// already. The agent uses it to start a code context's kernel in a
// directory its user may not enter (agent.StartIn). Any other flag, alone
// or with CLONE_FS, stays refused.
var ownWorkdirRule = specs.LinuxSyscall{
	Names:  []string{"unshare"},
	Action: specs.ActAllow,
	Args:   []specs.LinuxSeccompArg{{Index: 0, Value: unix.CLONE_FS, Op: specs.OpEqualTo}},
}

// resources turns limits into cgroup settings. Memory and memory+swap are
// equal so that swap, where a host has it, adds nothing (v2:
// memory.swap.max 0). A disk kept in memory (diskInMemory bytes, a tmpfs
// whose pages are charged to the sandbox) is added to the memory limit,
// so that a full disk is ENOSPC, never an OOM kill, for code within its
// memory limit. No memory.high on cgroup v2: what a sandbox holds above
// it (anonymous memory without swap) cannot be reclaimed, so the
// throttling only stalls the sandbox — measured in the v2 guest, a memory
// bomb that memory.max ends at once with ERR_OUT_OF_MEMORY ran into its
// 30 s execution timeout instead.
func resources(l runtime.Limits, diskInMemory int64) *specs.LinuxResources {
	r := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if l.MemoryBytes > 0 {
		m := l.MemoryBytes + diskInMemory
		r.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
	}
	if l.Pids > 0 {
		// The tenant's limit is l.Pids, on its own cgroup (makeTenant).
		n := l.Pids + AgentPids
		r.Pids = &specs.LinuxPids{Limit: &n}
	}
	if l.CPUs > 0 {
		period := uint64(100_000)
		quota := int64(l.CPUs * float64(period))
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	return r
}

// denySyscalls drops names from every allow rule, so the profile's default
// action (an errno) applies to them.
func denySyscalls(sc *specs.LinuxSeccomp, names []string) *specs.LinuxSeccomp {
	out := *sc
	out.Syscalls = nil
	for _, rule := range sc.Syscalls {
		if rule.Action == specs.ActAllow {
			rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool {
				return slices.Contains(names, n)
			})
			if len(rule.Names) == 0 {
				continue
			}
		}
		out.Syscalls = append(out.Syscalls, rule)
	}
	return &out
}

// SeccompProfile is the seccomp profile every sandbox's processes run
// under: Docker's default for AgentCapabilities, less deniedSyscalls,
// plus ownWorkdirRule. A Kubernetes node takes it as a Localhost profile
// (JSON of this type) for sandboxes run as Pods.
func SeccompProfile() (*specs.LinuxSeccomp, error) {
	caps := slices.Clone(AgentCapabilities)
	sc, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps}}})
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	out := denySyscalls(sc, deniedSyscalls)
	out.Syscalls = append(out.Syscalls, ownWorkdirRule)
	return out, nil
}
