package agent

import (
	"errors"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Bounds of file.watch; variables so that tests can change them.
var (
	// maxWatchDirs caps the directories one recursive watch follows;
	// deeper or later ones past it go unwatched (inotify watches are a
	// per-user kernel resource).
	maxWatchDirs = 8192
	// writeInterval spaces the write events of one file: the first write
	// is reported at once, later ones at most once per interval, and the
	// last one always (when the writer closes the file, or after the
	// interval).
	writeInterval = time.Second
)

// watchMask is what file.watch asks inotify for. IN_EXCL_UNLINK: nothing
// about files already unlinked; IN_ONLYDIR: the watch is on a directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_EXCL_UNLINK | unix.IN_ONLYDIR

// Upload temporaries (see fileWrite) are the agent's own: a watch hides
// them and reports their final rename as the write it stands for. Their
// names say whether the upload replaces a file (w) or creates one (c).
const (
	uploadReplaces = uploadPrefix + "w-"
	uploadCreates  = uploadPrefix + "c-"
)

// uploadTemp names the temporary file of an upload.
func uploadTemp(replaces bool) string {
	if replaces {
		return uploadReplaces + newContextID()
	}
	return uploadCreates + newContextID()
}

// watch is the state of one file.watch.
//
// Every directory is watched through a descriptor opened inside the root
// (openat2 for the watched directory, openat with O_NOFOLLOW for those
// below it) and handed to inotify as its /proc/self/fd link, which names
// that inode and nothing else: no path is resolved twice, and no symlink
// leads a watch out of the root.
type watch struct {
	s    *server
	c    *conn
	root string // the watched directory's sandbox path
	req  *agentproto.Request
	f    *os.File // the inotify instance, non-blocking (in the runtime poller)

	rootWD int
	dirs   map[int]string // watch descriptor -> directory relative to root ("" for root)
	// uploads holds the kinds of upload temporaries moved away, by cookie,
	// until their IN_MOVED_TO.
	uploads map[uint32]string
	// writes holds, per name, when its last write event was sent and
	// whether writes came since.
	writes map[string]*writeState
	names  *idNames // for entries; read once per batch of events
}

type writeState struct {
	sent    time.Time
	pending bool
}

func (s *server) fileWatch(c *conn, req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	dfd, err := s.files.open(sp, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return failErr(sp, err)
	}
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		unix.Close(dfd)
		if err == unix.EMFILE { // inotify's max_user_instances, or RLIMIT_NOFILE
			return fail(agentproto.CodeInternal, "%s: too many watches in this sandbox", sp)
		}
		return failErr(sp, err)
	}
	w := &watch{
		s: s, c: c, root: sp, req: req,
		f:       os.NewFile(uintptr(ifd), "inotify"),
		dirs:    map[int]string{},
		uploads: map[uint32]string{},
		writes:  map[string]*writeState{},
	}
	defer w.f.Close()
	w.rootWD, err = w.addTree(dfd, "", false)
	if err == unix.ENOSPC { // inotify's max_user_watches
		return fail(agentproto.CodeInternal, "%s: too many watches in this sandbox", sp)
	}
	if err != nil {
		return failErr(sp, err)
	}

	// The client's hanging up (or the agent stopping) closes the inotify
	// instance, which ends the read below.
	stop, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(closed)
		select {
		case <-c.hangup():
		case <-s.ctx.Done():
		case <-stop:
		}
		w.f.Close()
	}()
	defer func() { close(stop); <-closed }()

	if err := c.send(agentproto.Event{Type: agentproto.EventWatchStart}); err != nil {
		return agentproto.Event{}
	}
	return w.loop()
}

// loop reads and reports events until the client leaves (a zero Event)
// or the watched directory is gone (a Done).
func (w *watch) loop() agentproto.Event {
	buf := make([]byte, 64<<10)
	for {
		w.f.SetReadDeadline(w.nextFlush())
		n, err := w.f.Read(buf)
		w.names = nil
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if w.flushWrites(time.Now()) != nil {
				return agentproto.Event{}
			}
			continue
		case err != nil:
			return agentproto.Event{} // closed: the client is gone
		}
		end, err := w.batch(buf[:n])
		if err != nil {
			return agentproto.Event{}
		}
		if end {
			return ok()
		}
	}
}

