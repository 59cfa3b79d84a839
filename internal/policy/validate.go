package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"reflect"
	"strings"
)

// FieldError reports a policy field that is unknown, of the wrong type or
// out of range. Field is its dotted JSON path ("access_control.allowed_imports[2]").
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "security policy: " + e.Reason
	}
	return fmt.Sprintf("security policy field %s: %s", e.Field, e.Reason)
}

func bad(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Bounds of the numeric fields.
const (
	MaxCPUTimeSeconds = 86400
	MinMemoryMB       = 32
	MaxMemoryMB       = 1 << 20
	MaxDiskMB         = 1 << 20
	MaxNetworkReqs    = 1 << 30
	MaxOutputLength   = 1 << 30
	MaxRequestsPerMin = 1 << 20
	MaxConcurrent     = 1 << 16
	MaxModules        = 1024
	MaxWritablePaths  = 16
	MaxAllowEntries   = 1024
)

// Parse decodes a policy strictly (unknown fields and wrong types are
// errors naming the field) and validates it. An empty body or JSON null
// is no policy (nil, nil).
func Parse(data []byte) (*Policy, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || string(data) == "null" {
		return nil, nil
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return nil, bad("", "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("", "malformed JSON: unexpected data after the object")
	}
	if err := checkShape(generic, reflect.TypeOf(Policy{}), ""); err != nil {
		return nil, err
	}
	var p Policy
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, bad("", "%v", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// checkShape walks decoded JSON against the Go type, so that an unknown
// field or a wrong type is reported with its full path.
func checkShape(v any, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return nil // null leaves a field unset
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return bad(at, "must be an object, not %s", jsonKind(v))
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
		for k, sub := range obj {
			ft, ok := fields[k]
			if !ok {
				return bad(join(at, k), "unknown field")
			}
			if err := checkShape(sub, ft, join(at, k)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			return bad(at, "must be an array, not %s", jsonKind(v))
		}
		for i, e := range arr {
			if err := checkShape(e, t.Elem(), fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			return bad(at, "must be a string, not %s", jsonKind(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return bad(at, "must be true or false, not %s", jsonKind(v))
		}
	case reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			return bad(at, "must be an integer, not %s", jsonKind(v))
		}
		if _, err := n.Int64(); err != nil {
			return bad(at, "must be an integer, not %s", n)
		}
	case reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			return bad(at, "must be a number, not %s", jsonKind(v))
		}
		if _, err := n.Float64(); err != nil {
			return bad(at, "must be a number, not %s", n)
		}
	}
	return nil
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	}
	return "null"
}

// Validate checks every field's range. Parse calls it; call it on a
// Policy built in Go.
func (p *Policy) Validate() error {
	if p == nil {
		return nil
	}
	if r := p.ResourceLimits; r != nil {
		if v := r.CPUTimeSeconds; v != nil && (math.IsNaN(*v) || *v <= 0 || *v > MaxCPUTimeSeconds) {
			return bad("resource_limits.cpu_time_seconds", "must be more than 0 and at most %d", MaxCPUTimeSeconds)
		}
		if err := intRange("resource_limits.memory_mb", r.MemoryMB, MinMemoryMB, MaxMemoryMB); err != nil {
			return err
		}
		if err := intRange("resource_limits.disk_write_mb", r.DiskWriteMB, 1, MaxDiskMB); err != nil {
			return err
		}
		if err := intRange("resource_limits.network_requests", r.NetworkRequests, 0, MaxNetworkReqs); err != nil {
			return err
		}
		if err := intRange("resource_limits.file_size_upload_mb", r.FileSizeUploadMB, 1, MaxDiskMB); err != nil {
			return err
		}
	}
	if a := p.AccessControl; a != nil {
		if err := modules("access_control.allowed_imports", a.AllowedImports); err != nil {
			return err
		}
		if err := modules("access_control.blocked_modules", a.BlockedModules); err != nil {
			return err
		}
	}
	if f := p.Filesystem; f != nil {
		if len(f.WritablePaths) > MaxWritablePaths {
			return bad("filesystem.writable_paths", "at most %d paths", MaxWritablePaths)
		}
		seen := map[string]bool{}
		for i, wp := range f.WritablePaths {
			field := fmt.Sprintf("filesystem.writable_paths[%d]", i)
			clean, err := writablePath(wp)
			if err != nil {
				return bad(field, "%v", err)
			}
			if seen[clean] {
				return bad(field, "%q is listed twice", wp)
			}
			seen[clean] = true
		}
	}
	if n := p.Network; n != nil {
		switch n.Mode {
		case "", NetworkNone, NetworkAllowlist, NetworkPublic:
		default:
			return bad("network.mode", "must be none, allowlist or public, not %q", n.Mode)
		}
		if len(n.Allow) > MaxAllowEntries {
			return bad("network.allow", "at most %d entries", MaxAllowEntries)
		}
		for i, e := range n.Allow {
			if strings.TrimSpace(e) == "" || len(e) > 300 {
				return bad(fmt.Sprintf("network.allow[%d]", i), "must be a host name, *.domain, host:port or CIDR")
			}
		}
		if _, err := compileRules(n); err != nil {
			return err
		}
	}
	if o := p.OutputFiltering; o != nil {
		if err := intRange("output_filtering.max_output_length", o.MaxOutputLength, 1, MaxOutputLength); err != nil {
			return err
		}
	}
	if r := p.RateLimiting; r != nil {
		if err := intRange("rate_limiting.requests_per_minute", r.RequestsPerMinute, 1, MaxRequestsPerMin); err != nil {
			return err
		}
		if err := intRange("rate_limiting.concurrent_sessions", r.ConcurrentSessions, 1, MaxConcurrent); err != nil {
			return err
		}
	}
	switch p.OnViolation {
	case "", "report", "terminate":
	default:
		return bad("on_violation", "must be report or terminate, not %q", p.OnViolation)
	}
	return nil
}

func intRange(field string, v *int64, lo, hi int64) error {
	if v != nil && (*v < lo || *v > hi) {
		return bad(field, "must be between %d and %d", lo, hi)
	}
	return nil
}

// modules checks a list of dotted module names.
func modules(field string, names []string) error {
	if len(names) > MaxModules {
		return bad(field, "at most %d modules", MaxModules)
	}
	for i, n := range names {
		if !ModuleName(n) {
			return bad(fmt.Sprintf("%s[%d]", field, i), "%q is not a module name", n)
		}
	}
	return nil
}

// ModuleName reports whether s is a dotted Python module name.
func ModuleName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i, r := range part {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
				return false
			}
		}
	}
	return true
}

// reservedDirs may not be made writable: the kernel's and the runtime's
// own mounts live there.
var reservedDirs = []string{"/proc", "/sys", "/dev", "/.sheepfold"}

// writablePath checks one writable path and returns it cleaned.
func writablePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%q is not an absolute path", p)
	}
	if len(p) > 256 || strings.ContainsAny(p, "\x00,:") {
		return "", fmt.Errorf("%q is not an allowed path", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." || part == "." {
			return "", fmt.Errorf("%q must not contain . or .. components", p)
		}
	}
	clean := path.Clean(p)
	if clean == "/" {
		return "", fmt.Errorf("%q would make the whole root writable; leave filesystem.writable_paths out instead", p)
	}
	for _, r := range reservedDirs {
		if clean == r || strings.HasPrefix(clean, r+"/") {
			return "", fmt.Errorf("%q is under %s, which cannot be made writable", p, r)
		}
	}
	return clean, nil
}

// WritablePaths returns the cleaned writable paths, or nil when the
// policy leaves the whole root writable.
func (p *Policy) WritablePaths() []string {
	if p == nil || p.Filesystem == nil {
		return nil
	}
	var out []string
	for _, wp := range p.Filesystem.WritablePaths {
		if c, err := writablePath(wp); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// ParseShorthand decodes the seeds' sandbox_config strictly; errors name
// the field under prefix.
func ParseShorthand(data []byte, prefix string) (*Shorthand, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || string(data) == "null" {
		return nil, nil
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return nil, bad(prefix, "malformed JSON: %v", err)
	}
	if err := checkShape(generic, reflect.TypeOf(Shorthand{}), prefix); err != nil {
		return nil, err
	}
	var s Shorthand
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, bad(prefix, "%v", err)
	}
	return &s, nil
}
