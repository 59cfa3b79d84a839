package agent

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// sandboxRoot makes a Root with its own etc/passwd, etc/group and
// etc/hostname (naming the test's uid "tester") and /home/user.
func sandboxRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	uid, gid := os.Getuid(), os.Getgid()
	files := map[string]string{
		"etc/passwd":   fmt.Sprintf("# sandbox passwd\ntester:x:%d:%d::/home/user:/bin/sh\nbroken line\n", uid, gid),
		"etc/group":    fmt.Sprintf("testers:x:%d:\n", gid),
		"etc/hostname": "sandbox-host\n",
	}
	for name, content := range files {
		write(t, filepath.Join(root, name), content)
	}
	if err := os.MkdirAll(filepath.Join(root, "home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// uploads returns the temporary upload files left in dir.
func uploads(t *testing.T, dir string) []string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), uploadPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestFileRoundTrip(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	a := startAgent(t, Config{Root: root})
	body := make([]byte, 5<<20+12345) // several MiB, several data frames
	rand.Read(body)

	r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "data/blob.bin"}, bytes.NewReader(body)).mustOK(t)
	e := r.done.Entry
	if e == nil || e.Path != "/home/user/data/blob.bin" || e.Name != "blob.bin" || e.Type != agentproto.FileTypeFile ||
		e.Size != int64(len(body)) || e.Mode != 0o644 || e.Owner != "tester" || e.Group != "testers" ||
		time.Since(e.ModTime) > time.Minute {
		t.Fatalf("entry %+v", e)
	}
	onDisk, err := os.ReadFile(filepath.Join(root, "home/user/data/blob.bin"))
	if err != nil || !bytes.Equal(onDisk, body) {
		t.Fatalf("on disk: %d bytes, %v", len(onDisk), err)
	}
	if st, _ := os.Stat(filepath.Join(root, "home/user/data")); st.Mode().Perm() != 0o755 {
		t.Fatalf("parent mode %v", st.Mode())
	}

	r = a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/home/user/data/blob.bin"}).mustOK(t)
	if !bytes.Equal(r.data, body) {
		t.Fatalf("read %d bytes, want %d", len(r.data), len(body))
	}
	if len(r.events) != 1 || r.events[0].Type != agentproto.EventFile || r.events[0].Entry.Size != int64(len(body)) {
		t.Fatalf("events %+v", r.events)
	}

	// overwrite with an exact mode (no umask) and an empty body
	r = a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "data/blob.bin", Mode: 0o600}, bytes.NewReader(nil)).mustOK(t)
	if r.done.Entry.Size != 0 || r.done.Entry.Mode != 0o600 {
		t.Fatalf("overwrite entry %+v", r.done.Entry)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "~/data/blob.bin"}).mustOK(t)
	if len(r.data) != 0 {
		t.Fatalf("read %d bytes of an empty file", len(r.data))
	}
	if u := uploads(t, filepath.Join(root, "home/user/data")); len(u) != 0 {
		t.Fatalf("temporary files left: %v", u)
	}
}

// TestFileWriteAborted: a client that dies in the middle of a body leaves
// neither a partial file nor a temporary one, and the old content stays.
func TestFileWriteAborted(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	write(t, filepath.Join(home, "old.txt"), "old content")
	a := startAgent(t, Config{Root: root})

	for _, name := range []string{"old.txt", "new.txt"} {
		// A client that sends the request and part of the body (no
		// reply is read).
		nc := a.dial(t)
		c := agentproto.NewConn(nc)
		if err := c.WriteJSON(agentproto.Request{Op: agentproto.OpFileWrite, Path: name}); err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := c.WriteData(make([]byte, 256<<10)); err != nil {
				t.Fatal(err)
			}
		}
		// Wait until the agent is writing the temporary file, then die.
		deadline := time.Now().Add(10 * time.Second)
		for len(uploads(t, home)) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no temporary file appeared")
			}
			time.Sleep(5 * time.Millisecond)
		}
		nc.Close()
		for len(uploads(t, home)) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("temporary file left: %v", uploads(t, home))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if b, err := os.ReadFile(filepath.Join(home, "old.txt")); string(b) != "old content" {
		t.Fatalf("old.txt = %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(home, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("new.txt exists after an aborted upload (%v)", err)
	}
}