// batch reports one read of inotify events. It returns end once the
// watched directory itself is gone, and the error of a failed send.
func (w *watch) batch(b []byte) (end bool, err error) {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		size := unix.SizeofInotifyEvent + int(ev.Len)
		if size > len(b) {
			break
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:size]), "\x00")
		b = b[size:]
		if end, err = w.event(int(ev.Wd), ev.Mask, ev.Cookie, name); end || err != nil {
			return end, err
		}
	}
	return false, nil
}

// event reports one inotify event.
func (w *watch) event(wd int, mask, cookie uint32, name string) (end bool, err error) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return false, w.send("", agentproto.FSOverflow)
	}
	dir, known := w.dirs[wd]
	if !known {
		return false, nil // a watch already dropped
	}
	if mask&unix.IN_IGNORED != 0 { // the watch is gone: its directory was removed
		delete(w.dirs, wd)
		return wd == w.rootWD, nil
	}
	if name == "" { // about a watched directory itself
		switch {
		case wd != w.rootWD: // its parent's watch reports it
		case mask&unix.IN_DELETE_SELF != 0:
			return false, w.send("", agentproto.FSRemove)
		case mask&unix.IN_MOVE_SELF != 0:
			return false, w.send("", agentproto.FSRename)
		}
		return false, nil
	}
	rel := path.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0

	if strings.HasPrefix(name, uploadPrefix) && !isDir {
		if mask&unix.IN_MOVED_FROM != 0 { // to its final name, presumably
			if len(w.uploads) > 64 {
				clear(w.uploads)
			}
			w.uploads[cookie] = name
		}
		return false, nil
	}

	switch {
	case mask&unix.IN_CREATE != 0:
		delete(w.writes, rel)
		if err := w.send(rel, agentproto.FSCreate); err != nil {
			return false, err
		}
		if isDir && w.req.Recursive {
			return false, w.addNew(rel, true)
		}
	case mask&unix.IN_MOVED_TO != 0:
		delete(w.writes, rel)
		if tmp, ok := w.uploads[cookie]; ok {
			delete(w.uploads, cookie)
			return false, w.uploaded(rel, tmp)
		}
		if err := w.send(rel, agentproto.FSCreate); err != nil {
			return false, err
		}
		if isDir && w.req.Recursive {
			return false, w.addNew(rel, false)
		}
	case mask&unix.IN_MOVED_FROM != 0:
		delete(w.writes, rel)
		if isDir {
			w.dropTree(rel)
		}
		return false, w.send(rel, agentproto.FSRename)
	case mask&unix.IN_DELETE != 0:
		delete(w.writes, rel)
		return false, w.send(rel, agentproto.FSRemove)
	case mask&unix.IN_ATTRIB != 0:
		return false, w.send(rel, agentproto.FSChmod)
	case mask&unix.IN_MODIFY != 0:
		return false, w.modified(rel, time.Now())
	case mask&unix.IN_CLOSE_WRITE != 0:
		if st := w.writes[rel]; st != nil {
			delete(w.writes, rel)
			if st.pending {
				return false, w.send(rel, agentproto.FSWrite)
			}
		}
	}
	return false, nil
}

// uploaded reports an upload's temporary renamed to rel as what writing
// rel in place would have shown: a create for a new file, then a write.
// The temporary of a move across filesystems (copyAcross) stands for a
// file moved in: a create.
func (w *watch) uploaded(rel, tmp string) error {
	replaces := strings.HasPrefix(tmp, uploadReplaces)
	if !replaces {
		if err := w.send(rel, agentproto.FSCreate); err != nil {
			return err
		}
	}
	if replaces || strings.HasPrefix(tmp, uploadCreates) {
		return w.send(rel, agentproto.FSWrite)
	}
	return nil
}

// modified reports a write to rel unless one was reported less than
// writeInterval ago; that one is then pending, sent when the writer
// closes the file or the interval ends.
func (w *watch) modified(rel string, now time.Time) error {
	st := w.writes[rel]
	if st != nil && now.Sub(st.sent) < writeInterval {
		st.pending = true
		return nil
	}
	if len(w.writes) >= 4096 {
		if err := w.flushWrites(time.Time{}); err != nil {
			return err
		}
		clear(w.writes)
	}
	w.writes[rel] = &writeState{sent: now}
	return w.send(rel, agentproto.FSWrite)
}

