// Package volume reaches a persistent volume's files from the host,
// without a sandbox (the server's /v1/volumes/{name}/files): read, write,
// list and remove, each confined to the volume.
//
// A volume's contents are its tenant's: its sandboxes plant symlinks,
// "..", FIFOs and hard links in it. So every path is resolved by the
// kernel from a descriptor of the volume's root with openat2
// RESOLVE_IN_ROOT (a symlink or ".." never climbs above the root: an
// absolute link target starts at the volume's root),
// RESOLVE_NO_MAGICLINKS (no /proc links) and RESOLVE_NO_XDEV (no other
// mount is crossed); the volume is a filesystem of its own, so nothing of
// the host can be linked into it. Files are opened non-blocking and
// refused unless regular (a FIFO does not stall a read or a write), and
// directories are listed with fstatat relative to their descriptor,
// never by a host path. What the host creates takes the volume's owner
// (the sandboxes' "user"), so that sandboxes write it too.
//
// Imports: the standard library, x/sys/unix, and api (its entries are
// api.VolumeFile).
package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/api"
)

// Entry is a file or directory of a volume.
type Entry = api.VolumeFile

// Errors, for the caller to map.
var (
	ErrNotFound    = errors.New("no such file or directory in the volume")
	ErrNotRegular  = errors.New("not a regular file")
	ErrIsDir       = errors.New("is a directory")
	ErrNotDir      = errors.New("not a directory")
	ErrNotEmpty    = errors.New("the directory is not empty")
	ErrFull        = errors.New("the volume is full")
	ErrBadPath     = errors.New("bad path")
	ErrTooMany     = errors.New("the directory holds more entries than a listing shows")
	ErrFileTooLong = errors.New("the file is larger than the limit")
)

// FS is one volume's files, from its root's descriptor.
type FS struct {
	root     *os.File
	uid, gid int
}

// New returns the files under root (an open directory, which FS closes
// with Close); what it creates belongs to uid and gid.
func New(root *os.File, uid, gid int) *FS { return &FS{root: root, uid: uid, gid: gid} }

// Close closes the root.
func (f *FS) Close() error { return f.root.Close() }

// clean makes p a path from the root: "/" alone for the root itself.
func clean(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", ErrBadPath
	}
	return path.Clean("/" + p), nil
}

// rel is p (clean) relative to the root, for openat2.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return ErrNotFound
	case errors.Is(err, unix.EISDIR):
		return ErrIsDir
	case errors.Is(err, unix.ENOTDIR):
		return ErrNotDir
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		return ErrNotEmpty
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return ErrFull
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ENXIO):
		return fmt.Errorf("%w: %v", ErrBadPath, err)
	}
	return err
}

// open resolves p from the root (see the package doc).
func (f *FS) open(p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for range 64 {
		fd, err := unix.Openat2(int(f.root.Fd()), rel(p), &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // EAGAIN: a rename raced a ".."
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

func entryOf(p string, st *unix.Stat_t) Entry {
	e := Entry{Name: path.Base(p), Path: p, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix()).UTC()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = "file"
	case unix.S_IFDIR:
		e.Type, e.Size = "dir", 0
	case unix.S_IFLNK:
		e.Type = "symlink"
	default:
		e.Type = "other"
	}
	if p == "/" {
		e.Name = "/"
	}
	return e
}

// Open opens the regular file at p for reading, with its entry.
func (f *FS) Open(p string) (*os.File, Entry, error) {
	p, err := clean(p)
	if err != nil {
		return nil, Entry{}, err
	}
	fd, err := f.open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, Entry{}, mapErr(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, Entry{}, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		unix.Close(fd)
		return nil, Entry{}, ErrIsDir
	default:
		unix.Close(fd)
		return nil, Entry{}, ErrNotRegular
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY); err != nil {
		unix.Close(fd)
		return nil, Entry{}, err
	}
	return os.NewFile(uintptr(fd), p), entryOf(p, &st), nil
}

// mkdirs makes the directories of dir that are missing, owned by the
// volume's owner.
func (f *FS) mkdirs(dir string) error {
	if dir == "/" {
		return nil
	}
	fd, err := f.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		unix.Close(fd)
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return mapErr(err)
	}
	parent := path.Dir(dir)
	if err := f.mkdirs(parent); err != nil {
		return err
	}
	pfd, err := f.open(parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return mapErr(err)
	}
	defer unix.Close(pfd)
	name := path.Base(dir)
	if err := unix.Mkdirat(pfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return mapErr(err)
	}
	return mapErr(unix.Fchownat(pfd, name, f.uid, f.gid, unix.AT_SYMLINK_NOFOLLOW))
}

// Write writes r, at most max bytes (ErrFileTooLong past them), to the
// regular file at p, made with its missing directories when absent (the
// volume's owner's, mode 0644) and replaced when present.
func (f *FS) Write(p string, r io.Reader, max int64) (Entry, error) {
	p, err := clean(p)
	if err != nil {
		return Entry{}, err
	}
	if p == "/" {
		return Entry{}, ErrIsDir
	}
	if err := f.mkdirs(path.Dir(p)); err != nil {
		return Entry{}, err
	}
	made := true
	fd, err := f.open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NONBLOCK|unix.O_NOCTTY, 0o644)
	if errors.Is(err, unix.EEXIST) {
		made = false
		fd, err = f.open(p, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	}
	if err != nil {
		return Entry{}, mapErr(err)
	}
	file := os.NewFile(uintptr(fd), p)
	defer file.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Entry{}, ErrNotRegular
	}
	if made {
		if err := file.Chown(f.uid, f.gid); err != nil {
			return Entry{}, err
		}
	}
	if err := file.Truncate(0); err != nil {
		return Entry{}, mapErr(err)
	}
	n, err := io.Copy(file, io.LimitReader(r, max+1))
	if err == nil && n > max {
		err = ErrFileTooLong
	}
	if err != nil {
		file.Truncate(0)
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return Entry{}, mapErr(err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, err
	}
	return entryOf(p, &st), nil
}

// List lists the directory at p, at most max entries (ErrTooMany past
// them), in the order the filesystem gives.
func (f *FS) List(p string, max int) ([]Entry, error) {
	p, err := clean(p)
	if err != nil {
		return nil, err
	}
	fd, err := f.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, mapErr(err)
	}
	dir := os.NewFile(uintptr(fd), p)
	defer dir.Close()
	names, err := dir.Readdirnames(max + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(names) > max {
		return nil, ErrTooMany
	}
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		out = append(out, entryOf(path.Join(p, n), &st))
	}
	return out, nil
}

// Remove removes the file, symlink or empty directory at p (a symlink
// itself, never what it names).
func (f *FS) Remove(p string) error {
	p, err := clean(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: the volume's root cannot be removed", ErrBadPath)
	}
	pfd, err := f.open(path.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return mapErr(err)
	}
	defer unix.Close(pfd)
	name := path.Base(p)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return mapErr(err)
	}
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	return mapErr(unix.Unlinkat(pfd, name, flags))
}