func TestFileLimits(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	write(t, filepath.Join(home, "keep.txt"), "keep")
	a := startAgent(t, Config{Root: root})

	r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "keep.txt", Limit: 1000}, bytes.NewReader(make([]byte, 3<<20)))
	if r.done.Code != agentproto.CodeTooLarge {
		t.Fatalf("over the limit: %+v", r.done)
	}
	if b, _ := os.ReadFile(filepath.Join(home, "keep.txt")); string(b) != "keep" || len(uploads(t, home)) != 0 {
		t.Fatalf("keep.txt = %q, uploads %v", b, uploads(t, home))
	}
	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "exact", Limit: 1000}, bytes.NewReader(make([]byte, 1000))).mustOK(t)

	r = a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "exact", Limit: 999})
	if r.done.Code != agentproto.CodeTooLarge || len(r.data) != 0 || len(r.events) != 0 {
		t.Fatalf("read over the limit: %+v, %d bytes, %d events", r.done, len(r.data), len(r.events))
	}
	a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "exact", Limit: 1000}).mustOK(t)
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	write(t, filepath.Join(home, "file.txt"), "x")
	os.MkdirAll(filepath.Join(home, "dir/sub"), 0o755)
	symlink(t, "nowhere", filepath.Join(home, "dangling"))
	if err := unix.Mkfifo(filepath.Join(home, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, Config{Root: root})

	tests := []struct {
		name string
		req  agentproto.Request
		code string
	}{
		{"read missing", agentproto.Request{Op: agentproto.OpFileRead, Path: "missing"}, agentproto.CodeNotFound},
		{"read directory", agentproto.Request{Op: agentproto.OpFileRead, Path: "dir"}, agentproto.CodeIsDir},
		{"read FIFO does not hang", agentproto.Request{Op: agentproto.OpFileRead, Path: "fifo"}, agentproto.CodeBadRequest},
		{"read dangling symlink", agentproto.Request{Op: agentproto.OpFileRead, Path: "dangling"}, agentproto.CodeNotFound},
		{"read under a file", agentproto.Request{Op: agentproto.OpFileRead, Path: "file.txt/x"}, agentproto.CodeNotDir},
		{"write over directory", agentproto.Request{Op: agentproto.OpFileWrite, Path: "dir"}, agentproto.CodeIsDir},
		{"write /", agentproto.Request{Op: agentproto.OpFileWrite, Path: "/"}, agentproto.CodeIsDir},
		{"write under a file", agentproto.Request{Op: agentproto.OpFileWrite, Path: "file.txt/x"}, agentproto.CodeNotDir},
		{"write through dangling symlink", agentproto.Request{Op: agentproto.OpFileWrite, Path: "dangling/x"}, agentproto.CodeNotFound},
		{"stat missing", agentproto.Request{Op: agentproto.OpFileStat, Path: "dir/missing"}, agentproto.CodeNotFound},
		{"list a file", agentproto.Request{Op: agentproto.OpFileList, Path: "file.txt"}, agentproto.CodeNotDir},
		{"list missing", agentproto.Request{Op: agentproto.OpFileList, Path: "missing"}, agentproto.CodeNotFound},
		{"mkdir existing", agentproto.Request{Op: agentproto.OpFileMkdir, Path: "dir"}, agentproto.CodeExists},
		{"mkdir over file", agentproto.Request{Op: agentproto.OpFileMkdir, Path: "file.txt"}, agentproto.CodeExists},
		{"mkdir under a file", agentproto.Request{Op: agentproto.OpFileMkdir, Path: "file.txt/d"}, agentproto.CodeNotDir},
		{"remove missing", agentproto.Request{Op: agentproto.OpFileRemove, Path: "missing"}, agentproto.CodeNotFound},
		{"move missing", agentproto.Request{Op: agentproto.OpFileMove, Path: "missing", NewPath: "x"}, agentproto.CodeNotFound},
		{"move dir over non-empty dir", agentproto.Request{Op: agentproto.OpFileMove, Path: "dir/sub", NewPath: "/home/user"}, agentproto.CodeExists},
		{"move dir into itself", agentproto.Request{Op: agentproto.OpFileMove, Path: "dir", NewPath: "dir/sub/dir"}, agentproto.CodeBadRequest},
		{"move file over dir", agentproto.Request{Op: agentproto.OpFileMove, Path: "file.txt", NewPath: "dir"}, agentproto.CodeIsDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var body io.Reader
			if tt.req.Op == agentproto.OpFileWrite {
				body = strings.NewReader("content")
			}
			r := a.callBody(t, tt.req, body)
			if r.done.Code != tt.code {
				t.Fatalf("done %+v, want %s", r.done, tt.code)
			}
			if strings.Contains(r.done.Message, root) {
				t.Fatalf("message names the host path: %q", r.done.Message)
			}
		})
	}
}

