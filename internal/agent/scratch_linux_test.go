package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/homeseed"
)

// A Pod's scratch volume: the home unpacked from the seed, the user's;
// /tmp sticky; the usage op reports the volume as the disk.
func TestPrepareScratch(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chowns to the sandbox's user: needs root")
	}
	t.Parallel()
	tpl := t.TempDir()
	if err := os.WriteFile(filepath.Join(tpl, ".bashrc"), []byte("alias ll='ls -l'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var seed bytes.Buffer
	if _, err := homeseed.Write(&seed, tpl); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"home/user", "tmp", ".sheepfold"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := PrepareScratch(root, "/home/user", "/tmp", "/.sheepfold/home.tar"); err == nil || !strings.Contains(err.Error(), "sheepfold template export") {
		t.Fatalf("without a seed: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, ".sheepfold/home.tar"), seed.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := PrepareScratch(root, "/home/user", "/tmp", "/.sheepfold/home.tar"); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	for _, p := range []string{"home/user", "home/user/.bashrc"} {
		if err := unix.Stat(filepath.Join(root, p), &st); err != nil || st.Uid != defaultUID || st.Gid != defaultGID {
			t.Fatalf("%s: owner %d:%d, err %v", p, st.Uid, st.Gid, err)
		}
	}
	if err := unix.Stat(filepath.Join(root, "tmp"), &st); err != nil || st.Mode&0o7777 != 0o1777 || st.Uid != 0 {
		t.Fatalf("tmp: mode %o, owner %d, err %v", st.Mode&0o7777, st.Uid, err)
	}

	cg := t.TempDir()
	writeTree(t, cg, v2Files(""), nil)
	a := startAgent(t, Config{CgroupRoot: cg, Root: root, Disk: "/home/user"})
	u := a.call(t, agentproto.Request{Op: agentproto.OpUsage}).mustOK(t).done.Usage
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(root, "home/user"), &fs); err != nil {
		t.Fatal(err)
	}
	if u == nil || u.DiskTotalBytes != int64(fs.Blocks)*fs.Bsize || u.DiskBytes <= 0 || u.DiskBytes > u.DiskTotalBytes {
		t.Fatalf("usage %+v; the file system has %d blocks of %d", u, fs.Blocks, fs.Bsize)
	}
}

// A fresh volume's root (root's) becomes the user's, and nothing in it;
// a root someone else owns stays theirs; a symlink is never followed.
func TestOwnVolume(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chowns to the sandbox's user: needs root")
	}
	t.Parallel()
	root := t.TempDir()
	for _, d := range []string{"data/sub", "given", "elsewhere"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(root, "given"), 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "elsewhere"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	owner := func(p string) (uint32, uint32) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	if err := OwnVolume(root, "/data"); err != nil {
		t.Fatal(err)
	}
	if u, g := owner("data"); u != defaultUID || g != defaultGID {
		t.Errorf("the volume's root: %d:%d, want %d:%d", u, g, defaultUID, defaultGID)
	}
	if u, _ := owner("data/sub"); u != 0 {
		t.Errorf("what is in the volume changed owner: %d", u)
	}
	if err := OwnVolume(root, "/given"); err != nil {
		t.Fatal(err)
	}
	if u, _ := owner("given"); u != 4242 {
		t.Errorf("a volume given before changed owner: %d", u)
	}
	if err := OwnVolume(root, "/link"); err == nil {
		t.Error("a symlink was followed")
	}
	if u, _ := owner("elsewhere"); u != 0 {
		t.Errorf("the symlink's target changed owner: %d", u)
	}
}
