package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sheepfold/sheepfold/internal/testutil"
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

// TestCleanStepWithoutState: a step whose runc died while it made the
// container (a cancelled build) leaves cgroups with no state for `runc
// delete` to find; the cleanup kills what is in them and removes them,
// and the bundle. The control: `runc delete` alone leaves them.
func TestCleanStepWithoutState(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := detectCgroups(stepCgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	r := StepRunner{RuntimePath: testutil.Runc(t), Dir: t.TempDir()}
	made := func(id string) []string {
		var dirs []string
		for _, m := range c.mounts {
			d := filepath.Join(m, stepCgroupParent, id)
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, d)
		}
		return dirs
	}
	left := func(dirs []string) (n int) {
		for _, d := range dirs {
			if _, err := os.Stat(d); err == nil {
				n++
			}
		}
		return n
	}
	ctl := made("build-control")
	t.Cleanup(func() {
		_ = c.remove("build-control")
		_ = c.remove("build-nostate")
		removeStepCgroupParents()
	})
	if out, _ := exec.Command(r.RuntimePath, "--root", filepath.Join(r.Dir, "runc"), "delete", "--force", "build-control").CombinedOutput(); left(ctl) != len(ctl) {
		t.Fatalf("runc delete removed cgroups it has no state of (%s)", out)
	}
	dirs := made("build-nostate")
	bundle := filepath.Join(r.Dir, "bundles", "build-nostate")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.cleanStep(context.Background(), "build-nostate", bundle); err != nil {
		t.Fatal(err)
	}
	if n := left(dirs); n > 0 {
		t.Errorf("%d of the step's %d cgroups left", n, len(dirs))
	}
	if _, err := os.Stat(bundle); err == nil {
		t.Error("the bundle is left")
	}
}
