package oci

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	cg "github.com/opencontainers/cgroups"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestTenantFiles lays out the tenant's cgroup on copies of a v2 and a v1
// tree (the kernel's files emulated: cgroups.TestMode creates them) and
// checks what makeTenant writes and gives the agent, and that Usage then
// counts the tenant's tasks. The kernel's side, on this host's layout, is
// TestForkBombSparesTheAgent (internal/sandbox).
func TestTenantFiles(t *testing.T) {
	testutil.RequireRoot(t) // chown
	cg.TestMode = true
	t.Cleanup(func() { cg.TestMode = false })
	const owner = 123456
	for _, tc := range []struct {
		name  string
		v2    bool
		dir   string   // the sandbox's pids cgroup under the tree
		want  []string // file=content
		given []string // chowned to the agent
	}{
		{"v2", true, "p/sb", []string{"tenant/cgroup.type=threaded", "cgroup.subtree_control=+pids", "tenant/pids.max=64"},
			[]string{"tenant/cgroup.threads", "cgroup.procs"}},
		{"v1", false, "pids/p/sb", []string{"tenant/pids.max=64"}, []string{"tenant/tasks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			c := &cgroups{v2: tc.v2, mounts: []string{root}, parent: "p"}
			if !tc.v2 {
				c.mounts = []string{filepath.Join(root, "pids"), filepath.Join(root, "memory")}
			}
			f, err := c.openPids("sb")
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			d := filepath.Join(root, tc.dir)
			// Files the kernel makes with each cgroup.
			kernelFiles := map[string]string{"cgroup.procs": "", "cgroup.threads": "", "tasks": "", "pids.current": "9\n", "pids.events": "max 0\n"}
			testutil.WriteTree(t, d, kernelFiles)
			orig := mkCgroup
			t.Cleanup(func() { mkCgroup = orig })
			mkCgroup = func(dir string) error {
				if err := os.Mkdir(dir, 0o755); err != nil {
					return err
				}
				testutil.WriteTree(t, dir, kernelFiles)
				return nil
			}
			if err := c.makeTenant("sb", 64, owner); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				name, content, _ := strings.Cut(w, "=")
				if b, err := os.ReadFile(filepath.Join(d, name)); err != nil || string(b) != content {
					t.Errorf("%s = %q %v, want %q", name, b, err, content)
				}
			}
			for _, name := range tc.given {
				var st syscall.Stat_t
				if err := syscall.Stat(filepath.Join(d, name), &st); err != nil || st.Uid != owner {
					t.Errorf("%s is not the agent's (%d): uid %d %v", name, owner, st.Uid, err)
				}
			}
			if err := c.makeTenant("sb", 64, owner); err == nil {
				t.Error("a second tenant cgroup was made over the first")
			}
			testutil.WriteTree(t, filepath.Join(d, "tenant"), map[string]string{"pids.current": "7\n", "pids.events": "max 3\n"})
			if n, denied := tenantPids(d); n != 7 || denied != 3 {
				t.Errorf("tenantPids = %d, %d; want the tenant's 7, 3", n, denied)
			}
			if err := os.RemoveAll(filepath.Join(d, "tenant")); err != nil {
				t.Fatal(err)
			}
			if n, _ := tenantPids(d); n != 9 {
				t.Errorf("tenantPids without a tenant = %d, want the sandbox's 9", n)
			}
		})
	}
	c := &cgroups{mounts: []string{filepath.Join(t.TempDir(), "memory")}, parent: "p"}
	if _, err := c.openPids("sb"); err == nil {
		t.Error("a host without a pids hierarchy: openPids made nothing and did not fail")
	}
}
