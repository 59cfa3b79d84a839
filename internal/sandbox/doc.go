// Package sandbox is the engine: it creates sandboxes through a
// runtime.Runtime, talks to the agent inside each one, runs code, commands
// and file operations there, and enforces lifetimes. A warm pool
// (pool.go) keeps sandboxes started ahead, their Python libraries
// imported, and hands them out on Create.
//
// A sandbox moves through the states Starting → Running → Stopping →
// Stopped, one way only but for Paused: a running sandbox may be paused
// and resumed (pause.go: checkpointed by a runtime.Checkpointer into
// Config.CheckpointDir, its memory and processes freed, its lifetime
// standing still), and a paused one may be stopped. With
// Config.KeepPaused a paused sandbox outlives its engine: Close leaves it,
// and the next engine over the same runtime instance takes it back,
// paused (keep.go). A request that needs
// the agent resumes a paused sandbox first; any other operation on a
// sandbox that is not Running fails with ERR_SANDBOX_STATE. Errors that reach callers carry an
// apierr code; the agent is treated as untrusted (it runs with the
// sandboxed code's uid), so nothing it says is believed beyond its own
// sandbox.
//
// # Lifetime
//
//   - Lifetime: the engine's timer ends a sandbox at its deadline, and the
//     agent holds the same deadline (plus 2 s) itself: the host tells it with
//     the pings at start, just after a pool hand-out (off the caller's
//     path) and on every `SetTimeout`, and pool members hold a 10-minute lease
//     the pool renews. So after a `kill -9`
//     of the server, sandboxes still end on time; their stopped containers are
//     cleaned by the next start, whose store marks their records "timed out"
//     (or "server restarted" for those still within their lifetime). An
//     execution is recorded as it starts (status `running`, written beside
//     the execution, off the caller's path) and again when it ends, also
//     when it ends in an error; the next start ends those a crash cut with
//     status `error` and the error "server restarted".
//
// # The agent is not trusted
//
// One loop reads every reply
// (`agentproto.Call`); frames are bounded, and a large one waits for room
// in the per-sandbox and engine-wide result budgets before it is read
// (`Config.MaxSandboxResultMemory`, 64 MiB; `MaxResultMemory`, 256 MiB):
// backpressure, so a flood stalls its own kernel. Output (of executions
// and processes) passes at `Config.OutputRate` per sandbox (1 MiB/s after
// an 8 MiB burst): past it the engine reads that agent more slowly and the
// code's writes stall, so an output flood costs its own sandbox, not its
// neighbours (six flooding sandboxes on 2 cores: a neighbour's 1+1 median
// 4 ms, as when quiet, against 29 ms at 8 MiB/s). Every call has a
// deadline: an execution its timeout plus 10 s, a call that streams
// nothing each read and write within 60 s, streams (process output,
// watches) the sandbox's lifetime. A malformed, oversized or cut-off reply
// fails that call (`ERR_INTERNAL`); the sandbox is declared dead only if its
// agent then no longer answers a ping.
//
// On the host, `Sandbox.WatchDir` returns a `Watcher` once the agent confirms
// the watch; its `Events` channel ends on `Close`, the context, the directory's
// removal or the sandbox stopping (`Err` says which); `WriteFileWith` takes metadata.
//
// # Warm pool
//
// internal/sandbox/pool.go keeps `PoolSize` sandboxes per pooled template
// started ahead (`serve --pool N`; the default is one per CPU, at most one
// per 2 GiB of memory and 8; 0 turns it off): created by the runtime, agent
// answering, default Python context running with numpy, pandas and
// matplotlib (Agg) imported by the kernel's `preload` request, which fills
// `sys.modules` (and draws one throwaway figure) without binding a name in
// the user's namespace or counting as an execution. `Manager.Create` hands a
// member out when nothing fixed at container start differs (limits other
// than the defaults, read-only root, sandbox-wide env vars, another template
// are misses; a sandbox whose policy has a network, or that names a
// runtime, never comes from the pool) and one filler goroutine refills, one
// sandbox at a time,
// waiting a quiet second after a hand-out while members are left (a
// member's imports cost about a CPU-second, which would slow the new
// sandbox's first requests on a small machine).
// Members are not in the Manager's table until handed out: they are not
// listed, not idle-stopped and not counted against `MaxSandboxes`; a
// member's metadata, creation time, deadline and timer are set at hand-out,
// it is never returned to the pool once anyone has seen it, and `Close`
// destroys the members first. Hits and misses are reported by
// `Manager.PoolStats` (`/v1/version` → `pool`) and the `Sheepfold-Pool:
// hit|miss` header of `POST /v1/sandboxes`.
//
// Over a `runtime.Placer` (the kubernetes runtime: `Nodes` lists the
// Ready, schedulable, untainted nodes) the size is per node: the filler
// lists the nodes every 10 s, starts members with `Spec.Node` set (the Pod
// is bound to that node by a required node affinity, without the spread
// constraint, and not re-placed if that kubelet does not take it), passes
// over a node where a start failed for 30 s, and destroys the members of a
// node that left the list. A hand-out takes the oldest member on the node
// running the fewest of the Manager's sandboxes (`Instance.Node` records
// where each runs). If the nodes cannot be listed (no RBAC for it) the
// pool is placed by the scheduler and sized in all, as on one host.
//
// # Policies
//
// `cpu_time_seconds` is counted by the kernel
// on the sandbox's cgroup (internal/sandbox/cpu.go): with a limit, the
// engine reads the cgroup's CPU usage (`runtime.CPUCounter`: v1
// `cpuacct.usage`, v2 `cpu.stat` `usage_usec`, one file) at the start and
// every quarter of the limit (10 to 100 ms), and past it cancels the
// execution's agent call with a cause; the agent interrupts the code (then
// kills it) and the engine answers `ERR_CPU_TIME_EXCEEDED` itself, so
// threads and background processes count; without a limit nothing is
// read. The agent's own watch of its interpreter (/proc) stays for
// runtimes without a cgroup (the fake). Memory and disk map onto the cgroup and the
// sandbox's disk, and a policy applied to a running sandbox resizes both
// (`runtime.Resizer`: the oci runtime writes the memory cgroup's limit and
// resizes the disk with a hidden balloon file, growing the image and the
// filesystem online past its first size where it has CAP_SYS_RESOURCE
// (`runtime.ErrCannotGrow` where not), refusing one below what it holds,
// `runtime.ErrTooSmall`;
// a runtime without it, Kubernetes, refuses the change); `SetPolicy` merges
// the new policy over the current one by section (`policy.Merge`) under the
// sandbox's `policyMu`, and the server checks a raise against the account's
// maxima first; `writable_paths` make the root read-only with a bind of a
// directory of the sandbox's disk at each path (the runtime's
// `Spec.WritablePaths`), so they share the disk limit. The policy is stored
// with the sandbox record (`sandboxes.policy`).
//
// # One ceiling
//
// `Manager.Grant` (ceiling.go) is the
// only decision of a sandbox's resources. It takes the create's limits,
// lifetime and policy `resource_limits` (memory, disk), each named as the
// caller wrote it (`CreateOptions.Names`: `resources.memory_mb`,
// `security_policy.resource_limits.memory_mb`, `sandbox_config.max_memory_mb`,
// E2B's `memoryMB`, the CLI's `--memory`), checks every value asked for
// against the lower of the engine's `MaxLimits`/`MaxTimeout` and the
// account's `max_cpus`, `max_memory_mb`, `max_disk_mb`, `max_timeout`
// (`sandbox.Ceiling`), refuses a sandbox whose footprint (its memory, plus
// its disk where disks are kept in memory: `Manager.Footprint`) exceeds
// what the host could ever admit, and fills what was not asked with the
// engine's defaults cut to the ceiling. The server calls it before
// admission (so admission counts the policy's memory too), for a lifetime
// asked later (`/timeout`, E2B's timeout and refresh) and for a PUT policy;
// `Manager.Create` calls it again with the engine's bounds alone, so a
// direct caller (`sheepfold run`) is held too. What it grants is what the
// runtime gets (`runtime.Spec.Limits`: the cgroup's memory and pids limits,
// the CPU quota, the disk's size).
//
// # Output filtering and terminate
//
// `Sandbox.Execute` (execute_hooks.go)
// puts the policy's `output_filtering` (internal/sandbox/outfilter.go over
// the pure filters of internal/policy/filter.go) between the execution and
// its caller, over every field of the answer: streamed stdout/stderr pass
// through a Redactor per stream (released a line at a time, at most 4 KiB
// held back; a line whose end could begin a secret env value waits for the
// next, and such values are matched with line breaks skipped; a PEM key is
// dropped up to its END line as it comes); every rendering of every
// result, whatever its MIME type (images and PDF too), JSON and data-frame
// data (every string, keys included), the error's name, value and
// traceback, and the agent's notices of dropped results are redacted.
// `max_output_length` is one `policy.Cap` for the whole answer, taken in
// the order the answer comes: text fields are cut (the one that crosses
// the cap carries the marker), JSON, images and other renderings are kept
// whole or left out, a result with nothing left becomes a dropped one
// (said once when streaming, counted in `Execution.Dropped`), and the
// error's name is kept up to 128 bytes beside it. Kept output is filtered
// whole in the same order; a streamed error is filtered once and the
// Execution ends with that same copy. Commands (`Sandbox.Run` and
// `Connect`, so /v1 commands and E2B processes alike) pass through the
// same redactors and cap per call (`commandFilter`). The filter of a
// sandbox's policy and env is built once per policy (`policyFilter`);
// patterns are compiled once and a chunk without any trigger substring
// costs a few searches. The Manager's sink (sink.go), in front of
// `Config.Events`, fills in owners for emitters that know only the sandbox
// id, redacts and cuts every text in the details of a sandbox's events
// (its violations' targets come from the code or the gateway), so the
// store, the event stream and the webhooks only see them filtered, and
// stops a sandbox whose policy says `on_violation: "terminate"` at its
// first `security_violation`. The execution history, the E2B surface's
// answers and MCP's tools are made of these filtered answers.
//
// # Replicas
//
// On the Kubernetes backend the engine is shared (Config.Shared; shared.go,
// and internal/server's shared.go): Pods
// outlive every server process, and every replica over the same store,
// namespace and instance serves every sandbox. The record decides: each
// lookup reads it (one store read; the local backend does not), so a
// sandbox another replica stopped is released here (Manager.Release: calls
// streaming through this replica end, nothing is destroyed) and a running
// one this replica does not hold is adopted (Manager.Adopt, through
// runtime.Attacher: the Pod's IP, a TLS dial, a ping) with its limits,
// policy, execution timeout and E2B origin from the record, then served as
// if created here. There is no forwarding between replicas: each dials
// every agent itself, so streams, processes, files and previews work on
// any replica. What decides a sandbox's life lives in its agent, which
// every replica's requests pass: the deadline (an engine whose timer fires
// asks the agent whether another moved it; a lookup follows the record's
// later expiry) and idleness (a ping reports requests in flight and the
// time since the last). Starting or stopping a replica destroys and records
// nothing; each replica runs a collector every 15 s that compares the
// runtime's inventory (runtime.Inventory: Pods, and Secrets or
// NetworkPolicies a failed create left) with the running records: a
// sandbox no record claims is destroyed after a 2-minute grace (a create in
// flight), except warm pool members (labelled; their agent ends them within
// its 10-minute pool lease once no replica renews it) and volumes'
// attendants within their lifetime (attendant.go); a record whose Pod
// is gone or ended is recorded stopped ("timed out" past its expiry).
// Collecting twice is harmless. Each replica has a name (new at every
// start) and a heartbeat row in the store (table replicas), renewed every
// 15 s and lasting 60 s; each execution it records names it. The collector
// ends (ERR_INTERNAL, "the server running it stopped") the executions
// still recorded as running by replicas whose heartbeat lapsed, and a
// replica that stops ends its own at once; executions of a live replica
// are never ended this way (one that could not reach the store for a
// minute writes its true outcome over it when its execution ends). Replicas share the keys they sign with: the
// preview key and E2B's access-token key derive from the agents' authority
// (an HMAC under its private key). A credential is checked before a
// sandbox is looked up, so a request without one never makes a replica
// adopt anything: a token or preview credential by its HMAC; a signed URL
// against the tokens this replica knows, and when it matches none, after
// learning the tokens of every running sandbox's owner's keys (at most once
// a second however many arrive); an anonymous preview goes on to a sandbox
// held elsewhere only when its record says its E2B traffic is public. Limits
// that must hold across replicas (the concurrent-sandbox cap, monthly
// executions, an account's per-minute rate limits) are counted in the store
// (store.AdmissionStore and store.RateStore: internal/store), or by the
// agent (a sandbox policy's `rate_limiting.requests_per_minute`, above;
// per replica only with an agent older than budget.take). Per replica:
// ports made public through /v1 (E2B's public traffic is in the record). Metering is exactly once across
// replicas through a meter lease per sandbox (table meter_leases,
// internal/metering/leases.go): only its holder samples the sandbox; each
// flush renews the lease (30 s) and advances the counters it keeps (the
// sandbox's CPU counter and the time metered up to) in the same
// transaction as the usage, only while the lease is still the holder's;
// the other replicas count only executions, commands and egress made
// through them, and take the lease once it lapsed (its holder died or
// stopped), going on from its counters. A holder that lost its lease
// writes nothing of that sandbox and gives back what it had accrued.
//
// # Pause, snapshots and auto-pause
//
// Pause (pause.go) moves a running sandbox with no request in flight to
// Paused: its timer stops (the time left is kept), the Pausing hook takes
// the last metering sample, every agent connection is closed, and the
// runtime's Checkpointer writes it into Config.CheckpointDir/<id>. Resume
// restores it, makes a new agent client on the new socket, tells the
// agent the time left and restarts the timer (the Resumed hook: metering
// from the new cgroup's counters); the AdmitResume hook, asked before the
// restore, may refuse it with the sandbox left paused, and a restore the
// runtime has no room for (runtime.ErrCapacity) is ERR_CAPACITY, paused
// too. The AdmitPause hook, asked once a sandbox counts as paused, lets
// the server bound paused sandboxes per account. Freeze
// (`{"memory":"keep"}`) is the quick variant: the runtime's Freezer
// instead of a checkpoint, memory kept and metered.
//
// With Config.KeepPaused (set by `sheepfold serve`) a pause also writes
// the engine's own record of the sandbox beside the checkpoint
// (sheepfold-sandbox.json: template, limits, env, metadata, owner,
// policy, lifetime left, an auto-pause sandbox's auto_life_ms; keep.go).
// Close leaves paused sandboxes in place, and the next engine of the same
// runtime instance takes back, in New before its reconcile destroys the
// rest, every sandbox whose record reads back and whose checkpoint the
// runtime finds complete (runtime.CheckpointKeeper), in state Paused; the
// others are destroyed and listed by Manager.Lost. The engine decides
// from its own files, not the store, so that engines without a database
// (`sheepfold run`, these tests) keep them too.
//
// PausedBytes (pausedbytes.go) is what a sandbox paused to disk holds:
// its checkpoint directory's blocks plus its kept disk
// (runtime.DiskMeter); PauseEstimate (cgroup memory + disk) is what the
// server reserves for a pause until it resumes.
//
// Snapshot (snapshot.go) stops the sandbox's life for the moment of it as
// a pause does, and has the runtime's Snapshotter dump it leaving it
// running; CreateOptions.Snapshot makes Create clone from such a dump
// instead of creating (never from the warm pool, never with a network).
// Snapshot pools (snappool.go): SetSnapshotPool(key, opt, n) keeps n
// clones of a snapshot restored ahead under a key, each restored by a
// filler goroutine per pool as a warm pool member is started (invisible
// until handed out, a lease its agent renews); a create whose
// CreateOptions.SnapshotPool names the key takes the oldest through the
// warm pool's hand-out (handOut, pool.go: its life, metadata, owner and
// announcement start then). Close destroys every member.
//
// CreateOptions.AutoPause (autopause.go) hands a sandbox's end to the
// auto-pause loop, started with the first such sandbox: every
// AutoPauseNotice/4 (at most 1 s) it samples each auto-pause sandbox's
// cgroup CPU, its requests in flight and the last preview byte (DialPort's
// connections are wrapped to note it), sends `sandbox.pausing` when the
// pause is due within the notice, and pauses those idle past
// Config.IdleTimeout (the idle loop leaves them alone). The lifetime's end
// still comes from the sandbox's timer (expire), which asks the same
// decision (autoPauseDue): idle for the notice, the lifetime it was
// created with is told to the agent and Pause runs; active, the lifetime
// (the agent's included) moves by a notice.
//
// Imports: api (its Execution is the one an execution fills),
// internal/runtime, internal/agentproto, internal/apierr,
// internal/events (what it emits), internal/policy (the decisions it
// enforces), internal/egress (a networked sandbox's gateway), internal/lang,
// internal/typescript (transpiling before the agent), internal/ratelimit,
// internal/volume (a volume's files from the host, volumes.go),
// internal/backoff (the waits of its retry loops), golang.org/x/sync and x/time, and the standard library; never net/http,
// never a transport.
package sandbox