func TestFileList(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	write(t, filepath.Join(home, "a.txt"), "aaa")
	write(t, filepath.Join(home, "b/c.txt"), "c")
	write(t, filepath.Join(home, "b/d/e.txt"), "e")
	write(t, filepath.Join(home, "b-x"), "")
	write(t, filepath.Join(home, "stranger"), "")
	os.Lchown(filepath.Join(home, "stranger"), 4242, 4343)
	symlink(t, "a.txt", filepath.Join(home, "link"))
	symlink(t, "/etc", filepath.Join(home, "etc"))
	a := startAgent(t, Config{Root: root})

	paths := func(r result) []string {
		var out []string
		for _, e := range r.done.Entries {
			out = append(out, e.Path)
		}
		return out
	}
	top := []string{"/home/user/a.txt", "/home/user/b", "/home/user/b-x", "/home/user/etc", "/home/user/link", "/home/user/stranger"}
	for _, depth := range []int{0, 1} {
		r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "/home/user", Depth: depth}).mustOK(t)
		if got := paths(r); !slices.Equal(got, top) {
			t.Fatalf("depth %d: %v", depth, got)
		}
	}
	r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: ".", Depth: 2}).mustOK(t)
	// Each directory's entries by name, a directory's contents right after it.
	want := []string{"/home/user/a.txt", "/home/user/b", "/home/user/b/c.txt", "/home/user/b/d", "/home/user/b-x", "/home/user/etc", "/home/user/link", "/home/user/stranger"}
	if got := paths(r); !slices.Equal(got, want) {
		t.Fatalf("depth 2: %v", got)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileList, Depth: 10}).mustOK(t) // empty path: home
	want = slices.Insert(want, 4, "/home/user/b/d/e.txt")
	if got := paths(r); !slices.Equal(got, want) || r.done.Truncated {
		t.Fatalf("depth 10 (never into the /etc symlink): %v", got)
	}
	byPath := map[string]agentproto.FileInfo{}
	for _, e := range r.done.Entries {
		byPath[e.Path] = e
	}
	checks := []struct {
		path, typ, target, owner, group string
		size                            int64
	}{
		{"/home/user/a.txt", agentproto.FileTypeFile, "", "tester", "testers", 3},
		{"/home/user/b", agentproto.FileTypeDir, "", "tester", "testers", -1},
		{"/home/user/link", agentproto.FileTypeSymlink, "/home/user/a.txt", "tester", "testers", -1},
		{"/home/user/etc", agentproto.FileTypeSymlink, "/etc", "tester", "testers", -1},
		{"/home/user/stranger", agentproto.FileTypeFile, "", "4242", "4343", 0},
	}
	for _, c := range checks {
		e := byPath[c.path]
		if e.Type != c.typ || e.SymlinkTarget != c.target || e.Owner != c.owner || e.Group != c.group || (c.size >= 0 && e.Size != c.size) {
			t.Errorf("%s: %+v", c.path, e)
		}
	}

	// listing a symlink to a directory lists the directory it names inside
	// Root
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "etc"}).mustOK(t)
	if got := paths(r); !slices.Equal(got, []string{"/home/user/etc/group", "/home/user/etc/hostname", "/home/user/etc/passwd"}) {
		t.Fatalf("list etc: %v", got)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "/"}).mustOK(t)
	if got := paths(r); !slices.Equal(got, []string{"/etc", "/home"}) {
		t.Fatalf("list /: %v", got)
	}
}

