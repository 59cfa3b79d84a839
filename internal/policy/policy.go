// Package policy holds a sandbox's security policy and the pure decisions
// made from it: limits, imports, egress hosts, path rules and output
// filtering. It does no I/O; the engine, the agent's kernels and the
// network gateway enforce what it decides. Every field is optional: a nil
// pointer or empty list means "not set", and the engine's defaults apply.
//
// Which layer guarantees what is documented in README ("Policies and
// network"): import rules are a convenience backed by the OS layers;
// seccomp, namespaces, mounts, cgroups and the gateway are the boundary.
package policy

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
// any subdomain), each with an optional ":port", and CIDRs.
type Network struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
}

// OutputFiltering is applied on the host to stdout, stderr, results and
// error text.
type OutputFiltering struct {
	MaxOutputLength    *int64 `json:"max_output_length,omitempty"`
	StripSensitiveData *bool  `json:"strip_sensitive_data,omitempty"`
	SanitizeErrors     *bool  `json:"sanitize_errors,omitempty"`
}

// RateLimiting bounds executions per minute in one sandbox.
type RateLimiting struct {
	RequestsPerMinute *int64 `json:"requests_per_minute,omitempty"`
}