// nextFlush is when the earliest pending write is due (zero: none is).
func (w *watch) nextFlush() time.Time {
	var next time.Time
	for _, st := range w.writes {
		if due := st.sent.Add(writeInterval); st.pending && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	return next
}

// flushWrites sends the pending writes due by now (all when now is zero).
func (w *watch) flushWrites(now time.Time) error {
	for rel, st := range w.writes {
		if !st.pending || (!now.IsZero() && now.Before(st.sent.Add(writeInterval))) {
			continue
		}
		st.pending, st.sent = false, time.Now()
		if err := w.send(rel, agentproto.FSWrite); err != nil {
			return err
		}
	}
	return nil
}

// send writes one fs event, with the entry when asked for and it exists.
func (w *watch) send(rel, op string) error {
	ev := agentproto.Event{Type: agentproto.EventFS, FS: &agentproto.FSEvent{Name: rel, Op: op}}
	if w.req.IncludeEntry && op != agentproto.FSRemove && op != agentproto.FSRename && op != agentproto.FSOverflow {
		if w.names == nil {
			w.names = w.s.files.names()
		}
		if fi, err := w.s.files.stat(path.Join(w.root, rel), w.names); err == nil {
			ev.Entry = &fi
		}
	}
	return w.c.send(ev)
}

// addNew watches the directory rel that appeared under a watched one,
// with everything below it. created: it was just made, so entries found
// in it were made since and before its watch, and are reported as
// created (a create may then come twice); a directory moved in is only
// watched.
func (w *watch) addNew(rel string, created bool) error {
	fd, err := w.s.files.open(path.Join(w.root, rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil // gone or replaced meanwhile: its removal is reported
	}
	_, err = w.addTree(fd, rel, created)
	if errors.Is(err, errSendFailed) {
		return err
	}
	return nil
}

// errSendFailed marks a failure to write to the client within addTree.
var errSendFailed = errors.New("send failed")

// addTree watches the directory open at fd (taking ownership of fd) as
// rel and, for a recursive watch, every directory below it, never
// following a symlink. report sends a create for each entry found. It
// returns the watch descriptor of rel.
func (w *watch) addTree(fd int, rel string, report bool) (int, error) {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	wd, err := w.add(fd, rel)
	if err != nil || !w.req.Recursive {
		return wd, err
	}
	for {
		batch, rerr := f.Readdirnames(1024)
		for _, name := range batch {
			child := path.Join(rel, name)
			if report && !strings.HasPrefix(name, uploadPrefix) {
				if err := w.send(child, agentproto.FSCreate); err != nil {
					return wd, errSendFailed
				}
			}
			if len(w.dirs) >= maxWatchDirs {
				if report {
					continue
				}
				return wd, nil
			}
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue // not a directory (or a symlink to one), or gone
			}
			if pseudoFS(cfd) {
				unix.Close(cfd)
				continue
			}
			if _, err := w.addTree(cfd, child, report); errors.Is(err, errSendFailed) {
				return wd, err
			}
		}
		if rerr != nil {
			return wd, nil
		}
	}
}

// pseudoFS says whether the directory open at fd is on a kernel
// filesystem (/proc, /sys, cgroups...) whose entries come and go without
// inotify events: a recursive watch (say, of "/") does not descend into
// them, nor spend its watches there.
func pseudoFS(fd int) bool {
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil {
		return false
	}
	switch uint32(st.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC:
		return true
	}
	return false
}

// add hands the directory open at fd to inotify as rel.
func (w *watch) add(fd int, rel string) (int, error) {
	var wd int
	var err error
	rc, cerr := w.f.SyscallConn()
	if cerr != nil {
		return -1, cerr
	}
	// Control keeps the inotify descriptor open for the call, even if the
	// client's leaving closes it meanwhile.
	cerr = rc.Control(func(ifd uintptr) {
		wd, err = unix.InotifyAddWatch(int(ifd), "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	})
	if cerr != nil {
		return -1, cerr
	}
	if err != nil {
		return -1, err
	}
	w.dirs[wd] = rel // the same directory seen again under another name: the new one
	return wd, nil
}

// dropTree stops watching rel and everything below it (it moved away; if
// it moved within the watched tree, its IN_MOVED_TO watches it anew).
func (w *watch) dropTree(rel string) {
	for wd, d := range w.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			rc, err := w.f.SyscallConn()
			if err == nil {
				rc.Control(func(ifd uintptr) { unix.InotifyRmWatch(int(ifd), uint32(wd)) })
			}
			delete(w.dirs, wd)
		}
	}
}
