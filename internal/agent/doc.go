// Package agent is the server side of the host <-> agent protocol
// (internal/agentproto): the code that runs inside every sandbox as the
// sandbox's root and answers the host's requests, running processes and
// file operations as the user each request names (users_linux.go).
//
// It owns, inside one sandbox:
//   - processes started through process.start: their process groups,
//     stdin pipes, output fan-out to subscribers, timeouts, output caps and
//     final status. Processes belong to the agent, not to the connection that
//     started them, so background commands survive their client and can be
//     re-attached with process.connect;
//   - code contexts: a table of long-lived Kernels (interpreters) created
//     through Config.NewKernel, including the per-language default contexts;
//   - file operations, every one confined to Config.Root with
//     openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS) and *at system calls on
//     parent directory descriptors, so that neither "..", absolute symlinks
//     nor symlink chains reach outside Root.
//
// The agent trusts nothing it reads: not the host's paths, not the frames on
// the socket, not the files in the sandbox. Malformed input gets a Done with
// CodeBadRequest; a panic ends only the connection that caused it.
//
// # Identity
//
// The agent (init and serve) is uid 0 of the sandbox's user
// namespace (the first uid of its range on the host, unprivileged outside) with seven capabilities,
// each needed to act for either user: SETUID/SETGID to switch users, KILL to
// signal their processes, DAC_OVERRIDE and FOWNER so root's file calls reach
// every path (sticky /tmp too), CHOWN for root's own chown (as in Docker's and
// Podman's defaults; the agent never chowns), SETPCAP to shrink the bounding
// set of what it starts. Processes run as the request's
// `User` — "user" (uid/gid 1000, group 1000, HOME=/home/user) by default,
// "root" (HOME=/root) or another name from the sandbox's /etc/passwd — through
// `SysProcAttr.Credential`, forked from a thread whose capability bounding
// set was emptied first (`agent.StartBounded`; for root only SETPCAP is
// dropped); leaving uid 0 clears a process's permitted and
// effective capabilities, so user processes hold none in any set, and
// no_new_privs keeps setuid binaries and file
// capabilities from restoring any. Root processes hold the agent's six others,
// confined to the user namespace; seccomp still refuses mount, unshare,
// setns, namespaced clone, ptrace and modules to everyone (unshare only with
// CLONE_FS alone, which makes no namespace, is let through: see below). Kernels run as
// "user". A code context starts in its cwd even where "user" may not enter
// it (`/root`), as E2B's root kernels do: Go's exec enters a `Dir` after it
// takes the credential, so the agent instead gives the forking thread a
// working directory of its own (`unshare(CLONE_FS)`, what fork gives every
// child), enters the cwd there as root and forks without a `Dir`
// (`agent.StartIn`, with StartBounded's bounding set; the thread then ends).
// The interpreter's getcwd names the cwd, and it still reads nothing there:
// every lookup from a working directory needs search permission on it. `sudo` (E2B's passwordless sudo for "user") has no setuid bit:
// no_new_privs stays on for every process. The agent binary is bind-mounted
// read-only at /usr/local/bin/sudo and, called by that name, asks the agent
// over an abstract unix socket (it exists only in the sandbox's own network
// namespace, nowhere in a filesystem) to run the command as root, passing its
// stdin/stdout/stderr (SCM_RIGHTS) and its signals, and exits with its status
// (internal/agent/sudo_linux.go). The agent takes the caller's uid from the
// kernel (SO_PEERCRED) and serves only "user" and root, and never a caller
// running under more seccomp filters than the agent (code under
// `allow_subprocess: false`): it takes a pidfd of the caller
// (`SO_PEERPIDFD`, or the recorded pid before Linux 6.5), reads the kernel's
// count (`Seccomp_filters` in its status) and checks through the pidfd that
// the caller still lives (internal/agent/confined_linux.go). The process it starts
// is exactly what `User: root` gets through the API (bounded capabilities,
// no_new_privs, seccomp, the user namespace, the sandbox's cgroups, mounts
// and network gateway), so sudo gives code in the sandbox nothing its API
// caller cannot already do, and every layer that confines root holds; its
// environment is reset as sudo's env_reset does (-E keeps the caller's). File calls run on a goroutine locked to its thread with the
// requested user's setfsuid/setfsgid/groups (credentials are per thread;
// fsuid ≠ 0 also drops the thread's file capabilities), so permission checks
// are the user's and new files (0644) and directories (0755) are the user's;
// relative paths start at that user's home. The switch happens only when the
// agent is uid 0 of a user namespace with root "/" (a sandbox): under the
// fake runtime and in tests it acts as itself for every user. User code
// cannot signal, trace or read the agent (another uid; non-dumpable); root
// can signal it (and so end its own sandbox) but not trace it or change its
// read-only binary. The host trusts nothing the agent says beyond its own
// sandbox. `init` is pid 1 (immune to SIGKILL from inside, reaps orphans, and
// keeps the sandbox's deadline: `serve` passes each lifetime the host sends
// over a close-on-exec pipe, and when it passes init exits, which makes the
// kernel kill every process of the sandbox's pid namespace);
// `serve` owns processes (each in its own process group; background ones
// outlive their request; one started with `ProcessSpec.PTY` gets a new
// pseudo-terminal from the sandbox's own devpts instance and leads a session
// on it: its output is `pty` events, input is typed on it, `process.resize`
// sets its size; E2B's `pty.*` calls map onto these), files (confined with openat2 RESOLVE_IN_ROOT even
// though the sandbox root is its `/`), and code contexts. One request per
// connection (internal/agentproto): a JSON request frame, then event frames
// until `done`. An event too large for a frame (4 MiB) is split (output),
// cut (an error's text, a file's metadata) or replaced by a `dropped` event
// saying what and how large (a result); a reply that does not fit becomes a
// failed `done` (`too_large`): nothing is lost silently. Each write to the
// host has a deadline (2 min). As a container's pid 1, `init` starts `serve
// --switch-users`: if the agent cannot run requests as their users (not uid
// 0 of a user namespace), it refuses to serve at all rather than run
// anything as itself.
//
// # Watches and ports
//
// `file.watch` streams inotify events of a directory (recursive ones follow
// new subdirectories; writes coalesced to one per file per second; the
// agent's upload temporaries hidden) until the host hangs up. File metadata
// (E2B's `X-Metadata-*`) lives in `user.e2b.<key>` xattrs, replaced by every write.
//
// `port.connect` dials a TCP port on the sandbox's loopback (127.0.0.1,
// else ::1) and answers one `connected` frame, after which the connection
// is that TCP stream's raw bytes both ways (no frames, no deadlines; a
// half-close is passed on), so a preview costs one agent connection per
// kept-alive TCP connection and a copy on each side (splice where the
// kernel can). Nothing listening is a `refused` Done at once. `port.list`
// reads `/proc/net/tcp` and `tcp6` (the sandbox's own network namespace)
// for listening sockets.
//
// Imports: internal/agentproto, internal/backoff (its accept loops),
// internal/lang (the default language's name; the kernels are wired in by
// cmd/sheepfold-agent), internal/fdpass, internal/osthread (threads
// locked into a namespace or credentials), internal/pidfd (waiting for a
// child without holding a thread), internal/cgroup (its cgroup's
// counters, usage.go), internal/homeseed (a Pod's home, scratch_linux.go),
// internal/ratelimit (the per-minute budgets it keeps for its engines,
// budget.go), the standard library and golang.org/x/sys.
// Never the server, the engine or internal/kernel: the language drivers
// reach this package only through the Kernel interface, wired up by
// cmd/sheepfold-agent.
//
// Linux only: processes and files use Linux system calls (openat2, waitid,
// process groups). On other systems Serve answers ping and context requests
// and refuses the rest with CodeUnsupported, so the package builds anywhere.
package agent
