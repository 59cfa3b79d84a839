package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStartInTenant: with a tenant cgroup, StartIn writes the id of the
// thread that then runs start (the thread that forks) into the tenant's
// move file: cgroup v2's cgroup.threads where there is one, else v1's
// tasks; without the tenant's cgroup nothing starts. The directories here
// stand in for cgroupfs; the kernel's side is TestForkBombSparesTheAgent
// (internal/sandbox).
func TestStartInTenant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		into  string // "": nothing starts
	}{
		{"v2", []string{"cgroup.threads", "cgroup.procs"}, "cgroup.threads"},
		{"v1", []string{"tasks"}, "tasks"},
		{"no_tenant", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.files != nil {
				if err := os.Mkdir(filepath.Join(dir, "tenant"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, "tenant", f), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tenantCgroup.Store(-1); unix.Close(fd) })
			if err := UseTenantCgroup(fd); err != nil {
				t.Fatal(err)
			}
			if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
				t.Error("the cgroup's descriptor would pass to the processes the agent starts")
			}
			tid, started := 0, false
			err = StartIn(nil, "", func() error {
				tid, started = unix.Gettid(), true
				return nil
			})
			if tc.into == "" {
				if !errors.Is(err, errNoTenantCgroup) || started {
					t.Fatalf("without the tenant's cgroup: started %v, %v", started, err)
				}
				return
			}
			if err != nil || !started {
				t.Fatalf("StartIn: started %v, %v", started, err)
			}
			b, err := os.ReadFile(filepath.Join(dir, "tenant", tc.into))
			if err != nil || string(b) != strconv.Itoa(tid) {
				t.Errorf("%s holds %q %v, want the starting thread %d", tc.into, b, err, tid)
			}
			if tid == unix.Getpid() {
				t.Error("the main thread was moved")
			}
		})
	}
	f, err := os.CreateTemp(t.TempDir(), "file")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := UseTenantCgroup(int(f.Fd())); err == nil {
		tenantCgroup.Store(-1)
		t.Error("a descriptor that is not a directory was taken for the cgroup")
	}
}
