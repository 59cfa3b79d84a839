package oci

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

func testSpec(t *testing.T, s runtime.Spec) *specs.Spec {
	t.Helper()
	spec, err := buildSpec(specInput{
		Spec: s, RootFS: "/state/b/rootfs", AgentBin: "/opt/agent", CgroupDir: "/sheepfold/server/" + s.ID, Userns: "/proc/42/ns/user",
	})
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestSpecConfinement(t *testing.T) {
	spec := testSpec(t, runtime.Spec{ID: "abc", Env: []string{"FOO=bar"},
		Limits: runtime.Limits{MemoryBytes: 256 << 20, CPUs: 1.5, Pids: 64, DiskBytes: 1 << 30}})
	p := spec.Process
	if p.User.UID != 0 || p.User.GID != 0 || len(p.User.AdditionalGids) != 0 || !p.NoNewPrivileges {
		t.Errorf("process runs as %+v, no_new_privs %v", p.User, p.NoNewPrivileges)
	}
	// The agent is root inside with exactly these capabilities; nothing
	// is inheritable or ambient, so a process that leaves uid 0 has none.
	want := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"}
	c := p.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if got := slices.Sorted(slices.Values(set)); !slices.Equal(got, want) {
			t.Errorf("%s capabilities: %v, want %v", name, got, want)
		}
	}
	for name, set := range map[string][]string{"inheritable": c.Inheritable, "ambient": c.Ambient} {
		if len(set) != 0 {
			t.Errorf("%s capabilities: %v", name, set)
		}
	}
	// Every namespace is new but the user namespace, which the engine
	// made with the sandbox's own ids; its limits shut out more
	// namespaces.
	var ns []specs.LinuxNamespaceType
	for _, n := range spec.Linux.Namespaces {
		if want := map[specs.LinuxNamespaceType]string{specs.UserNamespace: "/proc/42/ns/user"}[n.Type]; n.Path != want {
			t.Errorf("namespace %s joins %q, want %q", n.Type, n.Path, want)
		}
		ns = append(ns, n.Type)
	}
	if len(spec.Linux.UIDMappings)+len(spec.Linux.GIDMappings) != 0 {
		t.Errorf("mappings %v %v given with a user namespace to join", spec.Linux.UIDMappings, spec.Linux.GIDMappings)
	}
	for _, k := range []string{"user.max_user_namespaces", "user.max_mnt_namespaces", "user.max_net_namespaces"} {
		if spec.Linux.Sysctl[k] != "0" {
			t.Errorf("sysctl %s = %q, want 0", k, spec.Linux.Sysctl[k])
		}
	}
	if spec.Linux.Sysctl["user.max_inotify_instances"] == "" {
		t.Errorf("no inotify limit in %v", spec.Linux.Sysctl)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.UserNamespace, specs.NetworkNamespace, specs.PIDNamespace,
		specs.MountNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.CgroupNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no %s namespace", want)
		}
	}
	for _, path := range []string{"/proc/kcore", "/proc/keys", "/proc/kallsyms", "/proc/timer_list", "/sys/firmware"} {
		if !slices.Contains(spec.Linux.MaskedPaths, path) {
			t.Errorf("%s is not masked", path)
		}
	}
	for _, path := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} {
		if !slices.Contains(spec.Linux.ReadonlyPaths, path) {
			t.Errorf("%s is not read-only", path)
		}
	}
	r := spec.Linux.Resources
	if *r.Memory.Limit != 256<<20 || *r.Memory.Swap != 256<<20 || *r.Pids.Limit != 64+AgentPids || *r.CPU.Quota != 150000 {
		t.Errorf("resources %+v %+v %+v", r.Memory, r.Pids, r.CPU)
	}
	// The sandbox's cgroup keeps AgentPids for the agent; the tenant's
	// limit is on the cgroup passed to init (makeTenant).
	if !slices.Equal(p.Args[len(p.Args)-1:], []string{"--pids-cgroup-fd=4"}) {
		t.Errorf("init's arguments %v do not pass the pids cgroup", p.Args)
	}
	if args := testSpec(t, runtime.Spec{ID: "abc"}).Process.Args; slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--pids-cgroup-fd") }) {
		t.Errorf("a sandbox without a pids limit: init's arguments %v", args)
	}
	// A template's USER and WORKDIR: serve's defaults, which init passes on.
	if args := testSpec(t, runtime.Spec{ID: "abc", User: "nobody", WorkDir: "/srv/x"}).Process.Args; !slices.Equal(args[len(args)-4:], []string{"--user", "nobody", "--workdir", "/srv/x"}) {
		t.Errorf("a template's USER and WORKDIR: init's arguments %v", args)
	}
	if slices.Contains(p.Args, "--user") || slices.Contains(p.Args, "--workdir") {
		t.Errorf("no USER nor WORKDIR: init's arguments %v", p.Args)
	}
	if !slices.Contains(p.Env, "FOO=bar") || !slices.Contains(p.Env, "HOME=/home/user") {
		t.Errorf("env %v", p.Env)
	}
	for _, m := range spec.Mounts {
		if m.Type == "bind" && (m.Source != "/opt/agent" || !slices.Contains(m.Options, "ro")) {
			t.Errorf("bind mount of a host path other than the read-only agent: %+v", m)
		}
	}
	if spec.Root.Readonly {
		t.Error("root is read-only without ReadOnly")
	}
	if spec := testSpec(t, runtime.Spec{ID: "ro", ReadOnly: true}); !spec.Root.Readonly {
		t.Error("ReadOnly did not make the root read-only")
	}
}

