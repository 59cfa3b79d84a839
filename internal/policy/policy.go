// Package policy holds a sandbox's security policy and the pure decisions
// made from it: limits, imports, egress hosts, path rules and output
// filtering. It does no I/O; the engine, the agent's kernels and the
// network gateway enforce what it decides. Every field is optional: a nil
// pointer or empty list means "not set", and the engine's defaults apply.
//
// Which layer guarantees what is documented in README ("Policies and
// network"): import rules are a convenience backed by the OS layers;
// seccomp, namespaces, mounts, cgroups and the gateway are the boundary.
//
// # The policy and its enforcement
//
// internal/policy holds the policy JSON, its strict parser (`Parse`: unknown
// fields and wrong types are errors naming the field; `Validate` checks
// ranges), the decisions made from it (`Loosened`, `FixedChange`, `Writable`,
// `ModuleAllowed`; `WithTwins`, which adds to an import rule's modules the
// C-level modules that stand for them: `os` → `posix`, `socket` →
// `_socket`, `subprocess` → `_posixsubprocess`, `ctypes` → `_ctypes`...) and
// the no-subprocess seccomp program (`NoSubprocessFilter`,
// assembled with golang.org/x/net/bpf, checking the architecture). The
// engine (internal/sandbox/policy.go) keeps each sandbox's policy with a
// generation number and sends its kernel part (`agentproto.KernelPolicy`)
// with every execution; a context applies a generation once, and one that
// applied a generation a later change loosened restarts first
// (`PolicyRestartGen`). The Python driver applies it on itself: the seccomp
// filter and a Landlock domain through ctypes (internal/kernel); import rules (the
// engine adds each public module's C-level twins, `policy.WithTwins`) as a
// finder at the head of `sys.meta_path`, the source loaders' `exec_module`
// and `_imp`'s module-creating functions, wrapped `__import__` /
// `importlib.import_module` and an audit hook, all installed once and
// judging the stack past the import system and the name-resolving helpers
// (rules only tighten inside one interpreter; docs/security.md, section 4);
// RLIMIT_FSIZE, and
// RLIMIT_CPU per execution (the backstop of `cpu_time_seconds`); it reports refusals on its control pipe and the
// kernel forwards them as `violation` events marked as the sandbox's word
// (the code can write that pipe too), which the engine emits as
// `security_violation` / `resource_exceeded` events (internal/events) with
// the execution's id, bounded in number (internal/events). The end of an
// execution is the driver's word as well (its `done` and its marker, which
// the code can write or cause): under `cpu_time_seconds` the kernel goes on
// counting the interpreter's process group after the end, until the next
// execution starts, and kills it past the limit; the next execution
// reports `CPUTimeExceeded` instead of running (internal/kernel/idle.go). Bash contexts refuse to run under
// `allow_subprocess: false` (a shell that cannot fork runs only builtins).
package policy

import "reflect"

// Policy is the JSON object given as `security_policy` at create and
// replaced by PUT /v1/sandboxes/{id}/policy.
type Policy struct {
	ResourceLimits  *ResourceLimits  `json:"resource_limits,omitempty"`
	AccessControl   *AccessControl   `json:"access_control,omitempty"`
	Filesystem      *Filesystem      `json:"filesystem,omitempty"`
	Network         *Network         `json:"network,omitempty"`
	OutputFiltering *OutputFiltering `json:"output_filtering,omitempty"`
	RateLimiting    *RateLimiting    `json:"rate_limiting,omitempty"`
	// OnViolation is "report" (the default) or "terminate": stop the
	// sandbox at its first security violation.
	OnViolation string `json:"on_violation,omitempty"`
}

// ResourceLimits bound one execution (CPU time) or the sandbox.
type ResourceLimits struct {
	CPUTimeSeconds   *float64 `json:"cpu_time_seconds,omitempty"`
	MemoryMB         *int64   `json:"memory_mb,omitempty"`
	DiskWriteMB      *int64   `json:"disk_write_mb,omitempty"`
	NetworkRequests  *int64   `json:"network_requests,omitempty"`
	FileSizeUploadMB *int64   `json:"file_size_upload_mb,omitempty"`
}

// AccessControl rules what the user's code may import and run.
type AccessControl struct {
	AllowSubprocess   *bool    `json:"allow_subprocess,omitempty"`
	AllowImportSystem *bool    `json:"allow_import_system,omitempty"`
	AllowedImports    []string `json:"allowed_imports,omitempty"`
	BlockedModules    []string `json:"blocked_modules,omitempty"`
}

// Filesystem rules are fixed when the sandbox is created.
type Filesystem struct {
	ReadOnly      *bool    `json:"readonly,omitempty"`
	WritablePaths []string `json:"writable_paths,omitempty"`
}

// Network modes.
const (
	NetworkNone      = "none"
	NetworkAllowlist = "allowlist"
	NetworkPublic    = "public"
)

// Network is the egress policy. Mode is "none" (the default),
// "allowlist" or "public". Allow lists host names (exact, or "*." for
// any subdomain), each with an optional ":port", and CIDRs. Rules
// transform the plain HTTP requests to matching destinations (rules.go).
type Network struct {
	Mode  string        `json:"mode,omitempty"`
	Allow []string      `json:"allow,omitempty"`
	Rules []NetworkRule `json:"rules,omitempty"`
}

// OutputFiltering is applied on the host to stdout, stderr, results and
// error text. StopOnOutputCap ends an execution whose output passes the
// engine's cap (ERR_OUTPUT_LIMIT); without it the output is cut with a
// marker and the code runs on to its end or its timeout.
type OutputFiltering struct {
	MaxOutputLength    *int64 `json:"max_output_length,omitempty"`
	StripSensitiveData *bool  `json:"strip_sensitive_data,omitempty"`
	SanitizeErrors     *bool  `json:"sanitize_errors,omitempty"`
	StopOnOutputCap    *bool  `json:"stop_on_output_cap,omitempty"`
}

// RateLimiting bounds executions per minute in one sandbox, and
// (ConcurrentSessions) how many sessions the account may have running
// while a session under this policy runs: checked when a session is
// created.
type RateLimiting struct {
	RequestsPerMinute  *int64 `json:"requests_per_minute,omitempty"`
	ConcurrentSessions *int64 `json:"concurrent_sessions,omitempty"`
}

// Merge is the policy that applying next over cur gives (PUT
// /v1/sandboxes/{id}/policy): each section next sets replaces cur's
// section whole, each section next leaves out (or sets to null) keeps
// cur's, and on_violation keeps cur's unless next sets it. An empty
// section ({}) clears that section's rules.
func Merge(cur, next *Policy) *Policy {
	if cur == nil {
		cur = &Policy{}
	}
	if next == nil {
		next = &Policy{}
	}
	out := *cur
	section(&out.ResourceLimits, next.ResourceLimits)
	section(&out.AccessControl, next.AccessControl)
	section(&out.Filesystem, next.Filesystem)
	section(&out.Network, next.Network)
	section(&out.OutputFiltering, next.OutputFiltering)
	section(&out.RateLimiting, next.RateLimiting)
	if next.OnViolation != "" {
		out.OnViolation = next.OnViolation
	}
	return &out
}

// section sets *dst to next when next is given; an empty one unsets it.
func section[T any](dst **T, next *T) {
	switch {
	case next == nil:
	case reflect.ValueOf(next).Elem().IsZero():
		*dst = nil
	default:
		*dst = next
	}
}
