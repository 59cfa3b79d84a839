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
