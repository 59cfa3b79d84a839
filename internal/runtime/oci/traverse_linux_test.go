package oci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTraversable: a state dir under a directory other users cannot pass
// through (a 0700 data dir, as mktemp makes) is refused with the dir and
// the fix named, instead of every create failing in runc's init.
func TestTraversable(t *testing.T) {
	t.Parallel()
	base, err := os.MkdirTemp("", "traverse")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(data, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = traversable(filepath.Join(data, "run"))
	if err == nil || !strings.Contains(err.Error(), data+" (mode 0700)") || !strings.Contains(err.Error(), "chmod o+x "+data) {
		t.Fatalf("under a 0700 data dir: %v", err)
	}
	if err := os.Chmod(data, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := traversable(filepath.Join(data, "run")); err != nil {
		t.Fatalf("under a 0711 data dir: %v", err)
	}
}
