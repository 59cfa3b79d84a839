package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// What a clone changed (runtime.Differ).
//
// A clone's writable layer starts as a copy of its snapshot's
// (snapshot_linux.go), so what the clone did since is the difference of
// the two upper dirs, read over the template (the lower layer neither
// wrote): an entry only the clone's upper has is added, or changed when
// the template has it (a copy-up) and it differs; an entry both have is
// changed when it differs; a whiteout (a 0:0 character device) in the
// clone's upper that the snapshot's lacks is a deletion of what the
// snapshot showed, and an entry of the snapshot's upper that the clone's
// lacks was deleted too (a file the template never had needs no
// whiteout). Entries compare by type, permission bits, and content (a
// file's bytes, a link's target); owners and times do not count. The
// writable paths of a read-only sandbox and the overlay's opaque
// directories (a directory of the template removed and made again) are
// not compared.

var _ runtime.Differ = (*OCI)(nil)

// Changes implements runtime.Differ.
func (o *OCI) Changes(ctx context.Context, id, dir, lower string) (runtime.Changes, error) {
	var ch runtime.Changes
	if !validID(id) {
		return ch, runtime.ErrNotFound
	}
	upper := filepath.Join(o.bundle(id), "rw", "upper")
	if _, err := os.Lstat(upper); err != nil {
		return ch, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	base := filepath.Join(dir, snapshotFiles, "upper")
	if _, err := os.Lstat(base); err != nil {
		return ch, fmt.Errorf("snapshot %s has no files: %w", dir, err)
	}
	err := filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, path)
		if rel == "." {
			return nil
		}
		p := "/" + rel
		f, err := lstat(path)
		if err != nil {
			return err
		}
		b, inBase := lstatMaybe(filepath.Join(base, rel))
		switch {
		case whiteout(f):
			if inBase && whiteout(b) {
				return nil
			}
			if inBase {
				ch.Deleted = append(ch.Deleted, p)
				return nil
			}
			if _, inLower := lstatMaybe(filepath.Join(lower, rel)); inLower {
				ch.Deleted = append(ch.Deleted, p)
			}
		case inBase && !whiteout(b):
			if d, err := differ(path, f, filepath.Join(base, rel), b); err != nil || d {
				ch.Changed = append(ch.Changed, p)
				return err
			}
		case inBase: // re-made where the snapshot had deleted it
			ch.Added = append(ch.Added, p)
		default:
			l, inLower := lstatMaybe(filepath.Join(lower, rel))
			if !inLower {
				ch.Added = append(ch.Added, p)
				return nil
			}
			if d, err := differ(path, f, filepath.Join(lower, rel), l); err != nil || d {
				ch.Changed = append(ch.Changed, p)
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ch, err
	}
	err = filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base, path)
		if rel == "." {
			return nil
		}
		if _, inUpper := lstatMaybe(filepath.Join(upper, rel)); inUpper {
			return nil
		}
		b, err := lstat(path)
		if err != nil {
			return err
		}
		if !whiteout(b) {
			ch.Deleted = append(ch.Deleted, "/"+rel)
		}
		return nil
	})
	for _, l := range []*[]string{&ch.Added, &ch.Changed, &ch.Deleted} {
		slices.Sort(*l)
		if *l == nil {
			*l = []string{}
		}
	}
	return ch, err
}

func lstat(path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	return st, err
}

func lstatMaybe(path string) (unix.Stat_t, bool) {
	st, err := lstat(path)
	return st, err == nil
}

// whiteout says whether st is an overlay whiteout: a 0:0 character device.
func whiteout(st unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// differ says whether two entries differ by type, permissions or content.
func differ(a string, as unix.Stat_t, b string, bs unix.Stat_t) (bool, error) {
	if as.Mode != bs.Mode {
		return true, nil
	}
	switch as.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if as.Size != bs.Size {
			return true, nil
		}
		return contentDiffers(a, b)
	case unix.S_IFLNK:
		la, err := os.Readlink(a)
		if err != nil {
			return false, err
		}
		lb, err := os.Readlink(b)
		return la != lb, err
	case unix.S_IFCHR, unix.S_IFBLK:
		return as.Rdev != bs.Rdev, nil
	}
	return false, nil
}

// contentDiffers compares two files' bytes.
func contentDiffers(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return true, nil
		}
		aDone := errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF)
		bDone := errors.Is(eb, io.EOF) || errors.Is(eb, io.ErrUnexpectedEOF)
		if aDone || bDone {
			return aDone != bDone, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil {
			return false, eb
		}
	}
}
