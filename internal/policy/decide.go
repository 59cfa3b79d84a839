package policy

import (
	"slices"
	"strings"
	"time"
)

// DenySubprocess reports allow_subprocess: false.
func (p *Policy) DenySubprocess() bool {
	return p != nil && p.AccessControl != nil && p.AccessControl.AllowSubprocess != nil && !*p.AccessControl.AllowSubprocess
}

// DenyImportSystem reports allow_import_system: false.
func (p *Policy) DenyImportSystem() bool {
	return p != nil && p.AccessControl != nil && p.AccessControl.AllowImportSystem != nil && !*p.AccessControl.AllowImportSystem
}

// AllowedImports is the import allowlist; nil allows every module.
func (p *Policy) AllowedImports() []string {
	if p == nil || p.AccessControl == nil || len(p.AccessControl.AllowedImports) == 0 {
		return nil
	}
	return p.AccessControl.AllowedImports
}

// BlockedModules lists the modules the user's code may not import.
func (p *Policy) BlockedModules() []string {
	if p == nil || p.AccessControl == nil {
		return nil
	}
	return p.AccessControl.BlockedModules
}

// NetworkMode is the egress mode, NetworkNone unless set.
func (p *Policy) NetworkMode() string {
	if p == nil || p.Network == nil || p.Network.Mode == "" {
		return NetworkNone
	}
	return p.Network.Mode
}

// CPUTime is the CPU time one execution may use; 0 means no bound.
func (p *Policy) CPUTime() time.Duration {
	if p == nil || p.ResourceLimits == nil || p.ResourceLimits.CPUTimeSeconds == nil {
		return 0
	}
	return time.Duration(*p.ResourceLimits.CPUTimeSeconds * float64(time.Second))
}

// MemoryBytes is the sandbox's memory limit; 0 leaves the engine's.
func (p *Policy) MemoryBytes() int64 {
	if p == nil || p.ResourceLimits == nil || p.ResourceLimits.MemoryMB == nil {
		return 0
	}
	return *p.ResourceLimits.MemoryMB << 20
}

// DiskBytes is the size of the sandbox's writable storage; 0 leaves the engine's.
func (p *Policy) DiskBytes() int64 {
	if p == nil || p.ResourceLimits == nil || p.ResourceLimits.DiskWriteMB == nil {
		return 0
	}
	return *p.ResourceLimits.DiskWriteMB << 20
}

// FileSizeBytes bounds one file: an upload through the file API, and
// any file the code writes (RLIMIT_FSIZE). 0 means no bound.
func (p *Policy) FileSizeBytes() int64 {
	if p == nil || p.ResourceLimits == nil || p.ResourceLimits.FileSizeUploadMB == nil {
		return 0
	}
	return *p.ResourceLimits.FileSizeUploadMB << 20
}

// ExecutionsPerMinute is rate_limiting.requests_per_minute: executions one
// sandbox may start per minute. 0 means no bound.
func (p *Policy) ExecutionsPerMinute() int64 {
	if p == nil || p.RateLimiting == nil || p.RateLimiting.RequestsPerMinute == nil {
		return 0
	}
	return *p.RateLimiting.RequestsPerMinute
}

// ConcurrentSessions is rate_limiting.concurrent_sessions: how many
// sessions the account may have running while one under this policy
// runs. 0 means no bound.
func (p *Policy) ConcurrentSessions() int64 {
	if p == nil || p.RateLimiting == nil || p.RateLimiting.ConcurrentSessions == nil {
		return 0
	}
	return *p.RateLimiting.ConcurrentSessions
}

// StopOnOutputCap reports output_filtering.stop_on_output_cap.
func (p *Policy) StopOnOutputCap() bool {
	return p != nil && p.OutputFiltering != nil && p.OutputFiltering.StopOnOutputCap != nil && *p.OutputFiltering.StopOnOutputCap
}

// ReadOnlyRoot reports whether the root filesystem is mounted read-only:
// filesystem.readonly, or writable_paths naming the only writable places.
func (p *Policy) ReadOnlyRoot() bool {
	if p == nil || p.Filesystem == nil {
		return false
	}
	return p.Filesystem.ReadOnly != nil && *p.Filesystem.ReadOnly || len(p.Filesystem.WritablePaths) > 0
}

// Writable reports whether a cleaned absolute path may be written under
// the policy's filesystem rules (the mount layout enforces the same).
func (p *Policy) Writable(path string) bool {
	if !p.ReadOnlyRoot() {
		return true
	}
	for _, w := range p.WritablePaths() {
		if path == w || strings.HasPrefix(path, w+"/") {
			return true
		}
	}
	return false
}

// ModuleAllowed decides an import by the user's code of a dotted module
// name: a rule about a module covers its submodules and their C-level
// twins (WithTwins).
func (p *Policy) ModuleAllowed(name string) bool {
	if covered(name, WithTwins(p.BlockedModules())) {
		return false
	}
	allow := p.AllowedImports()
	return allow == nil || covered(name, WithTwins(allow))
}

func covered(name string, list []string) bool {
	for _, m := range list {
		if name == m || strings.HasPrefix(name, m+".") {
			return true
		}
	}
	return false
}

