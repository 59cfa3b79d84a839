package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestHoldReadOnly: on a data dir whose templates are read-only (a server
// in a container) a template is held all the same (a flock needs no
// write access) and nothing is written; the control, a writable one,
// refuses to remove the template held.
func TestHoldReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	dir := filepath.Join(data, "templates")
	writeTree(t, filepath.Join(dir, "app"), map[string]string{"rootfs/etc/version": "one"})
	if err := writeInfo(filepath.Join(dir, "app"), Info{Name: "app", Version: FormatVersion}); err != nil {
		t.Fatal(err)
	}
	_, release, err := Hold(data, "app")
	if err != nil {
		t.Fatalf("writable: %v", err)
	}
	if err := Remove(data, "app"); !errors.Is(err, ErrInUse) {
		t.Fatalf("writable: Remove of a template held: %v, want ErrInUse", err)
	}
	release()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)
	info, release, err := Hold(data, "app")
	if err != nil {
		t.Fatalf("read-only: %v", err)
	}
	release()
	after, _ := os.ReadDir(dir)
	if len(after) != len(before) || info.Path != filepath.Join(dir, "app", "rootfs") {
		t.Errorf("read-only: %d entries before, %d after; path %s", len(before), len(after), info.Path)
	}
}
