package agent

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// fsEv is an fs event in short: "create a.txt".
func fsEv(ev agentproto.Event) string {
	if ev.Type != agentproto.EventFS || ev.FS == nil {
		return fmt.Sprintf("%s %+v", ev.Type, ev)
	}
	return ev.FS.Op + " " + ev.FS.Name
}

// watchStream is an open file.watch.
type watchStream struct {
	*stream
	dir     string // the watched directory on the host
	markers int
}

// watchDir starts a watch of the sandbox path p (the host directory dir)
// and waits for it to be in place.
func watchDir(t *testing.T, a *testAgent, p, dir string, recursive bool) *watchStream {
	t.Helper()
	s := a.open(t, agentproto.Request{Op: agentproto.OpFileWatch, Path: p, Recursive: recursive})
	if ev := s.next(); ev.Type != agentproto.EventWatchStart {
		t.Fatalf("first event %+v, want %s", ev, agentproto.EventWatchStart)
	}
	return &watchStream{stream: s, dir: dir}
}

// settle returns the events up to a marker file created now in the
// watched directory (inotify keeps one watch's events in order, so they
// are all the events of what was done before). It fails on events of
// upload temporaries.
func (w *watchStream) settle() []string {
	w.t.Helper()
	w.markers++
	marker := fmt.Sprintf("marker-%d", w.markers)
	f, err := os.OpenFile(filepath.Join(w.dir, marker), os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	f.Close()
	os.Remove(filepath.Join(w.dir, marker))
	var got []string
	for {
		ev := w.next()
		e := fsEv(ev)
		if e == "create "+marker {
			if ev := w.next(); fsEv(ev) != "remove "+marker {
				w.t.Fatalf("after the marker: %s", fsEv(ev))
			}
			return got
		}
		if strings.Contains(e, uploadPrefix) {
			w.t.Fatalf("event of an upload temporary: %s", e)
		}
		got = append(got, e)
	}
}

// expect fails unless the events up to now are exactly want.
func (w *watchStream) expect(what string, want ...string) {
	w.t.Helper()
	if got := w.settle(); !slices.Equal(got, want) {
		w.t.Fatalf("%s: events %q, want %q", what, got, want)
	}
}

func TestWatchEvents(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	dir := filepath.Join(root, "home/user/w")
	write(t, filepath.Join(dir, "sub/old.txt"), "old")
	a := startAgent(t, Config{Root: root})
	w := watchDir(t, a, "w", dir, false)
	w.expect("nothing yet")

	write(t, filepath.Join(dir, "a.txt"), "hello") // O_CREAT|O_TRUNC, write, close
	w.expect("create", "create a.txt", "write a.txt")
	if err := os.Chmod(filepath.Join(dir, "a.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.expect("chmod", "chmod a.txt")
	if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	w.expect("rename", "rename a.txt", "create b.txt")
	if err := os.Remove(filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	w.expect("remove", "remove b.txt")

	// Not recursive: sub's own entry changes, nothing inside it.
	write(t, filepath.Join(dir, "sub/new.txt"), "x")
	os.Chmod(filepath.Join(dir, "sub"), 0o700)
	w.expect("in a subdirectory", "chmod sub")
	os.Mkdir(filepath.Join(dir, "dir2"), 0o755)
	w.expect("mkdir", "create dir2")

	// The agent's own uploads look like writes in place, without their
	// temporaries.
	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "w/up.txt"}, strings.NewReader("1")).mustOK(t)
	w.expect("upload of a new file", "create up.txt", "write up.txt")
	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "w/up.txt"}, strings.NewReader("2")).mustOK(t)
	w.expect("upload over a file", "write up.txt")
	a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "w/up.txt", NewPath: "w/moved.txt"}).mustOK(t)
	w.expect("move", "rename up.txt", "create moved.txt")
	a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "w/moved.txt"}).mustOK(t)
	w.expect("agent remove", "remove moved.txt")
	bigNC, big := a.upload(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "w/aborted"})
	big.WriteData([]byte("partial"))
	waitFor(t, "the upload's temporary file to hold its data", func() bool { return uploadedBytes(t, dir) == len("partial") })
	bigNC.Close()
	w.expect("aborted upload") // settle fails on the temporary's events

	// Removing the watched directory ends the watch.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for {
		ev := w.next()
		if ev.Type == agentproto.EventDone {
			if ev.Code != "" {
				t.Fatalf("done %+v", ev)
			}
			break
		}
		rest = append(rest, fsEv(ev))
	}
	if len(rest) == 0 || rest[len(rest)-1] != "remove " {
		t.Fatalf("events before the end: %q, want the last \"remove \" (the directory itself)", rest)
	}
}

