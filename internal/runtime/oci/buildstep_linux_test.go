package oci

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestStepSpec: a build step runs in its own network (and every other)
// namespace, under the template's ids, with root's capabilities at most
// (none for another user), no_new_privs and the sandboxes' seccomp
// profile.
func TestStepSpec(t *testing.T) {
	for _, uid := range []uint32{0, 1000} {
		s, err := stepSpec(Step{RootFS: "/r", Args: []string{"true"}, UID: uid, GID: uid, HostID: 1_000_000}, "build-x")
		if err != nil {
			t.Fatal(err)
		}
		var ns []specs.LinuxNamespaceType
		for _, n := range s.Linux.Namespaces {
			if n.Path != "" {
				t.Errorf("namespace %s joins %s", n.Type, n.Path)
			}
			ns = append(ns, n.Type)
		}
		for _, want := range []specs.LinuxNamespaceType{specs.NetworkNamespace, specs.UserNamespace, specs.PIDNamespace, specs.MountNamespace} {
			if !slices.Contains(ns, want) {
				t.Errorf("uid %d: no %s namespace", uid, want)
			}
		}
		if m := s.Linux.UIDMappings; len(m) != 1 || m[0].ContainerID != 0 || m[0].HostID != 1_000_000 || m[0].Size != 65536 {
			t.Errorf("uid map %+v", m)
		}
		c := s.Process.Capabilities
		want := RootCapabilities
		if uid != 0 {
			want = []string{}
		}
		if !slices.Equal(c.Bounding, want) || !slices.Equal(c.Effective, want) || len(c.Ambient) != 0 || len(c.Inheritable) != 0 {
			t.Errorf("uid %d: capabilities %+v", uid, c)
		}
		if !s.Process.NoNewPrivileges || s.Linux.Seccomp == nil || s.Linux.Sysctl["user.max_user_namespaces"] != "0" {
			t.Errorf("uid %d: no_new_privs %v, seccomp %v, sysctl %v", uid, s.Process.NoNewPrivileges, s.Linux.Seccomp != nil, s.Linux.Sysctl)
		}
	}
}