// TestFileListTruncated lowers the entry cap, so it is not parallel.
func TestFileListTruncated(t *testing.T) {
	old := maxListEntries
	maxListEntries = 3
	defer func() { maxListEntries = old }()
	root := sandboxRoot(t)
	for i := range 5 {
		write(t, filepath.Join(root, "home/user", strconv.Itoa(i)), "")
	}
	a := startAgent(t, Config{Root: root})
	r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~"}).mustOK(t)
	if len(r.done.Entries) != 3 || !r.done.Truncated {
		t.Fatalf("%d entries, truncated %v", len(r.done.Entries), r.done.Truncated)
	}
}

// TestFileListPages: a listing resumes after the entry it names, in the
// same order, without repeating or missing one, at every depth and page
// size, also when the cursor's entry is gone; a cursor outside the
// listing is refused.
func TestFileListPages(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	for _, f := range []string{"a/1", "a/2/x", "a/2/y", "a-b", "b/z", "c", "d/e/f/g"} {
		write(t, filepath.Join(root, "home/user", f), "")
	}
	a := startAgent(t, Config{Root: root})
	paths := func(es []agentproto.FileInfo) (out []string) {
		for _, e := range es {
			out = append(out, e.Path)
		}
		return out
	}
	for _, depth := range []int{1, 2, 3, 10} {
		all := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~", Depth: depth}).mustOK(t)
		want := paths(all.done.Entries)
		for limit := 1; limit <= len(want); limit++ {
			var got []string
			after := ""
			for page := 0; ; page++ {
				if page > len(want) {
					t.Fatalf("depth %d, limit %d: pages without end: %v", depth, limit, got)
				}
				r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~", Depth: depth, Limit: int64(limit), After: after}).mustOK(t)
				if len(r.done.Entries) > limit {
					t.Fatalf("depth %d, limit %d: a page of %d", depth, limit, len(r.done.Entries))
				}
				got = append(got, paths(r.done.Entries)...)
				if !r.done.Truncated {
					break
				}
				after = r.done.Entries[len(r.done.Entries)-1].Path
			}
			if !slices.Equal(got, want) {
				t.Fatalf("depth %d, limit %d: pages %v, want %v", depth, limit, got, want)
			}
		}
	}
	// The cursor's entry removed: the listing goes on after where it was.
	r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~", Depth: 2, After: "/home/user/a/1.5"}).mustOK(t)
	if got := paths(r.done.Entries); !slices.Equal(got, []string{"/home/user/a/2", "/home/user/a-b", "/home/user/b", "/home/user/b/z", "/home/user/c", "/home/user/d", "/home/user/d/e"}) {
		t.Fatalf("after a vanished entry: %v", got)
	}
	for _, after := range []string{"/home/other/x", "/home/user", "home/user/a", "/home/username"} {
		if r := a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~", After: after}); r.done.Code != agentproto.CodeBadRequest {
			t.Errorf("after %q: %+v", after, r.done)
		}
	}
}