// TestWatchWrites: a file written in many pieces gives few write events,
// and the last write is always reported, closed or not.
func TestWatchWrites(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	dir := filepath.Join(root, "home/user")
	a := startAgent(t, Config{Root: root})
	w := watchDir(t, a, "~", dir, false)

	f, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 {
		f.Write([]byte("line\n"))
	}
	f.Close()
	got := w.settle()
	if len(got) < 2 || len(got) > 4 || got[0] != "create log" || got[len(got)-1] != "write log" {
		t.Fatalf("2000 writes then close: %q", got)
	}

	// Still open: the write after the first one comes after the interval.
	f, err = os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write([]byte("a\n"))
	if ev := fsEv(w.next()); ev != "write log" {
		t.Fatalf("first write: %s", ev)
	}
	start := time.Now()
	f.Write([]byte("b\n"))
	if ev := fsEv(w.next()); ev != "write log" {
		t.Fatalf("pending write: %s", ev)
	}
	if el := time.Since(start); el < writeInterval/2 || el > writeInterval+2*time.Second {
		t.Fatalf("pending write reported after %v, want about %v", el, writeInterval)
	}
}

func TestWatchRecursive(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	dir := filepath.Join(root, "home/user/w")
	away := filepath.Join(root, "home/user/away")
	write(t, filepath.Join(dir, "sub/deeper/old.txt"), "old")
	os.MkdirAll(away, 0o755)
	a := startAgent(t, Config{Root: root})
	w := watchDir(t, a, "/home/user/w", dir, true)

	write(t, filepath.Join(dir, "sub/deeper/f.txt"), "x")
	w.expect("existing subdirectory", "create sub/deeper/f.txt", "write sub/deeper/f.txt")

	// A directory made later is watched once its create is seen.
	os.Mkdir(filepath.Join(dir, "later"), 0o755)
	w.expect("mkdir", "create later")
	write(t, filepath.Join(dir, "later/x"), "x")
	w.expect("in a later directory", "create later/x", "write later/x")

	// A tree made at once: every level is reported, whether its entries
	// were made before or after its watch (some may come twice).
	if err := os.MkdirAll(filepath.Join(dir, "t/a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "t/a/b/f"), "f")
	got := w.settle()
	for _, want := range []string{"create t", "create t/a", "create t/a/b", "create t/a/b/f"} {
		if !slices.Contains(got, want) {
			t.Fatalf("tree: %q lacks %q", got, want)
		}
	}
	write(t, filepath.Join(dir, "t/a/b/g"), "g")
	w.expect("in the new tree", "create t/a/b/g", "write t/a/b/g")

	// A directory moved within the tree is followed under its new name.
	if err := os.Rename(filepath.Join(dir, "later"), filepath.Join(dir, "sub/moved")); err != nil {
		t.Fatal(err)
	}
	w.expect("move within", "rename later", "create sub/moved")
	write(t, filepath.Join(dir, "sub/moved/y"), "y")
	w.expect("in the moved directory", "create sub/moved/y", "write sub/moved/y")

	// One moved away is no longer watched.
	if err := os.Rename(filepath.Join(dir, "sub/moved"), filepath.Join(away, "gone")); err != nil {
		t.Fatal(err)
	}
	w.expect("move out", "rename sub/moved")
	write(t, filepath.Join(away, "gone/z"), "z")
	w.expect("in a directory moved away")

	// One moved in is watched.
	os.MkdirAll(filepath.Join(away, "in/deep"), 0o755)
	if err := os.Rename(filepath.Join(away, "in"), filepath.Join(dir, "in")); err != nil {
		t.Fatal(err)
	}
	w.expect("move in", "create in")
	write(t, filepath.Join(dir, "in/deep/q"), "q")
	w.expect("in a directory moved in", "create in/deep/q", "write in/deep/q")

	// A removed subdirectory: its entries, then itself.
	os.RemoveAll(filepath.Join(dir, "t"))
	got = w.settle()
	if !slices.Contains(got, "remove t/a/b/f") || got[len(got)-1] != "remove t" {
		t.Fatalf("remove a tree: %q", got)
	}
}

// inotifyFDs counts this process's inotify descriptors.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// uploadedBytes is the size of the temporary upload file in dir (-1 if
// there is none).
func uploadedBytes(t *testing.T, dir string) int {
	t.Helper()
	for _, name := range uploads(t, dir) {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return int(fi.Size())
		}
	}
	return -1
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestWatchClosed: a client hanging up ends its watch (inotify instance,
// goroutines, connection), as does the agent stopping. Not parallel: it
// counts the process's descriptors.
func TestWatchClosed(t *testing.T) {
	root := sandboxRoot(t)
	dir := filepath.Join(root, "home/user")
	a := startAgent(t, Config{Root: root})
	srv := <-a.srv
	a.srv <- srv
	conns := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns)
	}
	before := inotifyFDs(t)

	w := watchDir(t, a, "~", dir, true)
	if n := inotifyFDs(t); n != before+1 {
		t.Fatalf("%d inotify descriptors with a watch, %d before", n, before)
	}
	w.expect("nothing yet")
	w.nc.Close()
	waitFor(t, "the watch to end", func() bool { return inotifyFDs(t) == before && conns() == 0 })
	write(t, filepath.Join(dir, "after"), "x") // nothing to report it to

	// A watch open when the agent stops.
	watchDir(t, a, "~", dir, false)
	if inotifyFDs(t) != before+1 {
		t.Fatal("no inotify descriptor")
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if n := inotifyFDs(t); n != before {
		t.Fatalf("%d inotify descriptors after the agent stopped, %d before", n, before)
	}
}

func TestWatchErrors(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	write(t, filepath.Join(home, "file.txt"), "x")
	symlink(t, "nowhere", filepath.Join(home, "dangling"))
	a := startAgent(t, Config{Root: root})
	for _, tt := range []struct{ path, code string }{
		{"missing", agentproto.CodeNotFound},
		{"dangling", agentproto.CodeNotFound},
		{"file.txt", agentproto.CodeNotDir},
		{"file.txt/x", agentproto.CodeNotDir},
		{"", agentproto.CodeBadRequest},
	} {
		r := a.call(t, agentproto.Request{Op: agentproto.OpFileWatch, Path: tt.path})
		if r.done.Code != tt.code || len(r.events) != 0 {
			t.Errorf("watch %q: done %+v, events %+v; want %s", tt.path, r.done, r.events, tt.code)
		}
		if strings.Contains(r.done.Message, root) {
			t.Errorf("message names the host path: %q", r.done.Message)
		}
	}
}

// TestWatchConfinement: a watch through a symlink or ".." out of Root
// watches the same path inside Root, and a recursive watch does not
// follow a symlink to a host directory. Each naive path is first shown to
// reach the host directory.
func TestWatchConfinement(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	outside := t.TempDir()                 // a host directory ...
	inside := filepath.Join(root, outside) // ... and its namesake inside Root
	os.MkdirAll(inside, 0o755)
	symlink(t, outside, filepath.Join(home, "outlink"))
	up := strings.Repeat("../", strings.Count(root, "/")+3) + strings.TrimPrefix(outside, "/")
	a := startAgent(t, Config{Root: root})

	write(t, filepath.Join(outside, "probe"), "host")
	for _, naive := range []string{filepath.Join(home, "outlink", "probe"), filepath.Join(home, up, "probe")} {
		if b, err := os.ReadFile(naive); string(b) != "host" {
			t.Fatalf("the naive path %s does not reach the host directory (%q, %v): the test proves nothing", naive, b, err)
		}
	}

	for i, p := range []string{"outlink", up} {
		w := watchDir(t, a, p, inside, false)
		name := fmt.Sprint("file-", i)
		write(t, filepath.Join(outside, name), "h")
		write(t, filepath.Join(inside, name), "s")
		w.expect("watch "+p, "create "+name, "write "+name)
		w.nc.Close()
	}

	// Recursive over a symlink to the host directory: not followed.
	w := watchDir(t, a, "~", home, true)
	write(t, filepath.Join(outside, "host-file2"), "h")
	w.expect("host directory behind a symlink")
	write(t, filepath.Join(home, "outlink-not-followed"), "x")
	w.expect("a file of the watched tree", "create outlink-not-followed", "write outlink-not-followed")
}

func TestWatchIncludeEntry(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	a := startAgent(t, Config{Root: root})
	s := a.open(t, agentproto.Request{Op: agentproto.OpFileWatch, Path: "~", IncludeEntry: true})
	if ev := s.next(); ev.Type != agentproto.EventWatchStart {
		t.Fatalf("first event %+v", ev)
	}
	a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "e.txt", Metadata: map[string]string{"k": "v"}},
		strings.NewReader("entry")).mustOK(t)
	for _, op := range []string{agentproto.FSCreate, agentproto.FSWrite} {
		ev := s.next()
		e := ev.Entry
		if fsEv(ev) != op+" e.txt" || e == nil || e.Path != "/home/user/e.txt" || e.Size != 5 || e.Owner != "tester" || e.Metadata["k"] != "v" {
			t.Fatalf("event %s, entry %+v", fsEv(ev), e)
		}
	}
	a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "e.txt"}).mustOK(t)
	if ev := s.next(); fsEv(ev) != "remove e.txt" || ev.Entry != nil {
		t.Fatalf("remove: %s, entry %+v", fsEv(ev), ev.Entry)
	}
}

