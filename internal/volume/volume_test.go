package volume_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/volume"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// newFS is a volume at a temporary directory, and a host directory
// beside it holding secret, which nothing through the FS may reach.
func newFS(t *testing.T) (fsys *volume.FS, root, host string) {
	t.Helper()
	root, host = t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("host only"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	fsys = volume.New(f, os.Getuid(), os.Getgid())
	t.Cleanup(func() { fsys.Close() })
	return fsys, root, host
}

func TestReadWriteListRemove(t *testing.T) {
	t.Parallel()
	fsys, root, _ := newFS(t)
	e, err := fsys.Write("/data/sub/a.txt", strings.NewReader("hello"), 1<<20)
	if err != nil || e.Path != "/data/sub/a.txt" || e.Size != 5 || e.Type != "file" {
		t.Fatalf("write: %+v, %v", e, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "data/sub/a.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("on disk: %q, %v", b, err)
	}
	f, e, err := fsys.Open("data/sub/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.ReadFrom(f)
	f.Close()
	if buf.String() != "hello" || e.Size != 5 {
		t.Fatalf("read %q %+v", buf.String(), e)
	}
	if _, err := fsys.Write("/data/sub/a.txt", strings.NewReader("x"), 1<<20); err != nil {
		t.Fatal(err)
	}
	l, err := fsys.List("/data", 10)
	if err != nil || len(l) != 1 || l[0].Name != "sub" || l[0].Type != "dir" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if _, err := fsys.List("/data", 0); !errors.Is(err, volume.ErrTooMany) {
		t.Fatalf("a listing past its bound: %v", err)
	}
	if _, err := fsys.Write("/big", strings.NewReader(strings.Repeat("x", 11)), 10); !errors.Is(err, volume.ErrFileTooLong) {
		t.Fatalf("past the limit: %v", err)
	}
	if err := fsys.Remove("/data/sub"); !errors.Is(err, volume.ErrNotEmpty) {
		t.Fatalf("remove a full directory: %v", err)
	}
	for _, p := range []string{"/data/sub/a.txt", "/data/sub", "/data"} {
		if err := fsys.Remove(p); err != nil {
			t.Fatalf("remove %s: %v", p, err)
		}
	}
	if _, _, err := fsys.Open("/data/sub/a.txt"); !errors.Is(err, volume.ErrNotFound) {
		t.Fatalf("removed: %v", err)
	}
	if err := fsys.Remove("/"); !errors.Is(err, volume.ErrBadPath) {
		t.Fatalf("remove the root: %v", err)
	}
}

// TestOwner: what the host makes belongs to the volume's owner.
func TestOwner(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	fsys := volume.New(f, 1001000, 1001000)
	defer fsys.Close()
	if _, err := fsys.Write("/a/b/c", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b", "a/b/c"} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1001000 || st.Gid != 1001000 {
			t.Errorf("%s is owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
}

// TestEscapes: a tenant's symlinks, "..", a mount inside and a FIFO lead
// nowhere outside the volume, and stall nothing (controls: each link
// reaches the host when a host path is followed).
func TestEscapes(t *testing.T) {
	t.Parallel()
	fsys, root, host := newFS(t)
	secret := filepath.Join(host, "secret")
	for name, target := range map[string]string{"abs": secret, "up": "../../../../../../../../" + secret, "dir": host} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Controls: followed as host paths, the links reach the host.
	if b, err := os.ReadFile(filepath.Join(root, "abs")); err != nil || string(b) != "host only" {
		t.Fatalf("control: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "dir", "secret")); err != nil || string(b) != "host only" {
		t.Fatalf("control: %q, %v", b, err)
	}
	for _, p := range []string{"/abs", "/up", "/dir/secret", "../../../../../../" + secret, secret} {
		if f, _, err := fsys.Open(p); err == nil {
			f.Close()
			t.Errorf("read %s reached a file", p)
		}
	}
	// Through the directory link: the link names a directory of the
	// volume (/<host>), which does not exist, so nothing is written.
	if _, err := fsys.Write("/dir/planted", strings.NewReader("x"), 10); !errors.Is(err, volume.ErrNotFound) {
		t.Fatalf("write through the dir link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "planted")); err == nil {
		t.Fatal("a write through a symlinked directory landed on the host")
	}
	if _, err := fsys.Write("/abs", strings.NewReader("overwritten"), 100); !errors.Is(err, volume.ErrNotFound) {
		t.Fatalf("write through the file link: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host only" {
		t.Fatalf("the host file was overwritten: %q", b)
	}
	if l, err := fsys.List("/dir", 10); err == nil && len(l) > 0 && l[0].Name == "secret" {
		t.Fatalf("listed the host dir: %+v", l)
	}
	// Remove takes the link, never what it names.
	if err := fsys.Remove("/abs"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("the link's target went: %v", err)
	}
	// A FIFO: refused at once, not waited on.
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fsys.Open("/fifo"); !errors.Is(err, volume.ErrNotRegular) {
		t.Fatalf("read a FIFO: %v", err)
	}
	if _, err := fsys.Write("/fifo", strings.NewReader("x"), 10); err == nil {
		t.Fatal("wrote a FIFO")
	}
}

// TestNoMountCrossing: a mount inside the volume's tree is not entered
// (control: the host path enters it).
func TestNoMountCrossing(t *testing.T) {
	testutil.RequireRoot(t)
	fsys, root, _ := newFS(t)
	mnt := filepath.Join(root, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(mnt, "x"), []byte("other fs"), 0o644); err != nil {
		t.Fatalf("control: %v", err)
	}
	if f, _, err := fsys.Open("/mnt/x"); err == nil || !errors.Is(err, volume.ErrBadPath) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("read across a mount: %v", err)
	}
}