// FixedChange returns a *FieldError naming the first rule of next that
// differs from cur but is fixed when the sandbox is created (filesystem
// rules), or nil. Memory and disk sizes change on a running sandbox
// (the engine resizes its cgroup and writable layer).
func FixedChange(cur, next *Policy) error {
	if !slices.Equal(cur.WritablePaths(), next.WritablePaths()) || cur.ReadOnlyRoot() != next.ReadOnlyRoot() {
		return bad("filesystem", "filesystem rules are fixed when the sandbox is created; create a new sandbox to change them")
	}
	return nil
}

// Loosened lists the rules next relaxes that a running interpreter cannot
// drop: the subprocess filter (seccomp filters cannot be removed), import
// rules (hooks stack and cannot be removed) and the file size limit (a
// lowered hard limit cannot be raised). Code contexts restart before their
// next execution when it is not empty. Tightening needs no restart.
func Loosened(cur, next *Policy) []string {
	var out []string
	if cur.DenySubprocess() && !next.DenySubprocess() {
		out = append(out, "access_control.allow_subprocess")
	}
	if cur.DenyImportSystem() && !next.DenyImportSystem() {
		out = append(out, "access_control.allow_import_system")
	}
	if ca, na := cur.AllowedImports(), next.AllowedImports(); ca != nil {
		if na == nil || slices.ContainsFunc(na, func(m string) bool { return !covered(m, ca) }) {
			out = append(out, "access_control.allowed_imports")
		}
	}
	if slices.ContainsFunc(cur.BlockedModules(), func(m string) bool { return !covered(m, next.BlockedModules()) }) {
		out = append(out, "access_control.blocked_modules")
	}
	if c, n := cur.FileSizeBytes(), next.FileSizeBytes(); c > 0 && (n == 0 || n > c) {
		out = append(out, "resource_limits.file_size_upload_mb")
	}
	return out
}

// Shorthand is the seeds' sandbox_config, mapped onto a Policy by Policy.
// MaxExecutionTime is not a policy rule (it is the default and longest
// execution timeout); the caller handles it.
type Shorthand struct {
	MaxExecutionTime         *float64 `json:"max_execution_time"`
	MaxMemoryMB              *int64   `json:"max_memory_mb"`
	AllowedModules           []string `json:"allowed_modules"`
	NetworkRestricted        *bool    `json:"network_restricted"`
	FilesystemReadonly       *bool    `json:"filesystem_readonly"`
	FilesystemPathsWhitelist []string `json:"filesystem_paths_whitelist"`
}

// shorthandFields names each mapped field as the caller wrote it.
var shorthandFields = map[string]string{
	"resource_limits.memory_mb":      "max_memory_mb",
	"access_control.allowed_imports": "allowed_modules",
	"filesystem.writable_paths":      "filesystem_paths_whitelist",
	"filesystem.readonly":            "filesystem_readonly",
}

// Merge returns base with the shorthand's rules added where base leaves
// them unset, validated; errors name the shorthand's fields under prefix
// ("sandbox_config").
func (s *Shorthand) Merge(base *Policy, prefix string) (*Policy, error) {
	var sp Policy
	if s.MaxMemoryMB != nil {
		sp.ResourceLimits = &ResourceLimits{MemoryMB: s.MaxMemoryMB}
	}
	if s.AllowedModules != nil {
		sp.AccessControl = &AccessControl{AllowedImports: s.AllowedModules}
	}
	if s.FilesystemReadonly != nil || s.FilesystemPathsWhitelist != nil {
		sp.Filesystem = &Filesystem{ReadOnly: s.FilesystemReadonly, WritablePaths: s.FilesystemPathsWhitelist}
	}
	if s.NetworkRestricted != nil {
		mode := NetworkNone
		if !*s.NetworkRestricted {
			mode = NetworkPublic
		}
		sp.Network = &Network{Mode: mode}
	}
	if err := sp.Validate(); err != nil {
		if fe, ok := err.(*FieldError); ok {
			field := fe.Field
			for long, short := range shorthandFields {
				if field == long || strings.HasPrefix(field, long+"[") {
					field = short + strings.TrimPrefix(field, long)
				}
			}
			return nil, &FieldError{Field: prefix + "." + field, Reason: fe.Reason}
		}
		return nil, err
	}
	out := Policy{}
	if base != nil {
		out = *base
	}
	if out.ResourceLimits == nil {
		out.ResourceLimits = sp.ResourceLimits
	} else if out.ResourceLimits.MemoryMB == nil && sp.ResourceLimits != nil {
		rl := *out.ResourceLimits
		rl.MemoryMB = sp.ResourceLimits.MemoryMB
		out.ResourceLimits = &rl
	}
	if out.AccessControl == nil {
		out.AccessControl = sp.AccessControl
	} else if out.AccessControl.AllowedImports == nil && sp.AccessControl != nil {
		ac := *out.AccessControl
		ac.AllowedImports = sp.AccessControl.AllowedImports
		out.AccessControl = &ac
	}
	if out.Filesystem == nil {
		out.Filesystem = sp.Filesystem
	}
	if out.Network == nil {
		out.Network = sp.Network
	}
	return &out, nil
}
