package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Holds: a sandbox's root filesystem is the lower layer of its overlay,
// which looks files up in the template's tree for as long as it is
// mounted; a tree removed under it would make its files vanish. So each
// sandbox holds the directory its root is in (Hold): a shared flock(2)
// on the directory itself, which follows the directory when a tag move
// or a rebuild renames it, and which the kernel drops with the process
// however it ends. A tree no longer named (a tag's old generation, a
// rebuilt name's old directory) is removed by whoever takes the lock
// exclusively (removeIfUnused): the release of its last hold, the move
// itself when nothing holds it, or Sweep (an engine's start, after it
// has taken back its paused sandboxes and held their roots).

// Release lets go of a hold (Hold, HoldPath). With collect, the tree is
// removed if nothing names it any more and nothing else holds it (its
// sandbox is gone); without, it stays (an engine closing with paused
// sandboxes on it, which the next engine holds again before it sweeps).
type Release func(collect bool)

// Hold holds the template ref (a name or "NAME:TAG") for a sandbox that
// runs on it until release: its Info (Path the root it runs on).
func Hold(dataDir, ref string) (Info, Release, error) {
	for range 5 {
		info, err := Get(dataDir, ref)
		if err != nil {
			return Info{}, nil, err
		}
		release, err := HoldPath(dataDir, info.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // moved and removed between the two: read it again
		}
		if err != nil {
			return Info{}, nil, fmt.Errorf("hold template %s: %w", ref, err)
		}
		return info, release, nil
	}
	return Info{}, nil, fmt.Errorf("hold template %s: it keeps changing; try again", ref)
}

// HoldPath holds the tree of root filesystem rootfs (an Info.Path of a
// template in dataDir) as Hold does: for a sandbox that already runs on
// it (a paused one an engine takes back). fs.ErrNotExist when the tree
// is gone.
func HoldPath(dataDir, rootfs string) (Release, error) {
	dir := filepath.Dir(rootfs)
	if !within(templatesDir(dataDir), dir) {
		return nil, fmt.Errorf("%s is not a template's root filesystem", rootfs)
	}
	// A template's directory may be a link to one elsewhere (a data dir
	// sharing another's python): the tree it links to is held.
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	// A remover that took the lock first may have removed the tree
	// meanwhile: held, it must still be at dir.
	if !sameDir(f, dir, unix.Stat) {
		f.Close()
		return nil, fs.ErrNotExist
	}
	return func(c bool) {
		var held unix.Stat_t
		moved := c && unix.Fstat(int(f.Fd()), &held) == nil && !sameDir(f, dir, unix.Stat)
		f.Close()
		switch {
		case !c:
		case moved && filepath.Dir(dir) == templatesDir(dataDir):
			// A name rebuilt (or removed) under its sandboxes: its old
			// tree was renamed aside (asideName) and left to them.
			old, _ := filepath.Glob(filepath.Join(templatesDir(dataDir), "."+filepath.Base(dir)+".old-*"))
			for _, o := range old {
				var st unix.Stat_t
				if unix.Lstat(o, &st) == nil && st.Dev == held.Dev && st.Ino == held.Ino {
					_, _ = removeIfUnused(o, func() bool { return true })
				}
			}
		default:
			collect(dataDir, dir)
		}
	}, nil
}

// openDir opens directory dir for a flock, not following a link. A
// read-only file system is fine: flock needs no write access.
func openDir(dir string) (*os.File, error) {
	return os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|noFollow, 0)
}

// sameDir reports whether f is still the directory at path (stat:
// unix.Stat or unix.Lstat).
func sameDir(f *os.File, path string, stat func(string, *unix.Stat_t) error) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || stat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// within reports whether path is under dir (both cleaned).
func within(dir, path string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// collect removes tree dir, released by a hold, if nothing names it any
// more and nothing else holds it. Its failure is left to the next Sweep.
func collect(dataDir, dir string) {
	if named(dataDir, dir) {
		return
	}
	_, _ = removeIfUnused(dir, func() bool { return !named(dataDir, dir) })
}

// named reports whether tree dir is what a template name or tag names:
// templates/NAME, or a generation a tag's link points at.
func named(dataDir, dir string) bool {
	base, parent := filepath.Base(dir), filepath.Dir(dir)
	if parent == templatesDir(dataDir) {
		return !strings.HasPrefix(base, ".") // .NAME.old-*: a rebuilt or removed name's
	}
	if !strings.HasPrefix(base, genPrefix) {
		return true // not a tree this package removes
	}
	return linkedGens(parent)[base]
}

// removeIfUnused removes tree dir if it can take its lock exclusively at
// once and still unused() says so, holding the lock while it removes:
// removed false, no error, while something holds it.
func removeIfUnused(dir string, unused func() bool) (removed bool, err error) {
	f, err := openDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if !sameDir(f, dir, unix.Lstat) || !unused() {
		return false, nil
	}
	if err := removeStaging(dir); err != nil {
		return false, fmt.Errorf("remove unused template tree %s: %w", dir, err)
	}
	return true, nil
}

// Sweep removes every template tree nothing names and nothing holds: a
// tag's old generations, a rebuilt or removed name's old directories, a
// tag move's staging a crash left. An engine sweeps when it starts, once
// the paused sandboxes it took back hold their roots; it returns the
// errors of the trees it could not remove, joined.
func Sweep(dataDir string) error {
	dir := templatesDir(dataDir)
	var errs []error
	old, _ := filepath.Glob(filepath.Join(dir, ".*.old-*"))
	for _, d := range old {
		if _, err := removeIfUnused(d, func() bool { return true }); err != nil {
			errs = append(errs, err)
		}
	}
	names, err := os.ReadDir(filepath.Join(dir, ".tags"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, n := range names {
		if !n.IsDir() {
			continue
		}
		errs = append(errs, sweepTags(filepath.Join(dir, ".tags", n.Name())))
	}
	return errors.Join(errs...)
}

// sweepTags removes the generations in parent (a name's .tags directory)
// no tag links to and nothing holds, and staging a crash left.
func sweepTags(parent string) error {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || !(strings.HasPrefix(n, genPrefix) || strings.HasPrefix(n, stagingPrefix)) {
			continue
		}
		if _, err := removeIfUnused(filepath.Join(parent, n), func() bool { return !linkedGens(parent)[n] }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// linkedGens are the generations in parent the tags' links point at.
func linkedGens(parent string) map[string]bool {
	ents, _ := os.ReadDir(parent)
	out := map[string]bool{}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if t, err := os.Readlink(filepath.Join(parent, e.Name())); err == nil {
			out[t] = true
		}
	}
	return out
}
