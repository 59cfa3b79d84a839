// Package oci runs sandboxes with an OCI runtime (runc by default) from an
// OCI spec it writes itself.
//
// Each sandbox gets a bundle under Config.StateDir (mode 0710, group the
// sandbox's own host gid, so that runc's init can reach the rootfs and no
// other host user can): the sandbox's own disk holding the writable
// upper layer (an ext4 image of the disk limit's size on a loop device,
// disk_linux.go; a tmpfs where the host has no loop devices, the memory
// limit then holding memory plus disk), an overlay of it over an idmapped mount of the
// template's root filesystem, config.json, and a unix socket the host
// listens on and passes to the agent as fd 3 (so no host directory is ever
// shared with the sandbox). The spec gives the agent, and everything it
// starts:
//   - a user namespace of its own host ids: uid and gid 0..65535 inside are
//     a range no other sandbox has while it lives (ids_linux.go), and the
//     namespace is owned by that range's first uid (the engine makes it,
//     userns_linux.go), so the kernel's per-user counters of the whole
//     sandbox are charged to a host user of its own; NamespaceLimits bound
//     each uid inside and forbid further namespaces. The agent runs as uid
//     0 inside and starts processes and kernels as uid 1000 ("user")
//     unless a request asks for root;
//   - pid, mount, ipc, uts, cgroup and network namespaces; the network has
//     only lo;
//   - the agent holds only AgentCapabilities (bounding, permitted,
//     effective; none inheritable or ambient); root processes keep
//     RootCapabilities (those less CAP_SETPCAP) and user processes none,
//     not even in their bounding set; no_new_privs; Docker's default seccomp
//     profile (for those capabilities) less ptrace and process_vm_*;
//   - Docker's masked and read-only /proc and /sys paths, plus the kernel
//     address files;
//   - cgroup limits for memory (= memory+swap), pids and CPU, on cgroup v1
//     (including the hybrid layout) and v2; the pids limit is on the child
//     cgroup "tenant" of every process the agent starts, and the
//     sandbox's cgroup keeps AgentPids more for the agent's own threads
//     (makeTenant);
//   - rlimits: no core dumps, 4096 open files, 64 KiB locked memory (set by
//     the agent's init on itself: see RlimitFlags).
//
// Destroy kills every task at once through the cgroup (cgroup.kill, or the
// v1 freezer), lets runc forget the container, removes the cgroups,
// unmounts, detaches the disk, gives the id range back and deletes the
// bundle (the disk's image with it); List finds sandboxes by bundle, runtime
// state and cgroup, so a sandbox left by a crash between any two steps is
// found and destroyed by the engine's start-up reconciler.
//
// Imports: internal/runtime (the interface it implements), internal/backoff
// (the sweep's retries), internal/cgroup (a cgroup's usage counters, read
// as the agent reads them), the OCI spec types, moby's seccomp profile and mountinfo parser, runc's cgroup
// library, golang.org/x/sys and the standard library; runc itself is run
// as a command (its state file, not its error text, says what it knows).
package oci
