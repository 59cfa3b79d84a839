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
	release(true)
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
	release(true)
	after, _ := os.ReadDir(dir)
	if len(after) != len(before) || info.Path != filepath.Join(dir, "app", "rootfs") {
		t.Errorf("read-only: %d entries before, %d after; path %s", len(before), len(after), info.Path)
	}
}

// TestHoldRebuilt: a name rebuilt while a sandbox holds it installs the
// new tree and leaves the old one, renamed aside and whole, to the
// holder; the holder's release removes it. The control: rebuilt with no
// holder, the old tree goes at the install.
func TestHoldRebuilt(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	dir := templatesDir(data)
	install := func(version string) {
		t.Helper()
		staging := filepath.Join(dir, ".app.build-"+version)
		writeTree(t, staging, map[string]string{"rootfs/etc/version": version})
		if err := writeInfo(staging, Info{Name: "app", Version: FormatVersion}); err != nil {
			t.Fatal(err)
		}
		b := &builder{def: Definition{Name: "app"}, dir: dir, log: newBuildLog(nil)}
		if err := b.install(staging, filepath.Join(dir, "app")); err != nil {
			t.Fatal(err)
		}
	}
	asides := func() []string {
		old, _ := filepath.Glob(filepath.Join(dir, ".app.old-*"))
		return old
	}
	install("one")
	info, release, err := Hold(data, "app")
	if err != nil {
		t.Fatal(err)
	}
	install("two")
	if b, err := os.ReadFile(filepath.Join(info.Path, "etc/version")); err != nil || string(b) != "two" {
		t.Errorf("the name after the rebuild: %q, %v", b, err) // a new sandbox's; a running one's overlay keeps its tree
	}
	old := asides()
	if len(old) != 1 {
		t.Fatalf("old trees after a rebuild under a holder: %v", old)
	}
	if b, err := os.ReadFile(filepath.Join(old[0], "rootfs/etc/version")); err != nil || string(b) != "one" {
		t.Errorf("the old tree: %q, %v", b, err)
	}
	release(true)
	if left := asides(); len(left) != 0 {
		t.Errorf("old trees after the holder's release: %v", left)
	}
	install("three") // control: nothing holds "two"
	if left := asides(); len(left) != 0 {
		t.Errorf("old trees after a rebuild with no holder: %v", left)
	}
}
