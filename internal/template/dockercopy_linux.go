package template

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// COPY and ADD, and applying layers.
//
// Both sides are opened as os.Root: a path of the build context, and a
// destination in the half-built root filesystem, is resolved in its own
// tree, so neither .. nor a symbolic link (one in the context pointing out
// of it; one a RUN planted in the rootfs, such as /tmp/x -> /) reaches a
// host file.

// copySrc is one source of a COPY, a path of the context.
type copySrc struct {
	rel   string // relative to the context, cleaned
	isDir bool
}

// sources checks and expands (globs) COPY's sources, and writes what
// they hold (paths, modes, link targets, contents) into h.
func (b *dfBuilder) sources(paths []string, h hash.Hash) ([]copySrc, error) {
	if b.opt.Context == "" {
		return nil, errors.New("no build context (--context) to copy from")
	}
	cr, err := os.OpenRoot(b.opt.Context)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	defer cr.Close()
	var out []copySrc
	for _, p := range paths {
		rel := path.Clean(strings.TrimPrefix(filepath.ToSlash(p), "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, fmt.Errorf("%s: outside the build context", p)
		}
		matches := []string{rel}
		if strings.ContainsAny(rel, "*?[") {
			if matches, err = fs.Glob(cr.FS(), rel); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if len(matches) == 0 {
				return nil, fmt.Errorf("%s: no file of the build context matches", p)
			}
		}
		for _, m := range matches {
			// Stat follows a symbolic link, inside the context only.
			fi, err := cr.Stat(m)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, contextError(err))
			}
			out = append(out, copySrc{rel: m, isDir: fi.IsDir()})
			if err := hashSource(cr, m, fi, h); err != nil {
				return nil, fmt.Errorf("%s: %w", p, contextError(err))
			}
		}
	}
	return out, nil
}

// refuseArchives refuses ADD of a compressed or tar archive, which Docker
// would unpack and this builder does not: COPY it and RUN tar instead.
func (b *dfBuilder) refuseArchives(srcs []copySrc) error {
	cr, err := os.OpenRoot(b.opt.Context)
	if err != nil {
		return err
	}
	defer cr.Close()
	for _, s := range srcs {
		if s.isDir {
			continue
		}
		f, err := cr.Open(s.rel)
		if err != nil {
			return err
		}
		head := make([]byte, 262)
		n, _ := io.ReadFull(f, head)
		f.Close()
		head = head[:n]
		if bytes.HasPrefix(head, []byte{0x1f, 0x8b}) || bytes.HasPrefix(head, []byte("BZh")) ||
			bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}) || bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}) ||
			(n >= 262 && string(head[257:262]) == "ustar") {
			return fmt.Errorf("ADD %s: unpacking archives is not supported; COPY it and RUN tar", s.rel)
		}
	}
	return nil
}

// contextError says plainly that a path left the context.
func contextError(err error) error {
	if strings.Contains(err.Error(), "escapes") {
		return fmt.Errorf("outside the build context: %w", err)
	}
	return err
}

// hashSource writes the tree at rel into h.
func hashSource(cr *os.Root, rel string, top fs.FileInfo, h hash.Hash) error {
	one := func(p string, fi fs.FileInfo) error {
		fmt.Fprintf(h, "%q %o %d\n", p, fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := cr.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %q\n", t)
		case fi.Mode().IsRegular():
			f, err := cr.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			s := sha256.New()
			if _, err := io.Copy(s, f); err != nil {
				return err
			}
			fmt.Fprintf(h, "%x\n", s.Sum(nil))
		}
		return nil
	}
	if !top.IsDir() {
		return one(rel, top)
	}
	return fs.WalkDir(cr.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return one(p, fi)
	})
}

// copy copies srcs to dest (relative to WORKDIR) in the rootfs at root,
// owned by chown (default root) and with chmod's mode if given.
func (b *dfBuilder) copy(srcs []copySrc, dest, chown, chmod, root string) error {
	cr, err := os.OpenRoot(b.opt.Context)
	if err != nil {
		return err
	}
	defer cr.Close()
	rr, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer rr.Close()
	uid, gid, err := resolveUser(root, chown)
	if err != nil {
		return fmt.Errorf("--chown: %w", err)
	}
	uid, gid = uid+b.opt.UIDShift, gid+b.opt.UIDShift
	var mode fs.FileMode
	if chmod != "" {
		m, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return fmt.Errorf("--chmod %s: want an octal mode", chmod)
		}
		mode = fs.FileMode(m) &^ (fs.ModeSetuid | fs.ModeSetgid)
	}
	dst := strings.TrimPrefix(resolveIn(b.workdir, dest), "/")
	toDir := strings.HasSuffix(dest, "/") || len(srcs) > 1 || srcs[0].isDir
	if fi, err := rr.Stat(orDot(dst)); err == nil && fi.IsDir() {
		toDir = true
	}
	c := &copier{cr: cr, rr: rr, uid: uid, gid: gid, mode: mode}
	if toDir && dst != "" {
		if err := mkdirAllOwned(rr, dst, uid, gid); err != nil {
			return err
		}
	} else if dir := path.Dir(dst); dir != "." {
		if err := mkdirAllOwned(rr, dir, uid, gid); err != nil {
			return err
		}
	}
	for _, s := range srcs {
		target := dst
		if s.isDir {
			err = c.tree(s.rel, dst)
		} else {
			if toDir {
				target = path.Join(dst, path.Base(s.rel))
			}
			err = c.file(s.rel, target)
		}
		if err != nil {
			// The sources were checked (sources); what escapes now is
			// the destination.
			if strings.Contains(err.Error(), "escapes") {
				return fmt.Errorf("%s: a symbolic link leads out of the template's root filesystem: %w", dest, err)
			}
			return err
		}
	}
	return nil
}