func TestFileMkdirStatMoveRemove(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	outside := t.TempDir()
	write(t, filepath.Join(outside, "precious"), "host data")
	a := startAgent(t, Config{Root: root})

	r := a.call(t, agentproto.Request{Op: agentproto.OpFileMkdir, Path: "x/y/z", Mode: 0o700}).mustOK(t)
	if e := r.done.Entry; e.Path != "/home/user/x/y/z" || e.Type != agentproto.FileTypeDir || e.Mode != 0o700 {
		t.Fatalf("mkdir entry %+v", e)
	}
	if st, _ := os.Stat(filepath.Join(home, "x/y")); st.Mode().Perm() != 0o755 {
		t.Fatalf("parent mode %v", st.Mode())
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "x/y/z"}).mustOK(t)
	if r.done.Entry.Mode != 0o700 || r.done.Entry.Owner != "tester" {
		t.Fatalf("stat %+v", r.done.Entry)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "/"}).mustOK(t)
	if r.done.Entry.Type != agentproto.FileTypeDir || r.done.Entry.Path != "/" {
		t.Fatalf("stat / %+v", r.done.Entry)
	}

	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "x/y/z/f"}, strings.NewReader("f")).mustOK(t)
	symlink(t, outside, filepath.Join(home, "x/y/out")) // a symlink to a host directory inside the tree
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "x/y/out"}).mustOK(t)
	if r.done.Entry.Type != agentproto.FileTypeSymlink || r.done.Entry.SymlinkTarget != outside {
		t.Fatalf("stat symlink %+v", r.done.Entry)
	}

	r = a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "x", NewPath: "/home/user/moved/x2"}).mustOK(t)
	if e := r.done.Entry; e.Path != "/home/user/moved/x2" || e.Type != agentproto.FileTypeDir {
		t.Fatalf("move entry %+v", e)
	}
	if _, err := os.Stat(filepath.Join(home, "moved/x2/y/z/f")); err != nil {
		t.Fatalf("moved tree: %v", err)
	}
	// move a file over a file replaces it
	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "g"}, strings.NewReader("g")).mustOK(t)
	a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "g", NewPath: "moved/x2/y/z/f"}).mustOK(t)
	if b, _ := os.ReadFile(filepath.Join(home, "moved/x2/y/z/f")); string(b) != "g" {
		t.Fatalf("replaced file = %q", b)
	}

	// remove is recursive and never follows the symlink to the host dir
	a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "moved"}).mustOK(t)
	if _, err := os.Lstat(filepath.Join(home, "moved")); !os.IsNotExist(err) {
		t.Fatalf("moved still exists: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "precious")); string(b) != "host data" {
		t.Fatalf("host file behind a symlink: %q, %v", b, err)
	}
	// removing a symlink removes the link only
	symlink(t, outside, filepath.Join(home, "out2"))
	a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "out2"}).mustOK(t)
	if _, err := os.Stat(filepath.Join(outside, "precious")); err != nil {
		t.Fatal(err)
	}
	// a single file
	a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "/etc/hostname"}).mustOK(t)
	if _, err := os.Stat(filepath.Join(root, "etc/hostname")); !os.IsNotExist(err) {
		t.Fatal("etc/hostname survived")
	}
}