func TestFileMetadata(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	home := filepath.Join(root, "home/user")
	a := startAgent(t, Config{Root: root})
	xattr := func(name string) string {
		t.Helper()
		buf := make([]byte, 256)
		n, err := unix.Getxattr(filepath.Join(home, "m.txt"), name, buf)
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(buf[:n])
	}
	md := map[string]string{"origin": "suite", "kind": "note", "empty": ""}
	r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "m.txt", Metadata: md}, strings.NewReader("m")).mustOK(t)
	if !equalMD(r.done.Entry.Metadata, md) {
		t.Fatalf("write entry metadata %v", r.done.Entry.Metadata)
	}
	if xattr("user.e2b.origin") != "suite" || xattr("user.e2b.empty") != "" {
		t.Fatalf("xattrs on disk: %q %q", xattr("user.e2b.origin"), xattr("user.e2b.empty"))
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "m.txt"}).mustOK(t)
	if !equalMD(r.done.Entry.Metadata, md) {
		t.Fatalf("stat metadata %v", r.done.Entry.Metadata)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "~"}).mustOK(t)
	if len(r.done.Entries) != 1 || !equalMD(r.done.Entries[0].Metadata, md) {
		t.Fatalf("list %+v", r.done.Entries)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "m.txt"}).mustOK(t)
	if len(r.events) != 1 || !equalMD(r.events[0].Entry.Metadata, md) {
		t.Fatalf("read %+v", r.events)
	}

	// Other attributes are not metadata; user.e2b.* set by anyone is.
	unix.Setxattr(filepath.Join(home, "m.txt"), "user.other", []byte("o"), 0)
	unix.Setxattr(filepath.Join(home, "m.txt"), "user.e2b.outside", []byte("band"), 0)
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "m.txt"}).mustOK(t)
	if !equalMD(r.done.Entry.Metadata, map[string]string{"origin": "suite", "kind": "note", "empty": "", "outside": "band"}) {
		t.Fatalf("stat metadata %v", r.done.Entry.Metadata)
	}

	// A rewrite replaces the whole set; one without metadata leaves none.
	r = a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "m.txt", Metadata: map[string]string{"kind": "other"}}, strings.NewReader("2")).mustOK(t)
	if !equalMD(r.done.Entry.Metadata, map[string]string{"kind": "other"}) || xattr("user.e2b.origin") != "<no data available>" {
		t.Fatalf("rewritten: %v, origin %q", r.done.Entry.Metadata, xattr("user.e2b.origin"))
	}
	r = a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "m.txt"}, strings.NewReader("3")).mustOK(t)
	if r.done.Entry.Metadata != nil || xattr("user.e2b.kind") != "<no data available>" {
		t.Fatalf("rewritten without metadata: %v", r.done.Entry.Metadata)
	}

	// Directories have metadata too (set by others); symlinks never.
	os.Mkdir(filepath.Join(home, "d"), 0o755)
	unix.Setxattr(filepath.Join(home, "d"), "user.e2b.dir", []byte("yes"), 0)
	symlink(t, "d", filepath.Join(home, "link"))
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "d"}).mustOK(t)
	if r.done.Entry.Metadata["dir"] != "yes" {
		t.Fatalf("dir metadata %v", r.done.Entry.Metadata)
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "link"}).mustOK(t)
	if r.done.Entry.Metadata != nil {
		t.Fatalf("symlink metadata %v", r.done.Entry.Metadata)
	}

	for name, bad := range map[string]map[string]string{
		"empty key":   {"": "x"},
		"long key":    {strings.Repeat("k", 250): "x"},
		"NUL":         {"a\x00b": "x"},
		"large value": {"big": strings.Repeat("v", 65<<10)},
		"many keys":   manyKeys(65),
	} {
		r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "bad.txt", Metadata: bad}, strings.NewReader("x"))
		if r.done.Code != agentproto.CodeBadRequest {
			t.Errorf("%s: %+v", name, r.done)
		}
		if _, err := os.Lstat(filepath.Join(home, "bad.txt")); !os.IsNotExist(err) {
			t.Errorf("%s: file written (%v)", name, err)
		}
	}
}

