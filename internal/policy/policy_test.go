package policy

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
)

func TestParse(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`{"resource_limits":{"cpu_time_seconds":1.5,"memory_mb":256},
		"access_control":{"allow_subprocess":false,"blocked_modules":["os"]},
		"filesystem":{"writable_paths":["/tmp/sandbox/"]},"on_violation":"report"}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUTime().Milliseconds() != 1500 || p.MemoryBytes() != 256<<20 || !p.DenySubprocess() ||
		!p.ReadOnlyRoot() || !slices.Equal(p.WritablePaths(), []string{"/tmp/sandbox"}) {
		t.Fatalf("%+v", p)
	}
	if p, err := Parse([]byte(" null ")); p != nil || err != nil {
		t.Fatalf("null: %v %v", p, err)
	}
	for _, tc := range []struct{ in, field string }{
		{`{"x":1}`, "x"},
		{`{"network":{"mode":"none","alow":[]}}`, "network.alow"},
		{`{"access_control":{"allowed_imports":"json"}}`, "access_control.allowed_imports"},
		{`{"access_control":{"allowed_imports":["json",3]}}`, "access_control.allowed_imports[1]"},
		{`{"resource_limits":{"memory_mb":1e3}}`, "resource_limits.memory_mb"},
		{`{"resource_limits":{"cpu_time_seconds":-1}}`, "resource_limits.cpu_time_seconds"},
		{`{"filesystem":{"writable_paths":["/a","/a/"]}}`, "filesystem.writable_paths[1]"},
		{`[]`, ""},
		{`{} {}`, ""},
	} {
		_, err := Parse([]byte(tc.in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a FieldError for %q", tc.in, err, tc.field)
		}
	}
}

func TestLoosenedAndFixed(t *testing.T) {
	t.Parallel()
	f, tr := false, true
	base := &Policy{AccessControl: &AccessControl{AllowSubprocess: &f, AllowedImports: []string{"json", "math"}, BlockedModules: []string{"os"}}}
	tighter := &Policy{AccessControl: &AccessControl{AllowSubprocess: &f, AllowedImports: []string{"json"}, BlockedModules: []string{"os", "socket"}}}
	if l := Loosened(base, tighter); len(l) != 0 {
		t.Fatalf("tightening loosened %v", l)
	}
	for _, tc := range []struct {
		next *Policy
		want string
	}{
		{&Policy{AccessControl: &AccessControl{AllowSubprocess: &tr, AllowedImports: []string{"json"}, BlockedModules: []string{"os"}}}, "access_control.allow_subprocess"},
		{&Policy{AccessControl: &AccessControl{AllowSubprocess: &f, AllowedImports: []string{"json", "csv"}, BlockedModules: []string{"os"}}}, "access_control.allowed_imports"},
		{&Policy{AccessControl: &AccessControl{AllowSubprocess: &f, BlockedModules: []string{"os"}}}, "access_control.allowed_imports"},
		{&Policy{AccessControl: &AccessControl{AllowSubprocess: &f, AllowedImports: []string{"json"}, BlockedModules: []string{"os.path"}}}, "access_control.blocked_modules"},
	} {
		if l := Loosened(base, tc.next); !slices.Contains(l, tc.want) {
			t.Errorf("%+v: loosened %v, want %s", tc.next.AccessControl, l, tc.want)
		}
	}
	fs := &Policy{Filesystem: &Filesystem{WritablePaths: []string{"/tmp/x"}}}
	if err := FixedChange(fs, &Policy{}); err == nil || !strings.Contains(err.Error(), "filesystem") {
		t.Fatalf("filesystem change: %v", err)
	}
	if err := FixedChange(fs, &Policy{Filesystem: &Filesystem{WritablePaths: []string{"/tmp/x/"}}}); err != nil {
		t.Fatalf("the same paths: %v", err)
	}
}

func TestShorthand(t *testing.T) {
	t.Parallel()
	s, err := ParseShorthand([]byte(`{"max_memory_mb":128,"allowed_modules":["json"],"network_restricted":true,"filesystem_paths_whitelist":["/work"]}`), "sandbox_config")
	if err != nil {
		t.Fatal(err)
	}
	mem := int64(512)
	p, err := s.Merge(&Policy{ResourceLimits: &ResourceLimits{MemoryMB: &mem}}, "sandbox_config")
	if err != nil {
		t.Fatal(err)
	}
	if p.MemoryBytes() != 512<<20 || !slices.Equal(p.AllowedImports(), []string{"json"}) || p.NetworkMode() != NetworkNone || !p.Writable("/work/a") || p.Writable("/etc") {
		t.Fatalf("security_policy wins, the rest is mapped: %+v", p)
	}
	s, _ = ParseShorthand([]byte(`{"network_restricted":false}`), "sandbox_config")
	if p, err := s.Merge(nil, "sandbox_config"); err != nil || p.NetworkMode() != NetworkPublic {
		t.Fatalf("network_restricted false is network.mode public: %v %v", p, err)
	}
	s, _ = ParseShorthand([]byte(`{"max_memory_mb":4}`), "sandbox_config")
	if _, err := s.Merge(nil, "sandbox_config"); err == nil || !strings.Contains(err.Error(), "sandbox_config.max_memory_mb") {
		t.Fatalf("names the shorthand's field: %v", err)
	}
}

func TestModuleAllowed(t *testing.T) {
	t.Parallel()
	p := &Policy{AccessControl: &AccessControl{AllowedImports: []string{"xml"}, BlockedModules: []string{"xml.sax"}}}
	for name, want := range map[string]bool{"xml": true, "xml.dom": true, "xml.sax": false, "xml.sax.handler": false, "xmlrpc": false, "os": false} {
		if got := p.ModuleAllowed(name); got != want {
			t.Errorf("%s: %v", name, got)
		}
	}
	// A rule about a public module covers the C modules that stand for it.
	p = &Policy{AccessControl: &AccessControl{BlockedModules: []string{"os", "socket", "subprocess", "ctypes"}}}
	for name, want := range map[string]bool{"posix": false, "posixpath": false, "_socket": false, "_posixsubprocess": false,
		"_ctypes": false, "nt": false, "json": true, "_json": true, "posixfoo": true} {
		if got := p.ModuleAllowed(name); got != want {
			t.Errorf("blocked os, socket, subprocess, ctypes: %s: %v", name, got)
		}
	}
	p = &Policy{AccessControl: &AccessControl{AllowedImports: []string{"os", "json"}, BlockedModules: []string{"_json"}}}
	for name, want := range map[string]bool{"posix": true, "posixpath": true, "_json": false, "json": true, "_socket": false} {
		if got := p.ModuleAllowed(name); got != want {
			t.Errorf("allowed os, json, blocked _json: %s: %v", name, got)
		}
	}
}

func TestWithTwins(t *testing.T) {
	t.Parallel()
	if got := WithTwins(nil); got != nil {
		t.Fatalf("nil: %v", got)
	}
	got := WithTwins([]string{"socket", "os", "mylib"})
	want := []string{"genericpath", "mylib", "nt", "ntpath", "os", "posix", "posixpath", "socket", "_socket"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := WithTwins([]string{"os.path"}); !slices.Equal(got, []string{"genericpath", "ntpath", "os.path", "posixpath"}) {
		t.Fatalf("os.path: %v", got)
	}
}

// TestNoSubprocessFilter runs the filter in the BPF interpreter of x/net
// over the seccomp_data of each case.
func TestNoSubprocessFilter(t *testing.T) {
	t.Parallel()
	if _, _, err := NoSubprocessFilter("mips"); err == nil {
		t.Fatal("an unknown architecture must fail")
	}
	for arch, a := range seccompArches {
		prog, nr, err := NoSubprocessFilter(arch)
		if err != nil || nr != a.seccomp || len(prog)%8 != 0 {
			t.Fatalf("%s: %v", arch, err)
		}
		var raw []bpf.RawInstruction
		for i := 0; i < len(prog); i += 8 {
			raw = append(raw, bpf.RawInstruction{Op: binary.LittleEndian.Uint16(prog[i:]), Jt: prog[i+2], Jf: prog[i+3],
				K: binary.LittleEndian.Uint32(prog[i+4:])})
		}
		ins, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatalf("%s: does not disassemble", arch)
		}
		vm, err := bpf.NewVM(ins)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		data := func(audit uint32, nr int, arg0 uint32) []byte {
			b := make([]byte, 64)
			binary.BigEndian.PutUint32(b[0:], uint32(nr)) // x/net's VM loads big-endian words
			binary.BigEndian.PutUint32(b[4:], audit)
			binary.BigEndian.PutUint32(b[16:], arg0)
			return b
		}
		cases := []struct {
			name  string
			audit uint32
			nr    int
			arg0  uint32
			want  uint32
		}{
			{"read", a.audit, 0, 0, seccompRetAllow},
			{"execve", a.audit, a.execve, 0, seccompRetNotify},
			{"execveat", a.audit, a.execveat, 0, seccompRetNotify},
			{"clone a thread", a.audit, a.clone, cloneThread | 0x100, seccompRetAllow},
			{"clone a process", a.audit, a.clone, 17, seccompRetNotify},
			{"clone3", a.audit, a.clone3, 0, seccompRetErrno | errnoENOSYS},
			{"another arch", 0x40000003, 11, 0, seccompRetNotify},
		}
		if a.fork >= 0 {
			cases = append(cases, struct {
				name  string
				audit uint32
				nr    int
				arg0  uint32
				want  uint32
			}{"fork", a.audit, a.fork, 0, seccompRetNotify})
		}
		if a.x32 {
			cases = append(cases, struct {
				name  string
				audit uint32
				nr    int
				arg0  uint32
				want  uint32
			}{"x32", a.audit, x32SyscallBit | 59, 0, seccompRetNotify})
		}
		for _, c := range cases {
			// The VM reads words big-endian; seccomp_data is native
			// (little-endian), so the filter's 32-bit loads see the
			// values as stored below.
			got, err := vm.Run(data(c.audit, c.nr, c.arg0))
			if err != nil {
				t.Fatalf("%s %s: %v", arch, c.name, err)
			}
			if uint32(got) != c.want {
				t.Errorf("%s %s: %#x, want %#x", arch, c.name, got, c.want)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{}`, `{"resource_limits":{"cpu_time_seconds":1}}`, `{"access_control":{"allowed_imports":["a.b"]}}`,
		`{"filesystem":{"writable_paths":["/tmp/x"]}}`, `{"network":{"mode":"allowlist","allow":["*.example.com:443"]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("not a FieldError: %v", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed but invalid: %v", err)
		}
		for _, w := range p.WritablePaths() {
			if !strings.HasPrefix(w, "/") || strings.Contains(w, "..") || w == "/" {
				t.Fatalf("writable path %q", w)
			}
		}
	})
}

// TestMerge: a section given replaces the current one whole, a section
// left out keeps its rules, an empty one clears them.
func TestMerge(t *testing.T) {
	t.Parallel()
	f, tr := false, true
	n := func(v int64) *int64 { return &v }
	cur := &Policy{
		ResourceLimits: &ResourceLimits{MemoryMB: n(512), CPUTimeSeconds: new(float64)},
		AccessControl:  &AccessControl{AllowedImports: []string{"json"}},
		Filesystem:     &Filesystem{ReadOnly: &f, WritablePaths: []string{"/tmp/sandbox"}},
		Network:        &Network{Mode: NetworkNone},
		OnViolation:    "terminate",
	}
	next := &Policy{
		ResourceLimits:  &ResourceLimits{MemoryMB: n(256)},
		AccessControl:   &AccessControl{},
		RateLimiting:    &RateLimiting{ConcurrentSessions: n(5)},
		OutputFiltering: &OutputFiltering{StopOnOutputCap: &tr},
	}
	got := Merge(cur, next)
	if got.ResourceLimits.MemoryMB == nil || *got.ResourceLimits.MemoryMB != 256 || got.ResourceLimits.CPUTimeSeconds != nil {
		t.Errorf("resource_limits not replaced whole: %+v", got.ResourceLimits)
	}
	if got.AccessControl != nil {
		t.Errorf("an empty access_control did not clear it: %+v", got.AccessControl)
	}
	if got.Filesystem != cur.Filesystem || got.Network != cur.Network || got.OnViolation != "terminate" {
		t.Errorf("sections left out changed: %+v", got)
	}
	if got.ConcurrentSessions() != 5 || !got.StopOnOutputCap() {
		t.Errorf("new sections: %+v", got)
	}
	if FixedChange(cur, got) != nil {
		t.Errorf("a policy without a filesystem section changed the filesystem rules")
	}
	if cur.ResourceLimits.MemoryMB == nil || *cur.ResourceLimits.MemoryMB != 512 || cur.AccessControl == nil {
		t.Errorf("Merge changed its input: %+v", cur)
	}
	if Merge(nil, nil) == nil {
		t.Error("Merge(nil, nil) is nil")
	}
	// Memory and disk are no longer fixed at create.
	if err := FixedChange(&Policy{ResourceLimits: &ResourceLimits{MemoryMB: n(512)}}, &Policy{ResourceLimits: &ResourceLimits{MemoryMB: n(256), DiskWriteMB: n(50)}}); err != nil {
		t.Errorf("memory and disk: %v", err)
	}
}

// TestSeedPolicy: seed 002's "recommended" policy, verbatim, is valid,
// and each field is read as its name says.
func TestSeedPolicy(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(seedPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUTime().Seconds() != 10 || p.MemoryBytes() != 256<<20 || p.DiskBytes() != 50<<20 || p.NetworkRequests() != 5 ||
		p.FileSizeBytes() != 10<<20 || p.ExecutionsPerMinute() != 60 || p.ConcurrentSessions() != 5 || !p.DenySubprocess() ||
		!p.DenyImportSystem() || len(p.AllowedImports()) != 8 || !slices.Contains(p.BlockedModules(), "urllib") || p.StopOnOutputCap() {
		t.Fatalf("%+v", p)
	}
	if _, err := Parse([]byte(`{"rate_limiting":{"concurrent_sessions":0}}`)); err == nil || !strings.Contains(err.Error(), "rate_limiting.concurrent_sessions") {
		t.Fatalf("concurrent_sessions 0: %v", err)
	}
}

// seedPolicy is seed 002's security_policy, as the article writes it.
const seedPolicy = `{
    "resource_limits": {
        "cpu_time_seconds": 10,
        "memory_mb": 256,
        "disk_write_mb": 50,
        "network_requests": 5,
        "file_size_upload_mb": 10
    },
    "access_control": {
        "allow_subprocess": false,
        "allow_import_system": false,
        "allowed_imports": [
            "json", "math", "random", "datetime", 
            "re", "collections", "itertools", "functools"
        ],
        "blocked_modules": [
            "os", "sys", "subprocess", "socket",
            "urllib", "requests", "ctypes", "sqlite3"
        ]
    },
    "output_filtering": {
        "max_output_length": 10000,
        "strip_sensitive_data": true,
        "sanitize_errors": true
    },
    "rate_limiting": {
        "requests_per_minute": 60,
        "concurrent_sessions": 5
    }
}`
