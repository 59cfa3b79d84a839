package ociimage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// whiteoutPrefix marks a name an unpacker reads as a deletion
// (whiteout) rather than as a file.
const whiteoutPrefix = ".wh."

// treeWriter writes tar entries for host files.
type treeWriter struct {
	tw    *tar.Writer
	ids   idRange
	links map[fileID]string // a hard-linked inode's first name in the layer
	buf   []byte
	xbuf  []byte
	n     int // entries written
}

type fileID struct{ dev, ino uint64 }

func newTreeWriter(tw *tar.Writer, ids idRange) *treeWriter {
	return &treeWriter{tw: tw, ids: ids, links: map[fileID]string{}, buf: make([]byte, copyBuffer), xbuf: make([]byte, 1024)}
}

// addTree writes an entry for everything under root (not root itself),
// in lexical path order, and returns the number of entries and the paths
// of the sockets it left out.
func addTree(ctx context.Context, tw *tar.Writer, root string, ids idRange) (int, []string, error) {
	w := newTreeWriter(tw, ids)
	root = filepath.Clean(root)
	var rst unix.Stat_t
	if err := unix.Lstat(root, &rst); err != nil {
		return 0, nil, &fs.PathError{Op: "lstat", Path: root, Err: err}
	}
	if rst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, nil, fmt.Errorf("%s is not a directory", root)
	}
	var skipped []string
	// WalkDir visits each directory's entries sorted by name.
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), whiteoutPrefix) {
			return fmt.Errorf("%s: a name starting with %q would be read as a deletion (whiteout) in a layer", p, whiteoutPrefix)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Dev != rst.Dev {
			return fmt.Errorf("%s is on another filesystem than %s (a mount point?)", p, root)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		ok, err := w.entry(p, filepath.ToSlash(rel), &st)
		if err != nil {
			return err
		}
		if !ok {
			skipped = append(skipped, p)
		}
		return nil
	})
	return w.n, skipped, err
}

// entry writes the entry called name for host file p, whose lstat is st;
// false for a socket, which it leaves out.
func (w *treeWriter) entry(p, name string, st *unix.Stat_t) (bool, error) {
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFSOCK {
		return false, nil
	}
	uid, uok := w.ids.unshift(st.Uid)
	gid, gok := w.ids.unshift(st.Gid)
	if !uok || !gok {
		return false, fmt.Errorf("%s: %w: %d:%d is not in %d..%d", p, ErrOwner, st.Uid, st.Gid,
			w.ids.host, uint64(w.ids.host)+uint64(w.ids.n)-1)
	}
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(uid),
		Gid:     int(gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
	}
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		id := fileID{dev: st.Dev, ino: st.Ino}
		if first, ok := w.links[id]; ok {
			// hdr keeps the inode's mode, owner and mtime, which
			// unpackers apply to the linked inode.
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return true, w.write(hdr)
		}
		w.links[id] = name
	}
	switch typ {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case unix.S_IFREG:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
	case unix.S_IFLNK:
		target, err := os.Readlink(p)
		if err != nil {
			return false, err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if typ == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return false, fmt.Errorf("%s: unknown file type %#o", p, typ)
	}
	if err := w.xattrs(p, hdr); err != nil {
		return false, err
	}
	if typ == unix.S_IFREG {
		return true, w.regular(p, hdr, st)
	}
	return true, w.write(hdr)
}

func (w *treeWriter) write(hdr *tar.Header) error {
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	w.n++
	return nil
}

// regular writes hdr and the contents of p, checking that it is the file
// st describes and that it does not change while it is read.
func (w *treeWriter) regular(p string, hdr *tar.Header, st *unix.Stat_t) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var before unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	if before.Dev != st.Dev || before.Ino != st.Ino || before.Size != st.Size {
		return fmt.Errorf("%s changed while the tree was read", p)
	}
	if err := w.write(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(w.tw, io.LimitReader(f, st.Size), w.buf)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	var after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &after); err != nil {
		return &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	if n != st.Size || after.Size != st.Size || after.Mtim != st.Mtim {
		return fmt.Errorf("%s changed while it was read", p)
	}
	return nil
}