func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

type copier struct {
	cr, rr   *os.Root
	uid, gid uint32
	mode     fs.FileMode // 0: the source's
}

// tree copies the contents of the context directory src into dst.
func (c *copier) tree(src, dst string) error {
	return fs.WalkDir(c.cr.FS(), src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := path.Join(dst, filepath.ToSlash(rel))
		if d.IsDir() {
			if t == "" || t == "." {
				return nil
			}
			if err := c.rr.Mkdir(t, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := c.rr.Lchown(t, int(c.uid), int(c.gid)); err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return c.rr.Chmod(t, c.modeOf(fi))
		}
		return c.file(p, t)
	})
}

func (c *copier) modeOf(fi fs.FileInfo) fs.FileMode {
	if c.mode != 0 {
		return c.mode
	}
	return fi.Mode().Perm() | fi.Mode()&fs.ModeSticky
}

// file copies one context entry (a regular file or a symbolic link,
// copied as a link) to dst.
func (c *copier) file(src, dst string) error {
	fi, err := c.cr.Lstat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return c.tree(src, dst)
	}
	if err := c.rr.RemoveAll(dst); err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := c.cr.Readlink(src)
		if err != nil {
			return err
		}
		if err := c.rr.Symlink(t, dst); err != nil {
			return err
		}
		return c.rr.Lchown(dst, int(c.uid), int(c.gid))
	case fi.Mode().IsRegular():
	default:
		return fmt.Errorf("%s: not a regular file, directory or symbolic link", src)
	}
	in, err := c.cr.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	// O_EXCL after the RemoveAll: never written through a link.
	out, err := c.rr.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chown(int(c.uid), int(c.gid)); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(c.modeOf(fi)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// overlayXattr prefixes the overlay's own attributes in an upper dir.
const overlayXattr = "trusted.overlay."

// cleanDiff removes the overlay's attributes from a layer's upper dir but
// the opaque marks of directories, which applyLayer and the overlays of
// later steps need.
func cleanDiff(diff string) error {
	return filepath.WalkDir(diff, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		names, err := listXattrs(p)
		if err != nil {
			return err
		}
		for _, n := range names {
			if !strings.HasPrefix(n, overlayXattr) || (d.IsDir() && n == overlayXattr+"opaque") {
				continue
			}
			if err := unix.Lremovexattr(p, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return &fs.PathError{Op: "removexattr " + n, Path: p, Err: err}
			}
		}
		return nil
	})
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		sz, err := unix.Llistxattr(p, nil)
		if err != nil {
			return nil, err
		}
		buf = make([]byte, sz)
		n, err = unix.Llistxattr(p, buf)
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, &fs.PathError{Op: "listxattr", Path: p, Err: err}
	}
	var names []string
	for _, s := range bytes.Split(buf[:n], []byte{0}) {
		if len(s) > 0 {
			names = append(names, string(s))
		}
	}
	return names, nil
}

func isOpaque(p string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(p, overlayXattr+"opaque", buf)
	return err == nil && string(buf[:n]) == "y"
}

// applyLayer applies one layer's upper dir to the tree at rootfs: its
// whiteouts delete, its opaque directories replace, its other entries
// are hard-linked in (the layer is never written again).
func applyLayer(ctx interface{ Err() error }, diff, rootfs string) error {
	rr, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer rr.Close()
	n := 0
	return filepath.WalkDir(diff, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(diff, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0: // a whiteout
			return rr.RemoveAll(rel)
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			fi, err := rr.Lstat(rel)
			switch {
			case err == nil && fi.IsDir() && isOpaque(p):
				if err := emptyDir(rr, rel); err != nil {
					return err
				}
			case err == nil && !fi.IsDir():
				if err := rr.Remove(rel); err != nil {
					return err
				}
				fallthrough
			case errors.Is(err, fs.ErrNotExist):
				if err := rr.Mkdir(rel, 0o700); err != nil {
					return err
				}
			case err != nil:
				return err
			}
			if err := rr.Lchown(rel, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			return rr.Chmod(rel, fs.FileMode(st.Mode&0o777)|modeBits(st.Mode))
		}
		if err := rr.RemoveAll(rel); err != nil {
			return err
		}
		parent, err := rr.Open(orDot(filepath.Dir(rel)))
		if err != nil {
			return err
		}
		defer parent.Close()
		if err := unix.Linkat(unix.AT_FDCWD, p, int(parent.Fd()), filepath.Base(rel), 0); err != nil {
			return &fs.PathError{Op: "link", Path: rel, Err: err}
		}
		return nil
	})
}

func modeBits(m uint32) fs.FileMode {
	if m&unix.S_ISVTX != 0 {
		return fs.ModeSticky
	}
	return 0
}

func emptyDir(rr *os.Root, rel string) error {
	f, err := rr.Open(rel)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := rr.RemoveAll(path.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}