func TestSeccompDeniesDangerousSyscalls(t *testing.T) {
	sc := testSpec(t, runtime.Spec{ID: "abc"}).Linux.Seccomp
	if sc.DefaultAction != specs.ActErrno {
		t.Fatalf("default action %s, want an errno allowlist", sc.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && len(r.Args) == 0 {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	for _, n := range []string{"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "unshare",
		"setns", "bpf", "perf_event_open", "keyctl", "add_key", "init_module", "finit_module", "delete_module",
		"io_uring_setup", "io_uring_enter", "open_by_handle_at", "userfaultfd", "kexec_load", "reboot", "pivot_root"} {
		if allowed[n] {
			t.Errorf("%s is allowed", n)
		}
	}
	if !allowed["read"] || !allowed["execve"] {
		t.Error("the profile does not allow ordinary syscalls; the test reads it wrong")
	}
	// socket is allowed only for some families: never AF_VSOCK (40).
	for _, r := range sc.Syscalls {
		if slices.Contains(r.Names, "socket") && r.Action == specs.ActAllow {
			if len(r.Args) == 0 {
				t.Fatal("socket allowed for every family")
			}
			a := r.Args[0]
			if (a.Op == specs.OpEqualTo && a.Value == 40) || (a.Op == specs.OpLessThan && a.Value > 40) {
				t.Errorf("socket rule %+v allows AF_VSOCK", a)
			}
		}
	}
}

// TestSeccompUnshareOnlyOwnWorkdir: unshare is allowed by one rule only,
// for flags equal to CLONE_FS (no namespace), never by name alone.
func TestSeccompUnshareOnlyOwnWorkdir(t *testing.T) {
	sc := testSpec(t, runtime.Spec{ID: "abc"}).Linux.Seccomp
	var rules []specs.LinuxSyscall
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && slices.Contains(r.Names, "unshare") {
			rules = append(rules, r)
		}
	}
	want := []specs.LinuxSeccompArg{{Index: 0, Value: 0x200, Op: specs.OpEqualTo}}
	if len(rules) != 1 || len(rules[0].Names) != 1 || !slices.Equal(rules[0].Args, want) {
		t.Fatalf("unshare allowed by %+v, want one rule with args %+v", rules, want)
	}
}

// TestAgentCapabilitiesOpenNoSyscalls: Docker's profile allows some system
// calls only to holders of some capabilities (mount to CAP_SYS_ADMIN,
// ptrace to CAP_SYS_PTRACE...). The agent's capabilities must open none.
func TestAgentCapabilitiesOpenNoSyscalls(t *testing.T) {
	profile := func(caps []string) string {
		sc, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(sc)
		return string(b)
	}
	if profile(AgentCapabilities) != profile(nil) {
		t.Error("the agent's capabilities change the seccomp profile")
	}
	if profile([]string{"CAP_SYS_ADMIN"}) == profile(nil) {
		t.Error("CAP_SYS_ADMIN does not change the profile either: the test reads it wrong")
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{"abc": true, "a-1": true, "": false, "-a": false, "A": false,
		"a/b": false, "..": false, "a b": false, "0123456789012345678901234567890123456789x": false} {
		if validID(id) != want {
			t.Errorf("validID(%q) = %v", id, !want)
		}
	}
}