// TestFileConfinement: every path below escapes Root when opened naively
// from Root (the test shows it), and stays inside Root through the agent.
func TestFileConfinement(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	outside := t.TempDir() // a host directory, also planted at the same path inside Root
	write(t, filepath.Join(outside, "secret"), "host secret")
	write(t, filepath.Join(root, outside, "secret"), "sandbox secret")

	// enough ".." to climb from Root/home/user to the host's /
	up := strings.Repeat("../", strings.Count(root, "/")+3)
	symlink(t, "/etc", filepath.Join(home, "etc"))                                           // absolute, to a directory
	symlink(t, "/etc/passwd", filepath.Join(home, "abs"))                                    // absolute, to a file
	symlink(t, up+"etc", filepath.Join(home, "rel"))                                         // relative, climbing out
	symlink(t, outside, filepath.Join(home, "outlink"))                                      // absolute, to the host dir
	symlink(t, "chain2", filepath.Join(home, "chain1"))                                      // a chain ...
	symlink(t, "sub/chain3", filepath.Join(home, "chain2"))                                  // ... through ...
	os.MkdirAll(filepath.Join(home, "sub"), 0o755)                                           //
	symlink(t, "../"+up+strings.TrimPrefix(outside, "/"), filepath.Join(home, "sub/chain3")) // ... climbing out
	symlink(t, "loop2", filepath.Join(home, "loop1"))
	symlink(t, "loop1", filepath.Join(home, "loop2"))

	a := startAgent(t, Config{Root: root})

	reads := []struct {
		path    string // as the client sends it
		host    string // the host file a naive open reaches
		sandbox string // what the agent must return instead
	}{
		{"../../etc/passwd", "", "sandbox passwd"}, // stays in Root even lexically
		{up + "etc/passwd", "/etc/passwd", "sandbox passwd"},
		{"/" + strings.Repeat("../", strings.Count(root, "/")+1) + "etc/hostname", "/etc/hostname", "sandbox-host"},
		{"etc/passwd", "/etc/passwd", "sandbox passwd"},
		{"abs", "/etc/passwd", "sandbox passwd"},
		{"rel/hostname", "/etc/hostname", "sandbox-host"},
		{"outlink/secret", filepath.Join(outside, "secret"), "sandbox secret"},
		{"chain1/secret", filepath.Join(outside, "secret"), "sandbox secret"},
		{"etc/../etc/passwd", "/etc/passwd", "sandbox passwd"},
	}
	for _, c := range reads {
		t.Run("read "+c.path, func(t *testing.T) {
			if c.host != "" {
				hostContent, err := os.ReadFile(c.host)
				if err != nil {
					t.Skipf("host has no %s: %v", c.host, err)
				}
				naive := root + "/home/user/" + c.path
				if strings.HasPrefix(c.path, "/") {
					naive = root + c.path
				}
				got, err := os.ReadFile(naive)
				if err != nil || !bytes.Equal(got, hostContent) {
					t.Fatalf("the naive open of %s does not escape (%v): the case proves nothing", naive, err)
				}
			}
			r := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: c.path}).mustOK(t)
			if !strings.Contains(string(r.data), c.sandbox) {
				t.Fatalf("agent read %.40q..., want the sandbox's file (%q)", r.data, c.sandbox)
			}
		})
	}

	// Operations that create, change or remove things, through the same
	// links: they must act inside Root and leave the host directory alone.
	hostSecret := func(t *testing.T) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host secret" {
			t.Fatalf("host secret changed: %q, %v", b, err)
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			t.Fatalf("host directory has %d entries", len(ents))
		}
	}
	// First show the naive way escapes: a write through outlink lands on
	// the host.
	naive := filepath.Join(outside, "naive")
	if err := os.WriteFile(home+"/outlink/naive", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(naive); err != nil {
		t.Fatalf("naive write did not escape: %v", err)
	}
	os.Remove(naive)

	ops := []struct {
		name  string
		req   agentproto.Request
		check string // a path inside Root that must exist afterwards ("" for none)
	}{
		{"write through outlink", agentproto.Request{Op: agentproto.OpFileWrite, Path: "outlink/w1"}, filepath.Join(outside, "w1")},
		{"write through chain", agentproto.Request{Op: agentproto.OpFileWrite, Path: "chain1/w2"}, filepath.Join(outside, "w2")},
		{"write with dotdot", agentproto.Request{Op: agentproto.OpFileWrite, Path: up + strings.TrimPrefix(outside, "/") + "/w3"}, filepath.Join(outside, "w3")},
		{"mkdir through outlink", agentproto.Request{Op: agentproto.OpFileMkdir, Path: "outlink/d1"}, filepath.Join(outside, "d1")},
		{"move into outlink", agentproto.Request{Op: agentproto.OpFileMove, Path: "/etc/group", NewPath: "outlink/group"}, filepath.Join(outside, "group")},
		{"move out of outlink", agentproto.Request{Op: agentproto.OpFileMove, Path: "outlink/secret", NewPath: "moved-secret"}, "/home/user/moved-secret"},
		{"remove through chain", agentproto.Request{Op: agentproto.OpFileRemove, Path: "chain1/d1"}, ""},
		{"list through outlink", agentproto.Request{Op: agentproto.OpFileList, Path: "outlink"}, ""},
	}
	for _, op := range ops {
		var body io.Reader
		if op.req.Op == agentproto.OpFileWrite {
			body = strings.NewReader("through the agent")
		}
		r := a.callBody(t, op.req, body).mustOK(t)
		if op.check != "" {
			if _, err := os.Lstat(filepath.Join(root, op.check)); err != nil {
				t.Errorf("%s: not inside Root: %v", op.name, err)
			}
		}
		for _, e := range r.done.Entries {
			if e.Name == "secret" {
				t.Errorf("%s: listed the host directory", op.name)
			}
		}
		hostSecret(t)
	}

	loop := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "loop1"})
	if loop.done.Code != agentproto.CodeBadRequest {
		t.Fatalf("symlink loop: %+v", loop.done)
	}
}

