package homeseed

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteUnpack(t *testing.T) {
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, ".config/matplotlib"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, ".config/matplotlib/fontlist.json"), []byte(`{"fonts":[]}`), 0o644))
	must(t, os.WriteFile(filepath.Join(src, ".bashrc"), []byte("PS1='$ '\n"), 0o600))
	must(t, os.Symlink(".config", filepath.Join(src, "cfg")))
	must(t, os.Mkdir(filepath.Join(src, "shared"), 0o2775))
	must(t, os.Chmod(filepath.Join(src, "shared"), 0o2775|fs.ModeSetgid))
	must(t, os.Chmod(src, 0o750))
	must(t, syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600))

	var a, b bytes.Buffer
	skipped, err := Write(&a, src)
	must(t, err)
	if len(skipped) != 1 || skipped[0] != "fifo" {
		t.Fatalf("skipped %q, want [fifo]", skipped)
	}
	if _, err := Write(&b, src); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes of one tree differ (err %v)", err)
	}

	dst := t.TempDir()
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 1000, 1000
	}
	must(t, Unpack(bytes.NewReader(a.Bytes()), dst, uid, gid))
	got, err := os.ReadFile(filepath.Join(dst, ".config/matplotlib/fontlist.json"))
	if err != nil || string(got) != `{"fonts":[]}` {
		t.Fatalf("fontlist: %q, %v", got, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "cfg")); err != nil || l != ".config" {
		t.Fatalf("link: %q, %v", l, err)
	}
	for p, want := range map[string]fs.FileMode{".": fs.ModeDir | 0o750, ".bashrc": 0o600, ".config": fs.ModeDir | 0o755,
		"shared": fs.ModeDir | fs.ModeSetgid | 0o775} {
		st, err := os.Lstat(filepath.Join(dst, p))
		must(t, err)
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode(), want)
		}
		if s := st.Sys().(*syscall.Stat_t); int(s.Uid) != uid || int(s.Gid) != gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, s.Uid, s.Gid, uid, gid)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("the fifo was carried: %v", err)
	}
	// Only into an empty home.
	if err := Unpack(bytes.NewReader(a.Bytes()), dst, uid, gid); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("unpack into a full home: %v", err)
	}
}

// TestUnpackStaysInside: no entry of a hostile archive lands outside the
// home, through a name or through a symbolic link the archive made.
func TestUnpackStaysInside(t *testing.T) {
	cases := map[string][]tar.Header{
		"dotdot":     {{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute":   {{Name: "/etc/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"via link":   {{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "out/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"no parent":  {{Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o644}},
		"device":     {{Name: "null", Typeflag: tar.TypeChar, Mode: 0o644}},
		"hard link":  {{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, {Name: "g", Typeflag: tar.TypeLink, Linkname: "f"}},
		"twice":      {{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, {Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}},
		"too large":  {{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: MaxSize + 1}},
		"dir escape": {{Name: "d/../../x/", Typeflag: tar.TypeDir, Mode: 0o755}},
	}
	for name, hs := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range hs {
				must(t, tw.WriteHeader(&h))
				if h.Typeflag == tar.TypeReg && h.Size > 0 && h.Size < 1<<20 {
					_, _ = tw.Write(make([]byte, h.Size))
				}
			}
			_ = tw.Close()
			parent := t.TempDir()
			home := filepath.Join(parent, "home")
			must(t, os.Mkdir(home, 0o755))
			if err := Unpack(&buf, home, os.Getuid(), os.Getgid()); err == nil {
				t.Fatal("unpacked")
			}
			for _, p := range []string{filepath.Join(parent, "escape"), "/etc/escape", "/tmp/escape", filepath.Join(parent, "x")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s was written", p)
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
