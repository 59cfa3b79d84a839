package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Bounds of file.list; variables so that tests can lower them.
var (
	// maxListEntries caps one listing (Done.Truncated reports the cut).
	maxListEntries = 10000
	// maxListDepth caps Request.Depth.
	maxListDepth = 64
)

// uploadPrefix starts the names of the temporary files of file.write.
const uploadPrefix = ".sheepfold-upload-"

// fileSystem performs file operations confined to a root directory.
//
// Paths come in as sandbox paths (absolute once resolved against home, and
// cleaned). Every lookup that may follow a symlink goes through openat2
// from the root descriptor with RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS: the
// kernel then treats the root as "/" for "..", absolute symlinks and
// symlink chains alike, and refuses /proc magic links. Operations on a
// final component that must not follow it (stat, unlink, mkdir, rename,
// readlink, create) use *at calls on its parent's descriptor with a single
// name, which cannot leave that directory.
type fileSystem struct {
	rootFD int
	home   string
	// slashRoot: the root is "/", which the sandbox itself confines, so a
	// kernel without openat2 may fall back to openat.
	slashRoot bool
}

func openFileSystem(root, home string) (*fileSystem, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "agent: open root", Path: root, Err: err}
	}
	return &fileSystem{rootFD: fd, home: home, slashRoot: filepath.Clean(root) == "/"}, nil
}

func (fs *fileSystem) Close() error { return unix.Close(fs.rootFD) }

var errEmptyPath = errors.New("empty path")

// resolve turns a request path into a cleaned absolute sandbox path:
// relative paths (and "~/...") start at home. The cleaning is lexical; the
// confinement is the kernel's, in open.
func (fs *fileSystem) resolve(p string) (string, error) {
	switch {
	case p == "":
		return "", errEmptyPath
	case hasNUL(p):
		return "", errors.New("NUL byte in path")
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = fs.home + p[1:]
	case !path.IsAbs(p):
		p = fs.home + "/" + p
	}
	return path.Clean(p), nil
}

// rel returns the sandbox path sp relative to the root descriptor.
func rel(sp string) string {
	if sp == "/" {
		return "."
	}
	return sp[1:]
}