// TestFileMagicLinks: with Root "/" (as in a sandbox), /proc magic links,
// which jump wherever their target is, are refused.
func TestFileMagicLinks(t *testing.T) {
	t.Parallel()
	if _, err := os.ReadFile("/proc/self/root/etc/hostname"); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	a := startAgent(t, Config{Root: "/", Home: t.TempDir()})
	r := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/proc/self/root/etc/hostname"})
	if r.done.Code == "" {
		t.Fatalf("read through a magic link: %q", r.data)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/etc/hostname"}).mustOK(t)
}

// TestFileMounts needs root: a read-only mount (CodePermission), a full
// filesystem (CodeNoSpace, and no partial file), and a move across
// filesystems (copied).
func TestFileMounts(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	mount := func(dir, opts string, flags uintptr) {
		os.MkdirAll(dir, 0o755)
		if err := unix.Mount("tmpfs", dir, "tmpfs", flags, opts); err != nil {
			t.Fatalf("mount %s: %v", dir, err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	}
	mount(filepath.Join(home, "ro"), "size=1m", unix.MS_RDONLY)
	mount(filepath.Join(home, "small"), "size=64k", 0)
	mount(filepath.Join(root, "tmp"), "size=4m", 0)
	a := startAgent(t, Config{Root: root})

	r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "ro/f"}, strings.NewReader("x"))
	if r.done.Code != agentproto.CodePermission {
		t.Errorf("read-only: %+v", r.done)
	}
	r = a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "small/big"}, bytes.NewReader(make([]byte, 1<<20)))
	if r.done.Code != agentproto.CodeNoSpace {
		t.Errorf("full: %+v", r.done)
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "small")); len(ents) != 0 {
		t.Errorf("left in a full filesystem: %v", ents)
	}

	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "/tmp/f", Mode: 0o640}, strings.NewReader("across")).mustOK(t)
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "/tmp/f", NewPath: "g"}).mustOK(t)
	if b, _ := os.ReadFile(filepath.Join(home, "g")); string(b) != "across" || r.done.Entry.Mode != 0o640 {
		t.Errorf("moved across: %q, %+v", b, r.done.Entry)
	}
	if _, err := os.Stat(filepath.Join(root, "tmp/f")); !os.IsNotExist(err) {
		t.Errorf("source left after a move across filesystems")
	}
	os.MkdirAll(filepath.Join(root, "tmp/dir"), 0o755)
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "/tmp/dir", NewPath: "dir"})
	if r.done.Code != agentproto.CodeUnsupported {
		t.Errorf("directory across filesystems: %+v", r.done)
	}
}
