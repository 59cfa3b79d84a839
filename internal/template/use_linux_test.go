package template

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestUseReadOnly: on a data dir whose templates are read-only (a server
// in a container), Use takes no lock and is no error; the control, a
// writable one, makes the lock file.
func TestUseReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	dir := filepath.Join(data, "templates")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := Use(data, "python")
	if err != nil {
		t.Fatalf("writable: %v", err)
	}
	release()
	if _, err := os.Stat(filepath.Join(dir, ".python.use")); err != nil {
		t.Fatalf("writable: no lock file: %v", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	if release, err := Use(data, "java"); err != nil {
		t.Fatalf("read-only: %v", err)
	} else {
		release()
	}
}