// xattrs puts the extended attributes of p worth keeping into hdr.
func (w *treeWriter) xattrs(p string, hdr *tar.Header) error {
	names, err := w.listXattrs(p)
	if err != nil {
		return err
	}
	for _, name := range names {
		switch {
		case name == capabilityXattr, strings.HasPrefix(name, "user."):
		case strings.HasPrefix(name, "system.posix_acl_"):
			return fmt.Errorf("%s has a POSIX ACL (%s), whose host ids are not unshifted; remove it (setfacl -b)", p, name)
		default:
			continue // security.selinux, trusted.*, ...: the host's, not the image's
		}
		v, err := getXattr(p, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the list
		}
		if err != nil {
			return &fs.PathError{Op: "getxattr " + name, Path: p, Err: err}
		}
		if name == capabilityXattr {
			if v, err = unshiftCapability(v, w.ids); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v)
	}
	return nil
}

// listXattrs returns the names of p's extended attributes (none where the
// filesystem has none).
func (w *treeWriter) listXattrs(p string) ([]string, error) {
	for {
		n, err := unix.Llistxattr(p, w.xbuf)
		switch {
		case errors.Is(err, unix.ERANGE):
			size, err := unix.Llistxattr(p, nil)
			if err != nil {
				return nil, &fs.PathError{Op: "listxattr", Path: p, Err: err}
			}
			w.xbuf = make([]byte, size+64)
			continue
		case errors.Is(err, unix.ENOTSUP):
			return nil, nil
		case err != nil:
			return nil, &fs.PathError{Op: "listxattr", Path: p, Err: err}
		}
		var names []string
		for _, s := range strings.Split(string(w.xbuf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := unix.Lgetxattr(p, name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, size+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// addFiles writes the entries of the second layer: the parent directories
// of the files' paths (with their metadata from rootfs where they exist
// there, else root's 0755), then each file, owned by root, and its hard
// links. Every time but the parents' is mtime.
func addFiles(tw *tar.Writer, rootfs string, ids idRange, files []File, mtime time.Time) (int, error) {
	w := newTreeWriter(tw, ids)
	mtime = mtime.Truncate(time.Second)
	parents := map[string]bool{}
	for _, f := range files {
		for _, p := range append([]string{f.Path}, f.Links...) {
			for d := path.Dir(p); d != "/"; d = path.Dir(d) {
				parents[d] = true
			}
		}
	}
	// Sorted, a directory comes before what is in it: an ancestor that is
	// not a directory in rootfs stops the loop before its children are
	// looked at through it.
	for _, d := range slices.Sorted(maps.Keys(parents)) {
		host := filepath.Join(rootfs, d)
		var st unix.Stat_t
		err := unix.Lstat(host, &st)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if _, err := w.entry(host, d[1:], &st); err != nil {
				return w.n, err
			}
		case err == nil:
			return w.n, fmt.Errorf("%s is not a directory in the root filesystem (mode %#o)", d, st.Mode)
		case errors.Is(err, unix.ENOENT):
			if err := w.write(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return w.n, err
			}
		default:
			return w.n, &fs.PathError{Op: "lstat", Path: host, Err: err}
		}
	}
	for _, f := range files {
		for _, p := range append([]string{f.Path}, f.Links...) {
			if fi, err := os.Lstat(filepath.Join(rootfs, p)); err == nil && fi.IsDir() {
				return w.n, fmt.Errorf("%s is a directory in the root filesystem", p)
			}
		}
		if err := w.addFile(f, mtime); err != nil {
			return w.n, err
		}
		for _, l := range f.Links {
			// Unpackers (containerd's among them) give the linked inode a
			// link entry's mode, owner and mtime: they must be the file's.
			if err := w.write(&tar.Header{Typeflag: tar.TypeLink, Name: l[1:], Linkname: f.Path[1:],
				Mode: int64(f.Mode.Perm()), ModTime: mtime}); err != nil {
				return w.n, err
			}
		}
	}
	return w.n, nil
}

func (w *treeWriter) addFile(f File, mtime time.Time) error {
	src, err := os.Open(f.Source)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", f.Source)
	}
	if err := w.write(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: int64(f.Mode.Perm()),
		Size: fi.Size(), ModTime: mtime}); err != nil {
		return err
	}
	n, err := io.CopyBuffer(w.tw, io.LimitReader(src, fi.Size()), w.buf)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Source, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("%s changed while it was read", f.Source)
	}
	return nil
}