func manyKeys(n int) map[string]string {
	md := map[string]string{}
	for i := range n {
		md[fmt.Sprint("k", i)] = "v"
	}
	return md
}

func equalMD(a, b map[string]string) bool { return maps.Equal(a, b) }

// inotifyWatches returns how many watches the inotify descriptors of this
// process that are not in skip hold, from their fdinfo.
func inotifyWatches(t *testing.T, skip map[string]bool) (fds, watches int) {
	t.Helper()
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l != "anon_inode:inotify" || skip[e.Name()] {
			continue
		}
		fds++
		info, _ := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		watches += strings.Count(string(info), "inotify wd:")
	}
	return fds, watches
}

// TestWatchSkipsProc: a recursive watch does not descend into /proc (or
// other kernel filesystems) below it. Needs root (a bind mount); not
// parallel (it reads the process's descriptors).
func TestWatchSkipsProc(t *testing.T) {
	testutil.RequireRoot(t)
	root := sandboxRoot(t)
	dir := filepath.Join(root, "home/user/w")
	os.MkdirAll(filepath.Join(dir, "proc"), 0o755)
	os.MkdirAll(filepath.Join(dir, "real/sub"), 0o755)
	if err := unix.Mount("/proc", filepath.Join(dir, "proc"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "proc"), unix.MNT_DETACH) })
	if ents, _ := os.ReadDir(filepath.Join(dir, "proc")); len(ents) < 20 {
		t.Fatalf("the bind mount of /proc shows %d entries: the test proves nothing", len(ents))
	}
	skip := map[string]bool{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		skip[e.Name()] = true
	}
	a := startAgent(t, Config{Root: root})
	w := watchDir(t, a, "w", dir, true)
	if fds, watches := inotifyWatches(t, skip); fds != 1 || watches != 3 { // w, real, real/sub
		t.Fatalf("%d inotify descriptors holding %d watches; want 1 holding 3", fds, watches)
	}
	write(t, filepath.Join(dir, "real/sub/f"), "f")
	w.expect("still watching the rest", "create real/sub/f", "write real/sub/f")
}
