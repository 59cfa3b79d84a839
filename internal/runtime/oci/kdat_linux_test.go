package oci

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// diskDir is a directory of the test's on a filesystem that is not a
// tmpfs (where CRIU keeps no cache of its own).
func diskDir(t *testing.T) string {
	t.Helper()
	for _, parent := range []string{os.TempDir(), "."} {
		var fs unix.Statfs_t
		if err := unix.Statfs(parent, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
			continue
		}
		d, err := os.MkdirTemp(parent, "kdat")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	t.Fatal("no directory of the test is on a filesystem other than a tmpfs")
	return ""
}

// TestKdatMadeOnce: where the cache's directory is not a tmpfs,
// ensureKdatAt writes CRIU's cache there, leaves a current one as it is,
// and makes again one older than the host's boot or than the CRIU binary,
// or an empty one. Where it is a tmpfs, it writes nothing (CRIU keeps
// the cache there itself).
func TestKdatMadeOnce(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg := testConfig(t, "kdat")
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	ns, err := findNSTools()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(diskDir(t), "criu.kdat")
	made, err := ensureKdatAt(ctx, path, cfg.CriuPath, ns.unshare)
	if err != nil || !made {
		t.Fatalf("first: made %v, %v", made, err)
	}
	first, err := os.ReadFile(path)
	if err != nil || len(first) == 0 {
		t.Fatalf("the cache: %d bytes, %v", len(first), err)
	}
	if made, err := ensureKdatAt(ctx, path, cfg.CriuPath, ns.unshare); err != nil || made {
		t.Errorf("a current cache was made again (%v, %v)", made, err)
	}
	boot, err := bootTime()
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.Stat(cfg.CriuPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, stale := range map[string]time.Time{"before the boot": boot.Add(-time.Hour), "before the CRIU binary": ci.ModTime().Add(-time.Second)} {
		if err := os.WriteFile(path, []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, stale, stale); err != nil {
			t.Fatal(err)
		}
		if made, err := ensureKdatAt(ctx, path, cfg.CriuPath, ns.unshare); err != nil || !made {
			t.Errorf("a cache written %s: made %v, %v", name, made, err)
		}
		if b, _ := os.ReadFile(path); len(b) != len(first) {
			t.Errorf("a cache written %s was made again as %d bytes, want CRIU's %d", name, len(b), len(first))
		}
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if made, err := ensureKdatAt(ctx, path, cfg.CriuPath, ns.unshare); err != nil || !made {
		t.Errorf("an empty cache: made %v, %v", made, err)
	}
	tmp := testutil.ShortTempDir(t)
	if err := unix.Mount("kdat-test", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(tmp, unix.MNT_DETACH)
	if made, err := ensureKdatAt(ctx, filepath.Join(tmp, "criu.kdat"), cfg.CriuPath, ns.unshare); err != nil || made {
		t.Errorf("on a tmpfs: made %v, %v; want nothing made", made, err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "criu.kdat")); err == nil {
		t.Error("a cache was written on a tmpfs")
	}
}

// TestRestoreReadsKdat: CRIU's restore reads its kernel cache rather than
// probing the kernel again, on a host whose /run is not a tmpfs too: the
// cache is taken away first, and the runtime's first CRIU run gives it
// back (on a host whose /run is a tmpfs the dump writes it).
func TestRestoreReadsKdat(t *testing.T) {
	ctx := context.Background()
	if err := os.Remove(kdatPath); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	const id = "kdatr"
	o, _ := checkpointable(t, "kdatr", id, runtime.Limits{MemoryBytes: 128 << 20, Pids: 64, DiskBytes: 64 << 20})
	defer destroyChecked(t, o, id)
	dir := filepath.Join(checkpointsDir(t), "c")
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Restore(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(filepath.Join(dir, "restore.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Loaded kdat cache from "+kdatPath) {
		i := bytes.Index(log, []byte("criu.kdat"))
		t.Errorf("the restore probed the kernel instead of reading %s: %q", kdatPath, log[max(0, i-40):min(len(log), i+80)])
	}
}
