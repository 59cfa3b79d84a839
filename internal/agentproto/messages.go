package agentproto

import (
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// ProtocolVersion is bumped on any incompatible change to the messages.
const ProtocolVersion = 1

// Operations a Request may ask for.
const (
	OpPing = "ping" // Done.Agent; with Request.LifetimeMS also sets the sandbox's deadline

	OpProcessStart   = "process.start"   // Request.Process; events start, stdout, stderr, then Done with ExitCode/Signal
	OpProcessConnect = "process.connect" // Request.PID; streams the running process's output from now on, then Done
	OpProcessInput   = "process.input"   // Request.PID, Request.Data; Request.EOF closes stdin
	OpProcessSignal  = "process.signal"  // Request.PID, Request.Signal
	OpProcessResize  = "process.resize"  // Request.PID, Request.Size: a terminal's new size
	OpProcessList    = "process.list"    // Done.Processes

	OpContextCreate  = "context.create"  // Request.Context; Done.Context
	OpContextList    = "context.list"    // Done.Contexts
	OpContextRestart = "context.restart" // Request.ContextID; Done.Context
	OpContextDelete  = "context.delete"  // Request.ContextID
	OpExecute        = "context.execute" // Request.Execute; events stdout, stderr, result, error, then Done with Status and Stats

	OpFileRead   = "file.read"   // Request.Path, Request.Limit; event file (Entry), data frames, empty data frame, then Done
	OpFileWrite  = "file.write"  // Request.Path, Request.Mode, Request.Limit; client sends data frames and an empty one; Done.Entry
	OpFileList   = "file.list"   // Request.Path, Depth, Limit, After; Done.Entries, Truncated
	OpFileStat   = "file.stat"   // Request.Path; Done.Entry
	OpFileMkdir  = "file.mkdir"  // Request.Path, Request.Mode; makes parents; Done.Entry
	OpFileRemove = "file.remove" // Request.Path; removes directories recursively
	OpFileMove   = "file.move"   // Request.Path, Request.NewPath; Done.Entry
	// OpFileWatch watches the directory Request.Path (Request.Recursive,
	// Request.IncludeEntry): event watch_start once the watch is in place,
	// then an event fs per change, until the client closes the connection
	// (no Done then), or a Done when the watched directory is removed.
	OpFileWatch = "file.watch"

	// OpPortConnect opens a TCP connection to Request.Port on the
	// sandbox's loopback (127.0.0.1, else ::1): an event connected once it
	// is open, after which the agent connection carries that TCP stream's
	// bytes raw, both ways (no frames), until either side closes (a
	// half-close is passed on). Nothing listening is a failed Done with
	// CodeRefused, at once. Connect (client.go) is the host's side.
	OpPortConnect = "port.connect"
	// OpPortList lists the TCP ports listening inside the sandbox (from
	// /proc/net/tcp and tcp6): Done.Ports.
	OpPortList = "port.list"

	// OpUsageHistory returns the usage samples the agent took every 5 s
	// for the last hour (Done.History, oldest first), where it keeps them
	// (a Pod's agent); CodeUnsupported elsewhere.
	OpUsageHistory = "usage.history"

	// OpEgressAccept waits for the next connection made to the sandbox's
	// egress listener (a loopback port its HTTP_PROXY names, where the
	// agent has one): an event connected once one is made, after which
	// the agent connection carries that connection's bytes raw, both
	// ways, as OpPortConnect's. The host hands it to the sandbox's egress
	// gateway. CodeUnsupported when the agent has no egress listener.
	OpEgressAccept = "egress.accept"

	// OpUsage reads the sandbox's resource usage from the agent's own
	// cgroup, the container's (Done.Usage): how the host measures a
	// sandbox whose cgroup it cannot read itself (a Pod, whose cgroup is
	// on its node). CodeUnsupported when the agent finds no cgroup.
	OpUsage = "usage"

	// OpBudgetTake takes one from a budget of the sandbox that its agent
	// keeps (Request.Budget), so that every engine serving the sandbox
	// (each of the server's replicas) counts against the same one:
	// Done.Budget says whether it was taken. A total budget counts for
	// the agent's life; a per-minute one is a token bucket holding a
	// minute's worth.
	OpBudgetTake = "budget.take"
)

// Budget names (BudgetSpec.Name).
const (
	BudgetNetworkRequests = "network_requests" // resource_limits.network_requests: a total
	BudgetExecutions      = "executions"       // rate_limiting.requests_per_minute: per minute
)

// BudgetSpec names a budget and its size (budget.take). The size is
// given with each take (a policy change applies to the next); a total
// budget keeps its count when its limit changes, a per-minute one its
// tokens, cut to the new limit.
type BudgetSpec struct {
	Name      string `json:"name"`
	Limit     int64  `json:"limit"`                // > 0
	PerMinute bool   `json:"per_minute,omitempty"` // a token bucket of Limit a minute, else a total
}

// BudgetTaken is the outcome of budget.take.
type BudgetTaken struct {
	Allowed bool `json:"allowed"`
	// Count is how many the total budget has given, this take included
	// when allowed; for a per-minute one, the whole tokens left.
	Count int64 `json:"count"`
	// RetryAfterMS is when a refused per-minute take would succeed.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Event types.
const (
	EventStart  = "start"  // a process started: PID; an execution started: ExecutionCount
	EventStdout = "stdout" // Data
	EventStderr = "stderr" // Data
	EventPTY    = "pty"    // Data: what a process started with a terminal wrote to it
	EventResult = "result" // Result
	EventError  = "error"  // Error: an exception raised by executed code
	EventFile   = "file"   // Entry, before the data frames of a file.read
	// EventDropped stands for a result (or another event) that was not
	// sent because it was too large: Dropped says how large and why.
	EventDropped = "dropped"
	// EventViolation reports that code tried something the sandbox's
	// policy forbids (Violation); the execution goes on or fails as the
	// kernel decides. Reports come from inside the sandbox: they describe
	// what its own code did, and those a driver relays (Violation.Source
	// SourceSandbox) may be forged by that code.
	EventViolation = "violation"
	EventDone      = "done" // the last event of every request
	// EventConnected (port.connect) is the last frame of its connection:
	// raw bytes of the TCP stream follow.
	EventConnected = "connected"
)

// Event types of file.watch.
const (
	EventWatchStart = "watch_start" // the watch is in place
	EventFS         = "fs"          // a change: FS, and Entry with Request.IncludeEntry
)

// Machine codes the agent puts in Done.Code when a request fails. The host
// maps them to API error codes; Done.Error is a human-readable message.
const (
	CodeBadRequest  = "bad_request" // malformed or unknown request
	CodeNotFound    = "not_found"   // no such path, process or context
	CodeExists      = "exists"      // the target already exists
	CodeNotDir      = "not_dir"     // a path component is not a directory
	CodeIsDir       = "is_dir"      // the path is a directory where a file is needed
	CodePermission  = "permission"  // the sandbox user may not do it
	CodeTooLarge    = "too_large"   // a body passed Request.Limit
	CodeNoSpace     = "no_space"    // the sandbox's disk is full
	CodeUnsupported = "unsupported" // unknown language or operation
	CodeRefused     = "refused"     // port.connect: nothing listens on the port
	CodeInternal    = "internal"    // anything else
)

// Statuses of a finished execution (Done.Status).
const (
	StatusOK          = "ok"           // the code ran to its end
	StatusError       = "error"        // the code raised; an EventError was sent
	StatusTimeout     = "timeout"      // the wall-clock limit passed; the code was interrupted or killed
	StatusOutputLimit = "output_limit" // output passed the cap; the code was interrupted or killed
	StatusKilled      = "killed"       // the interpreter died (a signal, e.g. the OOM killer); the context restarts on next use
	StatusCPULimit    = "cpu_limit"    // the execution used more CPU time than KernelPolicy.CPUTimeMS; it was interrupted or killed
)

// Request is the first frame on every connection.
type Request struct {
	Op string `json:"op"`

	Process *ProcessSpec `json:"process,omitempty"`
	PID     int          `json:"pid,omitempty"`
	Data    []byte       `json:"data,omitempty"`
	EOF     bool         `json:"eof,omitempty"`
	Signal  int          `json:"signal,omitempty"`

	Context   *ContextSpec `json:"context,omitempty"`
	ContextID string       `json:"context_id,omitempty"`
	Execute   *ExecuteSpec `json:"execute,omitempty"`

	Path    string `json:"path,omitempty"`
	NewPath string `json:"new_path,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`  // permission bits for file.write and file.mkdir; 0 means 0644 / 0755
	Depth   int    `json:"depth,omitempty"` // file.list: 1 (or 0) lists direct children only
	Limit   int64  `json:"limit,omitempty"` // file.read/file.write: refuse bodies larger than this (0: no limit); file.list: at most this many entries
	After   string `json:"after,omitempty"` // file.list: resume after this entry (a path the listing returned)

	// Metadata (file.write) is stored with the file as the extended
	// attributes user.e2b.<key>; the written file carries exactly these
	// (a file.write replaces the file, so nil leaves it none).
	Metadata map[string]string `json:"metadata,omitempty"`
	// Recursive (file.watch) also watches every subdirectory, including
	// those created later.
	Recursive bool `json:"recursive,omitempty"`
	// IncludeEntry (file.watch) adds the changed entry's FileInfo to each
	// event, when the entry still exists.
	IncludeEntry bool `json:"include_entry,omitempty"`
	// LifetimeMS (ping), when positive, tells the agent to end the whole
	// sandbox this many milliseconds from now unless a later ping moves
	// it: the host's deadline holds even while no host engine runs.
	LifetimeMS int64 `json:"lifetime_ms,omitempty"`
	// Size (process.resize) is a terminal's new size.
	Size *TermSize `json:"size,omitempty"`
	// User (file.read, file.write, file.list, file.stat, file.mkdir,
	// file.remove, file.move, file.watch) is the sandbox user the
	// operation acts as: its permission checks are that user's, what it
	// creates is that user's, and relative paths start at that user's
	// home. "" and UserDefault mean "user"; UserRoot is root inside the
	// sandbox; any other name must be in the sandbox's /etc/passwd
	// (CodeBadRequest "unknown user" otherwise).
	User string `json:"user,omitempty"`
	// Owner (file.write, file.mkdir), when set, replaces User: the
	// operation acts with the agent's own permissions (root's in the
	// sandbox) and makes what it creates (the file, missing parent
	// directories) owned by this user, whose home relative paths start
	// at. This is E2B's envd's way: it writes as root on the user's
	// behalf. Other operations refuse it (CodeBadRequest).
	Owner string `json:"owner,omitempty"`
	// Port (port.connect) is the TCP port on the sandbox's loopback.
	Port int `json:"port,omitempty"`
	// Budget (budget.take) is the budget to take one from.
	Budget *BudgetSpec `json:"budget,omitempty"`
}

// Sandbox users a request may name (ProcessSpec.User, Request.User).
const (
	UserDefault = "user" // uid 1000, home /home/user: the default
	UserRoot    = "root" // uid 0 inside the sandbox (unprivileged outside it)
)

// ProcessSpec describes a command to start.
type ProcessSpec struct {
	Cmd  string            `json:"cmd"`            // executable; looked up in PATH when it has no slash
	Args []string          `json:"args,omitempty"` // arguments after the command name
	Env  map[string]string `json:"env,omitempty"`  // added to the sandbox's environment
	Cwd  string            `json:"cwd,omitempty"`  // default /home/user
	Tag  string            `json:"tag,omitempty"`  // caller's label, shown in process.list
	// Stdin keeps the process's stdin open for process.input; otherwise it
	// reads from /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// TimeoutMS kills the process (SIGKILL to its process group) after this
	// long; 0 means no limit.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes caps stdout plus stderr streamed to this connection;
	// past it the process is killed and Done.Truncated set. 0: no cap.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// User runs the process as this sandbox user (see Request.User): ""
	// and UserDefault run it as "user" with no capabilities; UserRoot as
	// root with the agent's capabilities, confined to the sandbox's user
	// namespace. HOME, USER and LOGNAME are the user's, and the default
	// working directory is the user's home.
	User string `json:"user,omitempty"`
	// PTY, when set, starts the process on a new pseudo-terminal of this
	// size, as the leader of a new session with the terminal as its
	// controlling terminal and stdin, stdout and stderr: its output comes
	// as EventPTY, process.input writes to the terminal (the process
	// reads it as typed) and process.resize changes its size. Stdin is
	// ignored then.
	PTY *TermSize `json:"pty,omitempty"`
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ContextSpec describes a code context (a long-lived interpreter).
type ContextSpec struct {
	// Language is python, javascript, typescript, bash, r or java. A typescript
	// context runs on Node: the host sends its cells already transpiled.
	Language string            `json:"language"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// OutputCapMarker is the line an execution's output gets where the part
// past its cap (ExecuteSpec.MaxOutputBytes, the format's %d) was dropped.
const OutputCapMarker = "\n[output truncated at %d bytes: the rest is dropped]\n"

// ExecuteSpec is one execution of code in a context.
type ExecuteSpec struct {
	Code string `json:"code"`
	// ContextID names the context; when empty, the sandbox's default context
	// for Language is used (and created on first use).
	ContextID      string            `json:"context_id,omitempty"`
	Language       string            `json:"language,omitempty"`
	Env            map[string]string `json:"env,omitempty"` // set for this execution only
	TimeoutMS      int64             `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"` // stdout plus stderr; 0: no cap
	// StopAtOutputCap ends the execution when its output passes
	// MaxOutputBytes (StatusOutputLimit). Without it the output past the
	// cap is dropped after a marker (OutputCapMarker), Done.Truncated is
	// set, and the code runs on to its end or its timeout.
	StopAtOutputCap bool `json:"stop_at_output_cap,omitempty"`
	// Preload, when set, runs no code: the context imports these modules
	// (Python only) into the interpreter's module cache, binding no name in
	// the user's namespace and counting as no execution. The warm pool
	// uses it; Done.Status is error when an import failed.
	Preload []string `json:"preload,omitempty"`
	// Policy is what the sandbox's security policy asks of the context
	// (nil: nothing). PolicyGen numbers the host's policy versions: a
	// context applies Policy when it has not applied this generation yet.
	// A context that applied a generation below PolicyRestartGen (the
	// latest change that loosened a rule only a fresh interpreter can
	// drop, such as the subprocess filter) restarts first; its state is lost.
	Policy           *KernelPolicy `json:"policy,omitempty"`
	PolicyGen        int64         `json:"policy_gen,omitempty"`
	PolicyRestartGen int64         `json:"policy_restart_gen,omitempty"`
}

// KernelPolicy is the part of a sandbox's security policy its code
// contexts enforce. Python enforces all of it; Node enforces
// DenySubprocess (and CPUTimeMS, counted by the agent); Bash contexts
// refuse to run code while DenySubprocess is set (a shell that cannot
// fork runs only its builtins).
type KernelPolicy struct {
	// DenySubprocess puts the interpreter under a seccomp filter
	// (Seccomp) that hands execve, execveat, fork, vfork and clone without
	// CLONE_THREAD to the agent, which refuses each with EPERM and
	// reports it (EventViolation, coalesced); Python installs it on
	// itself, Node starts under it.
	DenySubprocess bool `json:"deny_subprocess,omitempty"`
	// Seccomp is the classic BPF program (struct sock_filter records,
	// native byte order) the interpreter installs on itself with
	// seccomp(2), whose number on this architecture is SeccompSyscall.
	Seccomp        []byte `json:"seccomp,omitempty"`
	SeccompSyscall int    `json:"seccomp_syscall,omitempty"`
	// Import rules for the user's own code: AllowedImports (nil: any) and
	// BlockedModules; a name covers its submodules. DenyImportSystem also
	// closes the import machinery's back doors.
	AllowedImports   []string `json:"allowed_imports,omitempty"`
	BlockedModules   []string `json:"blocked_modules,omitempty"`
	DenyImportSystem bool     `json:"deny_import_system,omitempty"`
	// AllowNetwork false makes a connection to a non-loopback address fail
	// at once with NetworkRestrictedError (the sandbox has no route out
	// anyway; this makes the refusal clear and reported).
	AllowNetwork bool `json:"allow_network,omitempty"`
	// CPUTimeMS bounds the CPU time of one execution (0: none), and of
	// what it leaves running in its interpreter's process group until
	// the next execution starts (the agent kills the group past it, and
	// the next execution reports StatusCPULimit instead of running).
	CPUTimeMS int64 `json:"cpu_time_ms,omitempty"`
	// FileSizeBytes is the interpreter's RLIMIT_FSIZE (0: none).
	FileSizeBytes int64 `json:"file_size_bytes,omitempty"`
}

// Violation is what EventViolation reports. Kind is one of the
// security_violation kinds of internal/events (module_blocked,
// subprocess_denied, network_denied, path_denied, syscall_denied) or
// "resource" with Target naming the resource (disk).
type Violation struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	// Count is how many attempts the report stands for (0: one). The
	// seccomp supervisor coalesces repeated refusals: the first of a
	// kind and target in an execution is reported at once, the rest in
	// one report at the end of the execution.
	Count int64 `json:"count,omitempty"`
	// Source says who saw it: SourceAgent, or the code in the sandbox
	// (SourceSandbox, and "", the default: what the agent does not
	// vouch for is the sandbox's word).
	Source string `json:"source,omitempty"`
}

// Who saw a violation (Violation.Source).
const (
	// SourceAgent: the agent itself (a system call its seccomp
	// supervisor refused, a context it would not run); the code in the
	// sandbox cannot write these reports, only cause them.
	SourceAgent = "agent"
	// SourceSandbox: the code in the sandbox said so (a language
	// driver's hooks, through the control pipe the code can write to
	// as well): it may be forged.
	SourceSandbox = "sandbox"
)

// Event is every frame the agent sends back; Type says which fields are set.
type Event struct {
	Type string `json:"type"`

	PID int `json:"pid,omitempty"`
	// ExecutionCount numbers an execution in its context (1 for the
	// first since the context started or restarted), in its EventStart.
	ExecutionCount int64      `json:"execution_count,omitempty"`
	Data           []byte     `json:"data,omitempty"`
	Result         *Result    `json:"result,omitempty"`
	Error          *ExecError `json:"error,omitempty"`
	Entry          *FileInfo  `json:"entry,omitempty"`
	FS             *FSEvent   `json:"fs,omitempty"` // EventFS
	// Dropped describes what an EventDropped stands for.
	Dropped *Dropped `json:"dropped,omitempty"`

	Violation *Violation `json:"violation,omitempty"` // EventViolation

	// Fields of the Done event.
	Code      string        `json:"code,omitempty"`    // failure code (Code* constants); empty on success
	Message   string        `json:"message,omitempty"` // failure text
	Status    string        `json:"status,omitempty"`  // executions: Status* constants
	ExitCode  *int          `json:"exit_code,omitempty"`
	Signal    int           `json:"signal,omitempty"` // processes: the signal that ended it
	Truncated bool          `json:"truncated,omitempty"`
	Stats     *Stats        `json:"stats,omitempty"`
	Agent     *AgentInfo    `json:"agent,omitempty"`
	Context   *ContextInfo  `json:"context,omitempty"`
	Contexts  []ContextInfo `json:"contexts,omitempty"`
	Processes []ProcessInfo `json:"processes,omitempty"`
	Entries   []FileInfo    `json:"entries,omitempty"`
	Ports     []PortInfo    `json:"ports,omitempty"`   // port.list
	Usage     *Usage        `json:"usage,omitempty"`   // usage
	History   []UsageSample `json:"history,omitempty"` // usage.history
	Budget    *BudgetTaken  `json:"budget,omitempty"`  // budget.take
}

// Usage is the sandbox's resource usage as its agent reads it from its
// own cgroup (usage); the fields mean what runtime.Usage's do. Its disk
// figures are those of the sandbox's scratch volume where it has one (a
// Pod's home and /tmp); a Pod's writable layer lives in its node's
// snapshotter, which statfs inside the sandbox cannot tell apart from
// the node's filesystem.
type Usage struct {
	// Cgroup says which hierarchy the figures came from: "v1" or "v2".
	Cgroup           string  `json:"cgroup"`
	MemoryBytes      int64   `json:"memory_bytes"`       // page cache included
	MemoryCacheBytes int64   `json:"memory_cache_bytes"` // v1 total_cache, v2 memory.stat file
	MemoryPeakBytes  int64   `json:"memory_peak_bytes"`  // 0 where the kernel keeps no peak (v2 before 5.19)
	MemoryLimit      int64   `json:"memory_limit"`       // v2: -1 for none; v1: its huge "none" as is
	OOMKills         uint64  `json:"oom_kills"`
	CPUNanos         uint64  `json:"cpu_nanos"`
	CPULimit         float64 `json:"cpu_limit"` // CPUs (quota / period); 0: none
	Pids             int64   `json:"pids"`
	PidsDenied       uint64  `json:"pids_denied"`
	// DiskBytes and DiskTotalBytes are the use and size of the sandbox's
	// disk where the agent has one to measure (a Pod's scratch volume).
	DiskBytes      int64 `json:"disk_bytes,omitempty"`
	DiskTotalBytes int64 `json:"disk_total_bytes,omitempty"`
	// Pressure is the cgroup's PSI (v2 with a kernel that keeps it).
	Pressure *Pressure `json:"pressure,omitempty"`
}

// UsageSample is one sample of the agent's usage history.
type UsageSample struct {
	UnixMS int64 `json:"unix_ms"` // when it was taken
	Usage  Usage `json:"usage"`
}

// Pressure is a cgroup v2's pressure stall information: the avg10 figure
// (percent of the last 10 s) of each file's "some" and "full" lines.
type Pressure struct {
	CPUSome    float64 `json:"cpu_some"`
	MemorySome float64 `json:"memory_some"`
	MemoryFull float64 `json:"memory_full"`
	IOSome     float64 `json:"io_some"`
	IOFull     float64 `json:"io_full"`
}

// PortInfo is one listening TCP socket inside the sandbox (port.list).
type PortInfo struct {
	Port int `json:"port"`
	// Address is the address it is bound to ("0.0.0.0", "127.0.0.1",
	// "::", "::1", ...).
	Address string `json:"address"`
}

// Result is one rich value produced by executed code, as MIME renderings:
// the /v1 API's Result, which the engine forwards as the agent wrote it.
type Result = api.Result

// MaxResult bounds the encoding of one result as a kernel driver writes
// it; larger results are dropped (EventDropped), so that every result fits
// in a frame.
const MaxResult = 3_500_000

// Dropped describes an event that was not sent because it was too large.
type Dropped struct {
	Type   string `json:"type"`   // the event type it would have been (EventResult, ...)
	Bytes  int64  `json:"bytes"`  // its encoded size
	Reason string `json:"reason"` // why, for people
}

// ExecError is an exception raised by executed code: the /v1 API's
// ExecError.
type ExecError = api.ExecError

// Stats measures one execution or process.
type Stats struct {
	DurationMS      float64 `json:"duration_ms"`
	CPUTimeMS       float64 `json:"cpu_time_ms"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
}

// AgentInfo answers ping.
type AgentInfo struct {
	Version         string   `json:"version"`
	ProtocolVersion int      `json:"protocol_version"`
	Languages       []string `json:"languages"`
	// LifetimeLeftMS is how long until the agent ends the sandbox (the
	// last deadline a ping set, grace included); 0 when none was set.
	// Servers that share sandboxes read it: another may have moved it.
	LifetimeLeftMS int64 `json:"lifetime_left_ms,omitempty"`
	// Busy counts requests in flight other than pings and usage reads; IdleMS is how
	// long ago the last of them ended (or since the agent started, when
	// none came). Every server's requests pass the agent, so these say
	// whether anyone is using the sandbox.
	Busy   int64 `json:"busy,omitempty"`
	IdleMS int64 `json:"idle_ms,omitempty"`
}

// ContextInfo describes a code context.
type ContextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ProcessInfo describes a running process started through process.start.
type ProcessInfo struct {
	PID     int               `json:"pid"`
	Cmd     string            `json:"cmd"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd"`
	Tag     string            `json:"tag,omitempty"`
	Started time.Time         `json:"started"`
}

// File types in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes a path inside the sandbox: the /v1 API's FileInfo,
// its Metadata the file's user.e2b.* extended attributes (set through
// Request.Metadata of file.write).
type FileInfo = api.FileInfo

// MetadataXattrPrefix starts the names of the extended attributes that
// hold FileInfo.Metadata (E2B's envd uses the same).
const MetadataXattrPrefix = "user.e2b."

// Kinds of change in FSEvent.Op (E2B's EventType, fsnotify's Op).
const (
	FSCreate = "create" // created, or moved in (under its new name)
	FSWrite  = "write"  // content written (coalesced: see file.watch)
	FSRemove = "remove" // removed
	FSRename = "rename" // moved away (under its old name)
	FSChmod  = "chmod"  // attributes changed (mode, owner, times, xattrs)
	// FSOverflow: the kernel's event queue overflowed and changes were
	// lost; Name is empty.
	FSOverflow = "overflow"
)

// FSEvent is one change seen by file.watch.
type FSEvent struct {
	// Name is the entry's path relative to the watched directory,
	// slash-separated ("sub/file.txt"); empty for the directory itself.
	Name string `json:"name"`
	Op   string `json:"op"`
}
