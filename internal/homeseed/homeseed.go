// Package homeseed carries a template's home directory into a sandbox
// whose home is an empty volume: a Kubernetes Pod mounts a memory-backed
// emptyDir over /home/user (its disk, as the local engine's tmpfs
// writable layer is), which hides what the image has there (the shell's
// dotfiles, matplotlib's font cache, which takes seconds to rebuild).
// `sheepfold template export` writes the home as a tar archive into the
// image (Write); the sandbox's agent unpacks it into the empty volume
// before it serves (Unpack), owned by the sandbox's user.
//
// Only directories, regular files and symbolic links are carried; owners
// are not (everything becomes the user's), modes and modification times
// are. The standard library only: the agent is a static binary.
package homeseed

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// MaxSize bounds what Unpack writes: a home directory seed is small (the
// python template's is under 200 KB); a larger archive is refused rather
// than filling the sandbox's disk before its code runs.
const MaxSize = 64 << 20

// Write writes the tree under dir (not dir itself; its mode is the first
// entry's, named ".") to w as a tar archive in lexical order, so that the
// same tree always gives the same bytes. Anything but directories,
// regular files and symbolic links is left out and named in skipped.
func Write(w io.Writer, dir string) (skipped []string, err error) {
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(mode.Perm()), ModTime: info.ModTime().UTC().Truncate(time.Second), Format: tar.FormatPAX}
		if mode&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		var f *os.File
		switch t := mode.Type(); {
		case t == fs.ModeDir:
			h.Typeflag = tar.TypeDir
			if h.Name != "." {
				h.Name += "/"
			}
		case t.IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
			if f, err = os.Open(p); err != nil {
				return err
			}
			defer f.Close()
		case t == fs.ModeSymlink:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			skipped = append(skipped, rel)
			return nil
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if f != nil {
			if n, err := io.Copy(tw, f); err != nil {
				return err
			} else if n != h.Size {
				return fmt.Errorf("%s changed size while it was read", p)
			}
		}
		return nil
	})
	if err != nil {
		return skipped, err
	}
	return skipped, tw.Close()
}

// Unpack unpacks an archive Write wrote into dir, which must exist and be
// empty, and makes everything in it, dir included, owned by uid and gid.
// Nothing is written outside dir: entry names must stay in it, and an
// entry may only be inside a directory the archive itself made (never
// under one of its symbolic links).
func Unpack(r io.Reader, dir string, uid, gid int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) != 0 {
		return fmt.Errorf("%s is not empty (%d entries): a home is seeded only into a new volume", dir, len(entries))
	}
	dirs := map[string]bool{".": true}
	var total int64
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("home seed: %w", err)
		}
		name := filepath.Clean(filepath.FromSlash(strings.TrimSuffix(h.Name, "/")))
		if !filepath.IsLocal(name) && name != "." {
			return fmt.Errorf("home seed: entry %q leaves the home", h.Name)
		}
		if !dirs[filepath.Dir(name)] {
			return fmt.Errorf("home seed: entry %q is not inside a directory the seed made", h.Name)
		}
		p := filepath.Join(dir, name)
		mode := fs.FileMode(h.Mode & 0o777)
		if h.Mode&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := os.Mkdir(p, 0o700); err != nil {
					return err
				}
			}
			dirs[name] = true
		case tar.TypeReg:
			if total += h.Size; total > MaxSize {
				return fmt.Errorf("home seed: more than %d MiB", MaxSize>>20)
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("home seed: %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("home seed: entry %q has type %q: only directories, files and symbolic links are carried", h.Name, h.Typeflag)
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeSymlink {
			continue
		}
		// After the chown, which clears set-id bits.
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if err := os.Chtimes(p, h.ModTime, h.ModTime); err != nil {
				return err
			}
		}
	}
	// dir itself is the user's whether or not the seed named ".".
	return os.Lchown(dir, uid, gid)
}
