// Package oci runs sandboxes with an OCI runtime (runc by default) from an
// OCI spec it writes itself. A sandbox may choose gVisor instead
// (runtime.Spec.Runtime "gvisor", or Config.DefaultRuntime): runsc runs it
// from a spec of its own in the same bundle, disk, overlay and cgroup;
// runsc_linux.go says what differs (the Sentry's system calls, the agent
// listening on a bound socket whose peer the host checks, the egress
// gateway's device in a network namespace the engine makes for runsc, no
// checkpoint).
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
// # The sandbox, from the host's side
//
//   - Root filesystem: the template (`<data>/templates/<name>/rootfs`, built
//     by internal/template from Debian packages with debootstrap, owned by the
//     shifted uids 1000000+) is the read-only lower layer of an overlay, seen
//     through an idmapped mount that shows it owned by the sandbox's own ids.
//     The upper layer (and the writable paths' contents) lives on the
//     sandbox's own disk, so code may write anywhere (as `pip install` and E2B
//     clients expect), the template stays pristine, and a full disk is ENOSPC
//     at the limit, never an OOM kill: an ext4 filesystem in an image file of
//     its bundle (`disk.img`, on the data dir's filesystem), allocated whole
//     at create (`fallocate`: the data dir refuses a create it has no room
//     for, keeping 256 MiB free, with ERR_CAPACITY, and never fails a running
//     sandbox's write), attached to a loop device (LOOP_CONFIGURE, direct I/O,
//     clearing itself at unmount; its number recorded in the bundle first, so
//     a destroy or the crash sweep detaches it whatever the crash) and mounted
//     at the bundle's `rw` (internal/runtime/oci, disk_linux.go). Its page
//     cache is charged to the sandbox's memory cgroup but reclaimable; the
//     memory limit is the memory alone. Each image is copied (its few written
//     blocks; the rest allocated and read as zeros) from a blank formatted once
//     per disk size by mkfs.ext4 (no journal, one inode per 8 KiB, at least
//     4096) and sized by mounting it once so that the fresh filesystem has the
//     limit free (about 5 % more on the host's disk); an instance keeps 16
//     blanks under `<instance>/blanks`. A host without loop devices or
//     mkfs.ext4 (doctor's "disks" warns), or `oci.Config.DiskInMemory`, keeps
//     the layer on a tmpfs of the disk size instead, and the memory cgroup's
//     limit is then memory plus disk (runtime.DiskMemory tells admission to
//     count the disk as memory). `filesystem_readonly` makes the root
//     read-only (its layer is then a 1 MiB tmpfs for the mount points).
//
//   - Host ids: each sandbox has a range of 65536 host uids and gids of its
//     own (after the template's 1000000..1065535; registry of ranges in use:
//     `/run/sheepfold/ids`, shared by every engine on the host, validated
//     against root's entries in /etc/subuid and /etc/subgid when there are any;
//     a range is given back when its sandbox is destroyed, by its engine or the
//     crash sweep). The engine makes the sandbox's user namespace itself, owned
//     by the range's first uid (`unshare --user cat` run as that uid holds it
//     while runc joins it; two are made ahead of need for free ranges, after
//     each create and destroy, and a create takes a range with one ready
//     before the lowest free range, so that the two programs' start is off a
//     create's path: spare_linux.go; a spare is never used by a second
//     sandbox): the kernel charges per-user
//     counters (inotify instances and watches, fanotify, POSIX message queue
//     bytes, pending signals, namespaces) up the namespace chain to the owner,
//     so each sandbox spends its own host user's allowance, never root's or a
//     neighbour's. Inside, `/proc/sys/user` limits each uid (128 inotify
//     instances, 16384 watches; no namespaces may be made), and the server
//     raises the host's per-user inotify and fanotify limits to twice those at
//     start, so a sandbox's user code cannot starve its own agent either.
//
//   - Spec (internal/runtime/oci/spec_linux.go): that user namespace,
//     pid/mount/ipc/uts/cgroup/network namespaces (only `lo`), the
//     agent as uid 0 inside holding only CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER,
//     CAP_KILL, CAP_SETGID, CAP_SETUID (`oci.RootCapabilities`, which root
//     processes keep) and CAP_SETPCAP (`oci.AgentCapabilities`, used only to
//     empty the bounding set of the processes it starts), no_new_privs, Docker's default seccomp profile without
//     ptrace/process_vm_* and with unshare allowed for CLONE_FS alone (a
//     thread's own working directory, no namespace; `agent.StartIn`), Docker's masked and read-only /proc and /sys paths
//     plus /proc/kallsyms, cgroup limits (memory = memory+swap, pids, CPU quota),
//     rlimits (no core, 4096 files; set by the agent's init on itself, since
//     runc's prlimit from the host needs CAP_SYS_RESOURCE over a namespace root
//     does not own), `oomScoreAdj` 500 (interpreters raise
//     theirs to 1000), so the kernel's OOM killer picks sandboxed processes
//     before the server. The only host path inside is the agent
//     binary, bind-mounted read-only.
//
//   - Agent channel: the host creates a listening unix socket in the
//     sandbox's private bundle dir and passes it as fd 3 (`runc run
//     --preserve-fds 1`). No host directory is shared with the sandbox, so code
//     inside cannot plant a symlink the host would follow.
//
//   - Host files are root's: the data dir and state dirs are 0711 (others
//     may pass, not list), each sandbox's bundle is 0710 with the sandbox's own
//     host gid as group (runc's init passes through it to the rootfs; no other
//     host user gets in, so the overlay paths in `/proc/self/mountinfo` lead
//     nowhere), its files (config, agent socket and log) and the overlay's
//     upper dir are root's alone, and the database and its WAL are 0600.
//
//   - Where the cgroups are: each sandbox's is
//     `<root>/<parent>/<instance>/<id>` (parent `sheepfold`), and in the pids
//     hierarchy its child `<id>/tenant` (threaded on cgroup v2) holds every
//     process the agent starts, with the sandbox's pids limit; `<id>` itself
//     has that limit plus `oci.AgentPids` for the agent's own threads
//     (docs/security.md, section 5). The root is
//     chosen at start (oci.cgroupRoot, overridable: `serve --cgroup-root`):
//     on cgroup v2, a cgroup delegated to this process (systemd's
//     `Delegate=yes` marks it with the `trusted.delegate` attribute; or the
//     root of a private cgroup namespace, in a container), after the process
//     moves itself into its leaf `<root>/supervisor`, because a cgroup with
//     processes cannot give controllers to children; otherwise `/`. So under
//     sheepfold.service sandboxes never sit beside systemd at the hierarchy's
//     root, and stopping the unit reaches them. `make test-cgroupv2`
//     (test/cgroupv2) proves the v2 path in a qemu guest: Debian's kernel,
//     systemd, the privileged tests and the installed .deb.
//
//   - What only cgroup v2 gives, used where it helps: pressure stall
//     information (`cpu.pressure`, `memory.pressure`, `io.pressure`) in
//     `GET /v1/sandboxes/{id}?usage=1` as `usage.pressure` (absent on v1),
//     read by internal/psi (standard library only) for the host's runtime and
//     a Pod's agent alike. Every cgroup counter (memory, OOM kills, CPU time
//     and quota, pids, on v1 and v2) is parsed by one package, internal/cgroup
//     (standard library and psi only): the OCI runtime reads a sandbox's
//     directories on the host with it, a Pod's agent its own.
//     Both hierarchies get swap off (v2 `memory.swap.max` 0; v1 memory+swap
//     equal to memory). Left out on purpose, because they would not help:
//     `memory.high` — what a sandbox holds (anonymous memory with no swap, or
//     a disk kept in memory) cannot be reclaimed, so
//     throttling above `memory.high` only stalls it; in the v2 guest a memory
//     bomb that `memory.max` ends at once with `ERR_OUT_OF_MEMORY` ran into its
//     30 s execution timeout instead. `io.max` — not set: a sandbox writes
//     only to its own disk (bounded by its size) and reads the template
//     through the shared page cache; its disk's writes reach the data dir's
//     device through its loop device, unthrottled (a tenant writing at full
//     speed shares that device's bandwidth with the others).
//
//   - State: `<data>/run/<instance>/` per engine process
//     (`server-<hash of the data dir>`, so that servers of two data dirs never
//     sweep each other's cgroups, or `cli-<pid>` for `sheepfold run`), locked with flock while the process
//     lives. A new process sweeps instance dirs whose lock is free (the owner
//     died) and destroys everything they hold; the Manager also destroys its own
//     instance's leftovers at start, but the checkpointed (paused) sandboxes it
//     takes back (runtime.CheckpointKeeper, internal/sandbox/keep.go): Close
//     leaves those, their bundles, disks and id ranges, and so the instance's
//     directory, for the next process of the same instance. `List` finds sandboxes by bundle, runc state
//     and cgroup, so a crash between any two steps of create is still cleaned.
//     A crash never keeps the engine from starting: the runtime's sweep of
//     dead instances and the Manager each wait at most a few seconds for the
//     leftovers they find, and what cannot be destroyed by then, like
//     any destroy that fails while it runs, is retried in the background with
//     backoff (internal/sandbox/reap.go; the runtime sweeps dead instances
//     again likewise) and reported (`Manager.Leftovers`, the log); what is
//     still left at shutdown stays listed for the next start. A
//     create racing a stop or shutdown is destroyed once the runtime's create
//     has returned (Close aborts it), never left running untracked.
//
//   - Teardown: every process is killed at once through the sandbox's
//     cgroup, never by a pid that may have been reused: `cgroup.kill` where
//     there is a cgroup2 hierarchy (pure v2, or the hybrid layout's
//     `/sys/fs/cgroup/unified`, where runc makes each sandbox a cgroup too),
//     else freeze the v1 freezer cgroup, SIGKILL its tasks, thaw; then wait
//     until the cgroup is empty. Then `runc delete --force` if runc has state
//     for it (its state file, not its error text, says so), remove the cgroups
//     (github.com/opencontainers/cgroups), unmount the overlay and the disk,
//     detach the disk's loop device if it is still attached, give the id range
//     back, remove the bundle (the image with it).
//
//   - Cgroups of an engine instance: each sandbox's cgroup is
//     `CgroupParent/Instance/ID`. The top cgroup is shared by every instance
//     on the host (servers, `sheepfold run`s); an instance makes its own in
//     every hierarchy when it starts, and removes it (and the top one, when
//     that is empty) when it closes. Made only by runc at a create, it could
//     vanish between runc's mkdirs when another instance closed
//     (TestCreateWhileOthersClose).
//
//   - Checkpoint and restore (runtime.Checkpointer, checkpoint_linux.go):
//     `runc checkpoint` with CRIU (Config.CriuPath, default `criu` beside
//     runc: 4.2.1 with four patches, built by scripts/criu.sh) writes
//     every process of the sandbox into a directory (0710, the sandbox's
//     host group: CRIU's restore reads it as the sandbox's root) and ends
//     them; runc removes their cgroups, so their memory is freed, while
//     the bundle, disk, overlay and id range stay (List still finds the
//     sandbox, Destroy removes it). `runc restore` starts them again in new
//     cgroups of the spec's limits (the tenant's pids cgroup made again);
//     CRIU makes a new user namespace with the same maps, owned by the
//     range's first uid as Create's is (CRIU makes it as that uid: a patch
//     of ours, told the uid by SHEEPFOLD_CRIU_USERNS_OWNER), whose
//     NamespaceLimits the restore writes again through nsenter, and a new
//     network namespace, whose loopback it brings up (before CRIU
//     restores the sockets when the images hold a TCP connection, so that
//     the sandbox's own loopback connections come back:
//     loopback_linux.go). runc's masked tmpfs is a CRIU external: the
//     restore binds the runtime's empty read-only directory in its place
//     rather than CRIU re-making it with tar (masked_linux.go).
//     The agent's host objects are CRIU externals: its log (Create makes
//     stdin, stdout and stderr that one file, group-writable by the
//     sandbox's host ids so that the restored agent may reopen it), its
//     listening socket (in the host's network namespace; its inode is the
//     spec's annotation sheepfold.agent-socket) and the pids cgroup it
//     holds; the restore hands CRIU a new listener, the log and the new
//     pids cgroup on runc's stdin, stdout and stderr. The options reach
//     CRIU through the configuration file the spec's org.criu.config
//     annotation names (<bundle>/criu.conf, so that the host's
//     /etc/criu/runc.conf is never read). A checkpoint needs every
//     connection to the agent closed (the test TestCheckpointNeedsClosedConnections);
//     a failed one leaves the sandbox running, a failed restore leaves it
//     checkpointed. Not yet: sandboxes with a network (ErrUnsupported).
//
//   - Snapshots and clones (runtime.Snapshotter, snapshot_linux.go):
//     Snapshot(id, dir) freezes the sandbox (quiesce, as a checkpoint
//     does), has runc and CRIU dump it leaving it running (--leave-running,
//     the freezer's state kept), copies its writable layer (the overlay's
//     upper dir and the writable paths) beside the images and thaws it.
//     Clone(spec, dir) makes a new sandbox as Create does (bundle, host id
//     range, disk, cgroups, agent socket), fills its writable layer from
//     the copy with every owner moved into the new range before the
//     overlay is mounted (mountRoot's fill), and restores the processes
//     from hard links of the images, the user-namespace image rewritten to
//     map the new range. Restore and Clone share criuRestore; Checkpoint
//     and Snapshot share dumpExternals. A fork's copy of its parent's
//     files stays as its baseline: Changes (runtime.Differ, diff_linux.go)
//     compares a fork's upper dir with it, over the template.
//
//   - Persistent volumes (runtime.Volumes, volume_linux.go): an ext4
//     image of the volume's size with a journal under Config.VolumesDir,
//     mounted on the host at first use and kept mounted; a sandbox that
//     mounts one gets an idmapped clone of its root for the sandbox's id
//     range (read-only when asked), attached at the bundle's volumes/<i>
//     (0710, the sandbox's host group: a restore's CRIU opens it) and
//     bound by runc at its path. A destroy detaches the attachments
//     before anything of the bundle is removed; a checkpointed sandbox
//     keeps them, and its restore binds them again.
//
//   - Freeze and thaw (runtime.Freezer, freeze_linux.go): `runc pause`
//     and `runc resume`, the cgroup freezer; memory and host objects stay.
//     The kill of a destroy thaws a hybrid host's v1 freezer after
//     cgroup.kill, so that a frozen sandbox's tasks can die.
//
//   - What a restore leaves out, for speed (kdat_linux.go,
//     netlock_linux.go): CRIU's probe of the kernel, which a cache at
//     /run/criu.kdat spares it (CRIU keeps one itself only where /run is a
//     tmpfs; elsewhere the runtime makes it once per boot, before its first
//     CRIU run, TestRestoreReadsKdat), and, for a sandbox without a
//     network, CRIU's iptables lock and unlock of the new network namespace,
//     whose lo stays down until CRIU is done (TestRestoreLocksNoNetwork).
//
//   - Template build steps (StepRunner, buildstep_linux.go): the RUN steps
//     of Dockerfile builds (internal/template), each a `runc run` of its
//     own on the half-built template, with a user namespace runc makes
//     (0..65535 to the template's shifted ids), no network but lo, the
//     sandboxes' seccomp profile, root's capabilities only, and a cgroup
//     under /sheepfold-build; `runc delete --force` follows every step.
//
// Imports: internal/runtime (the interface it implements), internal/backoff
// (the sweep's retries), internal/cgroup (a cgroup's usage counters, read
// as the agent reads them), the OCI spec types, moby's seccomp profile and mountinfo parser, runc's cgroup
// library, golang.org/x/sys and the standard library; runc itself is run
// as a command (its state file, not its error text, says what it knows).
package oci