// open opens the sandbox path sp inside the root, following symlinks
// within it.
func (fs *fileSystem) open(sp string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for range 64 {
		fd, err := unix.Openat2(fs.rootFD, rel(sp), &how)
		switch err {
		case unix.EINTR, unix.EAGAIN: // EAGAIN: a concurrent rename raced a ".."
			continue
		case unix.ENOSYS:
			if fs.slashRoot {
				return unix.Openat(fs.rootFD, rel(sp), flags|unix.O_CLOEXEC, 0)
			}
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// parent opens the directory holding sp and returns it with sp's name.
func (fs *fileSystem) parent(sp string) (int, string, error) {
	if sp == "/" {
		return -1, "", unix.EINVAL
	}
	fd, err := fs.open(path.Dir(sp), unix.O_PATH|unix.O_DIRECTORY)
	return fd, path.Base(sp), err
}

// lstat describes sp without following a final symlink; for a symlink it
// also returns the link's text. It also returns sp's metadata.
func (fs *fileSystem) lstat(sp string) (unix.Stat_t, string, map[string]string, error) {
	var st unix.Stat_t
	if sp == "/" {
		if err := unix.Fstat(fs.rootFD, &st); err != nil {
			return st, "", nil, err
		}
		return st, "", metadataOPath(fs.rootFD), nil
	}
	pfd, name, err := fs.parent(sp)
	if err != nil {
		return st, "", nil, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, "", nil, err
	}
	var target string
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target = readlinkat(pfd, name)
	}
	return st, target, metadataAt(pfd, name, &st), nil
}

func readlinkat(dirfd int, name string) string {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// names reads the sandbox's user and group names.
func (fs *fileSystem) names() *idNames {
	return &idNames{
		users:  parseIDFile(fs.readSmall("/etc/passwd")),
		groups: parseIDFile(fs.readSmall("/etc/group")),
	}
}

// readSmall returns up to 1 MiB of a regular file inside the root, or nil.
func (fs *fileSystem) readSmall(sp string) []byte {
	fd, err := fs.open(sp, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil
	}
	unix.SetNonblock(fd, false)
	f := os.NewFile(uintptr(fd), sp)
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return data
}

// fileInfo describes sp from its stat.
func fileInfo(sp string, st *unix.Stat_t, names *idNames, target string) agentproto.FileInfo {
	fi := agentproto.FileInfo{
		Name:    path.Base(sp),
		Path:    sp,
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		Owner:   names.user(st.Uid),
		Group:   names.group(st.Gid),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = agentproto.FileTypeFile
	case unix.S_IFDIR:
		fi.Type = agentproto.FileTypeDir
	case unix.S_IFLNK:
		fi.Type = agentproto.FileTypeSymlink
		// Reported as the absolute sandbox path the link names
		// (lexically), as E2B clients expect.
		if target != "" {
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(sp), target)
			}
			fi.SymlinkTarget = path.Clean(target)
		}
	default:
		fi.Type = agentproto.FileTypeOther
	}
	return fi
}

// stat returns sp's FileInfo.
func (fs *fileSystem) stat(sp string, names *idNames) (agentproto.FileInfo, error) {
	st, target, md, err := fs.lstat(sp)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	fi := fileInfo(sp, &st, names, target)
	fi.Metadata = md
	return fi, nil
}

// mkdirAll makes the directory sp and its missing parents (mode 0755).
// Through a dangling symlink it fails rather than create the target.
// mkdirAll makes directory sp and its missing parents; own, when not nil,
// is called on each directory it makes.
func (fs *fileSystem) mkdirAll(sp string, own func(pfd int, name string) error) error {
	fd, err := fs.open(sp, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil {
		unix.Close(fd)
		return nil
	}
	if err != unix.ENOENT || sp == "/" {
		return err
	}
	if err := fs.mkdirAll(path.Dir(sp), own); err != nil {
		return err
	}
	pfd, name, err := fs.parent(sp)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Mkdirat(pfd, name, 0o755)
	if err == nil && own != nil {
		err = own(pfd, name)
	}
	if err != nil && err != unix.EEXIST {
		return err
	}
	fd, err = fs.open(sp, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// resolveReq resolves a request path or returns a failed Done.
func (s *server) resolveReq(p string) (string, *agentproto.Event) {
	sp, err := s.files.resolve(p)
	if err != nil {
		ev := fail(agentproto.CodeBadRequest, "bad path %q: %v", p, err)
		return "", &ev
	}
	return sp, nil
}

func (s *server) fileStat(req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	fi, err := s.files.stat(sp, s.files.names())
	if err != nil {
		return failErr(sp, err)
	}
	ev := ok()
	ev.Entry = &fi
	return ev
}

func (s *server) fileRead(c *conn, req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	// O_NONBLOCK: opening a FIFO must not hang the agent; regular files
	// ignore it.
	fd, err := s.files.open(sp, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		return failErr(sp, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return failErr(sp, err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		unix.Close(fd)
		return failErr(sp, unix.EISDIR)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return fail(agentproto.CodeBadRequest, "%s: not a regular file", sp)
	case req.Limit > 0 && st.Size > req.Limit:
		unix.Close(fd)
		return fail(agentproto.CodeTooLarge, "%s: %d bytes, over the limit of %d", sp, st.Size, req.Limit)
	}
	unix.SetNonblock(fd, false)
	f := os.NewFile(uintptr(fd), sp)
	defer f.Close()

	fi := fileInfo(sp, &st, s.files.names(), "")
	fi.Metadata = metadataFD(fd)
	if err := c.send(agentproto.Event{Type: agentproto.EventFile, Entry: &fi}); err != nil {
		return agentproto.Event{}
	}
	buf := make([]byte, agentproto.DataChunk)
	var n int64
	var readErr error
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += int64(k)
			if req.Limit > 0 && n > req.Limit { // a file that grew, or a /proc file
				readErr = agentproto.ErrBodyTooLarge
				break
			}
			if err := c.sendData(buf[:k]); err != nil {
				return agentproto.Event{}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	if err := c.sendData(nil); err != nil {
		return agentproto.Event{}
	}
	if readErr != nil {
		return failErr(sp, readErr)
	}
	return ok()
}

func (s *server) fileWrite(c *conn, req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	if sp == "/" {
		return failErr(sp, unix.EISDIR)
	}
	if err := validMetadata(req.Metadata); err != nil {
		return fail(agentproto.CodeBadRequest, "%s: %v", sp, err)
	}
	mode := req.Mode & 0o777
	if mode == 0 {
		mode = 0o644
	}
	own := s.chowner(req)
	if err := s.files.mkdirAll(path.Dir(sp), own); err != nil {
		return failErr(path.Dir(sp), err)
	}
	pfd, name, err := s.files.parent(sp)
	if err != nil {
		return failErr(sp, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	exists := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	if exists && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return failErr(sp, unix.EISDIR) // before reading the body
	}

	// Write the body to a new file beside the target and rename it over
	// the target only once complete: a failed, aborted or oversized upload
	// leaves nothing behind. A symlink at the target is replaced, never
	// followed.
	tmp := uploadTemp(exists)
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return failErr(sp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = c.pc.ReadBody(f, req.Limit)
	if err == nil && own != nil {
		err = own(pfd, tmp)
	}
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if err == nil {
		err = s.setMetadata(fd, sp, req.Metadata)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, name)
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		if errors.Is(err, agentproto.ErrBodyTooLarge) {
			return fail(agentproto.CodeTooLarge, "%s: body over the limit of %d bytes", sp, req.Limit)
		}
		return failErr(sp, err)
	}
	fi, err := s.files.stat(sp, s.files.names())
	if err != nil {
		return failErr(sp, err)
	}
	ev := ok()
	ev.Entry = &fi
	return ev
}

func (s *server) fileMkdir(req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	if sp == "/" {
		return failErr(sp, unix.EEXIST)
	}
	mode := req.Mode & 0o1777
	if mode == 0 {
		mode = 0o755
	}
	own := s.chowner(req)
	if err := s.files.mkdirAll(path.Dir(sp), own); err != nil {
		return failErr(path.Dir(sp), err)
	}
	pfd, name, err := s.files.parent(sp)
	if err != nil {
		return failErr(sp, err)
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return failErr(sp, err)
	}
	if own != nil {
		if err := own(pfd, name); err != nil {
			return failErr(sp, err)
		}
	}
	// Set the mode exactly (no umask) on the directory just made.
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Fchmod(fd, mode)
		unix.Close(fd)
	}
	if err != nil {
		return failErr(sp, err)
	}
	fi, err := s.files.stat(sp, s.files.names())
	if err != nil {
		return failErr(sp, err)
	}
	ev := ok()
	ev.Entry = &fi
	return ev
}

// listing collects the entries of a file.list, in a stable order: each
// directory's entries by name (bytewise), a directory's contents right
// after it. A page resumes after the entry Request.After names.
type listing struct {
	names     *idNames
	max       int
	entries   []agentproto.FileInfo
	truncated bool
}

func (s *server) fileList(req *agentproto.Request) agentproto.Event {
	p := req.Path
	if p == "" {
		p = s.cfg.Home
	}
	sp, bad := s.resolveReq(p)
	if bad != nil {
		return *bad
	}
	var after []string
	if req.After != "" {
		rel, ok := strings.CutPrefix(path.Clean(req.After), strings.TrimSuffix(sp, "/")+"/")
		if !ok || !path.IsAbs(req.After) || rel == "" {
			return fail(agentproto.CodeBadRequest, "the cursor is not an entry of this listing")
		}
		after = strings.Split(rel, "/")
	}
	depth := min(max(req.Depth, 1), maxListDepth)
	fd, err := s.files.open(sp, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return failErr(sp, err)
	}
	l := &listing{names: s.files.names(), max: maxListEntries, entries: []agentproto.FileInfo{}}
	if req.Limit > 0 && req.Limit < int64(l.max) {
		l.max = int(req.Limit)
	}
	walk(fd, sp, depth, after, l)

	ev := ok()
	ev.Entries = l.entries
	ev.Truncated = l.truncated
	// The Done must fit in one frame.
	for len(ev.Entries) > 0 {
		b, err := json.Marshal(ev)
		if err == nil && len(b) < agentproto.MaxFrame-1 {
			break
		}
		ev.Entries = ev.Entries[:len(ev.Entries)/2]
		ev.Truncated = true
	}
	return ev
}

// walk lists the directory open at fd (and takes ownership of fd), down to
// depth levels, leaving out the entries up to and including the one
// after names (its path below dir, split; nil for none). It never follows
// a symlink: subdirectories are opened by a single name with O_NOFOLLOW
// relative to their parent.
func walk(fd int, dir string, depth int, after []string, l *listing) {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	slices.Sort(names)
	if after != nil {
		// Names before the cursor's (and their contents) were listed.
		i, _ := slices.BinarySearch(names, after[0])
		names = names[i:]
	}
	for _, name := range names {
		var below []string // the cursor's path inside this entry
		listed := false    // the entry itself was listed on an earlier page
		if after != nil {
			if name == after[0] {
				listed, below = true, after[1:]
			}
			after = nil // everything past the cursor's name follows it
		}
		if !listed && len(l.entries) >= l.max {
			l.truncated = true
			return
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue // vanished meanwhile
		}
		sp := path.Join(dir, name)
		if !listed {
			var target string
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				target = readlinkat(fd, name)
			}
			fi := fileInfo(sp, &st, l.names, target)
			fi.Metadata = metadataAt(fd, name, &st)
			l.entries = append(l.entries, fi)
		}
		if depth > 1 && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				if len(below) == 0 {
					below = nil
				}
				walk(cfd, sp, depth-1, below, l)
			}
		}
		if l.truncated {
			return
		}
	}
}

func (s *server) fileRemove(req *agentproto.Request) agentproto.Event {
	sp, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	if sp == "/" {
		return fail(agentproto.CodeBadRequest, "refusing to remove /")
	}
	pfd, name, err := s.files.parent(sp)
	if err != nil {
		return failErr(sp, err)
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil {
		return failErr(sp, err)
	}
	return ok()
}

// removeAt removes name in the directory dirfd, recursively for a
// directory, never following symlinks.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err != unix.EISDIR { // Linux's answer to unlinking a directory
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	for range 3 { // retry if files appear while we remove
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := removeAt(fd, n); err != nil && err != unix.ENOENT {
				return err
			}
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err != unix.ENOTEMPTY {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	return unix.ENOTEMPTY
}

func (s *server) fileMove(req *agentproto.Request) agentproto.Event {
	src, bad := s.resolveReq(req.Path)
	if bad != nil {
		return *bad
	}
	dst, bad := s.resolveReq(req.NewPath)
	if bad != nil {
		return *bad
	}
	if src == "/" || dst == "/" {
		return fail(agentproto.CodeBadRequest, "cannot move /")
	}
	if err := s.files.mkdirAll(path.Dir(dst), nil); err != nil {
		return failErr(path.Dir(dst), err)
	}
	opfd, oname, err := s.files.parent(src)
	if err != nil {
		return failErr(src, err)
	}
	defer unix.Close(opfd)
	npfd, nname, err := s.files.parent(dst)
	if err != nil {
		return failErr(dst, err)
	}
	defer unix.Close(npfd)
	err = unix.Renameat2(opfd, oname, npfd, nname, 0)
	if err == unix.ENOSYS {
		err = unix.Renameat(opfd, oname, npfd, nname)
	}
	if err == unix.EXDEV {
		err = copyAcross(opfd, oname, npfd, nname)
	}
	if err != nil {
		return failErr(src+" -> "+dst, err)
	}
	fi, err := s.files.stat(dst, s.files.names())
	if err != nil {
		return failErr(dst, err)
	}
	ev := ok()
	ev.Entry = &fi
	return ev
}

// copyAcross moves a regular file between filesystems (/tmp and /home/user
// are separate tmpfs mounts in a sandbox): copy beside the target, rename
// over it, then unlink the source. Anything else stays EXDEV.
func copyAcross(opfd int, oname string, npfd int, nname string) error {
	in, err := unix.Openat(opfd, oname, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ELOOP {
		return unix.EXDEV // a symlink
	}
	if err != nil {
		return err
	}
	inf := os.NewFile(uintptr(in), oname)
	defer inf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return unix.EXDEV
	}
	unix.SetNonblock(in, false)
	tmp := uploadPrefix + newContextID()
	out, err := unix.Openat(npfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	outf := os.NewFile(uintptr(out), tmp)
	_, err = io.Copy(outf, inf)
	if err == nil {
		err = unix.Fchmod(out, st.Mode&0o7777)
	}
	if cerr := outf.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(npfd, tmp, npfd, nname)
	}
	if err != nil {
		unix.Unlinkat(npfd, tmp, 0)
		return err
	}
	return unix.Unlinkat(opfd, oname, 0)
}

// File metadata: E2B keeps per-file metadata in user.e2b.<key> extended
// attributes. The kernel allows user.* attributes on regular files and
// directories only, so other entries have none.

// Bounds of Request.Metadata: the kernel's XATTR_NAME_MAX and
// XATTR_SIZE_MAX, and a count that keeps a FileInfo small.
const (
	maxMetadataKeys      = 64
	maxMetadataNameBytes = 255
	maxMetadataValue     = 64 << 10
)

// validMetadata checks Request.Metadata before a body is read.
func validMetadata(md map[string]string) error {
	if len(md) > maxMetadataKeys {
		return fmt.Errorf("%d metadata keys, over the limit of %d", len(md), maxMetadataKeys)
	}
	for k, v := range md {
		switch {
		case k == "":
			return errors.New("empty metadata key")
		case hasNUL(k) || hasNUL(v):
			return fmt.Errorf("NUL byte in metadata %q", k)
		case len(agentproto.MetadataXattrPrefix)+len(k) > maxMetadataNameBytes:
			return fmt.Errorf("metadata key %.20q... too long", k)
		case len(v) > maxMetadataValue:
			return fmt.Errorf("metadata %q: value over %d bytes", k, maxMetadataValue)
		}
	}
	return nil
}

// setMetadata stores md on the new file open at fd (which has no
// attributes yet). A filesystem without user attributes stores nothing:
// the FileInfo read back afterwards shows what was kept.
func (s *server) setMetadata(fd int, sp string, md map[string]string) error {
	for k, v := range md {
		err := unix.Fsetxattr(fd, agentproto.MetadataXattrPrefix+k, []byte(v), 0)
		switch err {
		case nil:
		case unix.EOPNOTSUPP:
			s.log.Warn("file metadata not stored: the filesystem has no user attributes", "path", sp)
			return nil
		case unix.E2BIG, unix.ERANGE:
			return unix.EINVAL // too large for this filesystem: a bad request
		default:
			return err
		}
	}
	return nil
}

// metadataFD returns the metadata of the file open at fd (not O_PATH).
func metadataFD(fd int) map[string]string {
	return readMetadata(
		func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		func(name string, buf []byte) (int, error) { return unix.Fgetxattr(fd, name, buf) })
}

// metadataOPath returns the metadata of the file or directory open at the
// O_PATH descriptor fd. The f*xattr calls refuse O_PATH descriptors, so
// this goes through the descriptor's /proc link, which names that very
// inode and no other.
func metadataOPath(fd int) map[string]string {
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	return readMetadata(
		func(buf []byte) (int, error) { return unix.Listxattr(p, buf) },
		func(name string, buf []byte) (int, error) { return unix.Getxattr(p, name, buf) })
}

// metadataAt returns the metadata of name in the directory dirfd, whose
// lstat is st, without following a symlink.
func metadataAt(dirfd int, name string, st *unix.Stat_t) map[string]string {
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var now unix.Stat_t
	if unix.Fstat(fd, &now) != nil || now.Dev != st.Dev || now.Ino != st.Ino {
		return nil // replaced meanwhile
	}
	return metadataOPath(fd)
}

// readMetadata collects the user.e2b.* attributes through list and get;
// nil when there are none (or they cannot be read).
func readMetadata(list func([]byte) (int, error), get func(string, []byte) (int, error)) map[string]string {
	names, err := xattrBuf(list)
	if err != nil || len(names) == 0 {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(strings.TrimSuffix(string(names), "\x00"), "\x00") {
		key, ok := strings.CutPrefix(name, agentproto.MetadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		v, err := xattrBuf(func(buf []byte) (int, error) { return get(name, buf) })
		if err != nil {
			continue // removed meanwhile
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(v)
		if len(md) == maxMetadataKeys {
			break
		}
	}
	return md
}

// xattrBuf calls an xattr list or get call with a buffer large enough,
// retrying if the value grew between the size query and the read.
func xattrBuf(call func([]byte) (int, error)) ([]byte, error) {
	for range 4 {
		n, err := call(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = call(buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return nil, unix.ERANGE
}
