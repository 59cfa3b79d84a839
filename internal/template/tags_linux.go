package template

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Tag makes each of tags of template source's name point at source (a
// name, its newest build, or "NAME:TAG"): a new generation, a copy of
// the name's tree in hard links and its template.json, or for a tag of a
// tag the generation that tag points at. It returns the source's Info.
// The tag's old generation stays for the sandboxes that run on it and is
// removed once none does (hold_linux.go); a new sandbox of the tag gets
// the new one.
func Tag(ctx context.Context, dataDir, source string, tags []string) (Info, error) {
	name, _, err := SplitRef(source)
	if err != nil {
		return Info{}, err
	}
	for _, t := range tags {
		if t == DefaultTag {
			return Info{}, fmt.Errorf("tag %q is the newest build's: build the template to move it", DefaultTag)
		}
		if err := ValidTag(t); err != nil {
			return Info{}, err
		}
	}
	dir := templatesDir(dataDir)
	unlock, err := lockTemplate(ctx, dir, name) // no build installs meanwhile
	if err != nil {
		return Info{}, err
	}
	defer unlock()
	parent := filepath.Join(dir, ".tags", name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Info{}, err
	}
	// Held while the links change: no sweep takes the source's tree (a
	// generation no link names yet, or one a move is leaving).
	src, release, err := Hold(dataDir, source)
	if err != nil {
		return Info{}, err
	}
	defer release(true)
	gen := filepath.Dir(src.Path)
	if filepath.Dir(gen) != parent {
		// A name's newest build: copied, since its next build replaces it.
		unhold, g, err := newGeneration(ctx, parent, src)
		if err != nil {
			return Info{}, fmt.Errorf("tag %s: %w", name, err)
		}
		defer unhold()
		gen = g
	}
	var old []string
	for _, t := range tags {
		prev, err := tagGen(filepath.Join(parent, t))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Info{}, fmt.Errorf("tag %s:%s: %w", name, t, err)
		}
		if err := link(parent, t, filepath.Base(gen)); err != nil {
			return Info{}, fmt.Errorf("tag %s:%s: %w", name, t, err)
		}
		if prev != "" && prev != gen {
			old = append(old, prev)
		}
	}
	syncDir(parent)
	for _, o := range old {
		collect(dataDir, o) // kept while a sandbox runs on it
	}
	return src, nil
}

// newGeneration makes a generation in parent of template src (a name's
// build) named Name:? by each link's readInfo, held until unhold: its
// rootfs hard links to src's, its template.json src's with Tagged now.
func newGeneration(ctx context.Context, parent string, src Info) (unhold func(), gen string, err error) {
	staging, err := os.MkdirTemp(parent, stagingPrefix)
	if err != nil {
		return nil, "", err
	}
	f, err := openDir(staging)
	if err != nil {
		os.Remove(staging)
		return nil, "", err
	}
	// Held from its start: a sweep leaves it alone until it is linked.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		os.Remove(staging)
		return nil, "", err
	}
	done := false
	defer func() {
		if !done {
			removeStaging(staging)
			f.Close()
		}
	}()
	if err := os.Chmod(staging, 0o755); err != nil {
		return nil, "", err
	}
	if err := linkTree(ctx, src.Path, filepath.Join(staging, rootfsDir)); err != nil {
		return nil, "", err
	}
	info := src
	info.Tagged = time.Now().UTC()
	if err := writeInfo(staging, info); err != nil {
		return nil, "", err
	}
	gen = filepath.Join(parent, genPrefix+rand.Text()[:16])
	if err := os.Rename(staging, gen); err != nil {
		return nil, "", err
	}
	done = true
	return func() { f.Close() }, gen, nil
}

// link points tag link parent/tag at generation gen (a name in parent),
// replacing what it pointed at in one rename.
func link(parent, tag, gen string) error {
	tmp := filepath.Join(parent, "."+tag+".link-"+rand.Text()[:10])
	if err := os.Symlink(gen, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(parent, tag)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Untag removes tag of template name: ErrNotBuilt when it has none. The
// sandboxes running on it go on; its generation is removed when the last
// ends.
func Untag(dataDir, name, tag string) error {
	if err := validName(name); err != nil {
		return err
	}
	if tag == DefaultTag {
		return fmt.Errorf("tag %q is the newest build's: remove the template instead", DefaultTag)
	}
	if err := ValidTag(tag); err != nil {
		return err
	}
	dir := templatesDir(dataDir)
	unlock, err := lockTemplate(context.Background(), dir, name)
	if err != nil {
		return err
	}
	defer unlock()
	l := tagDir(dataDir, name, tag)
	gen, err := tagGen(l)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: template %s has no tag %q", ErrNotBuilt, name, tag)
	}
	if err != nil {
		return err
	}
	if err := os.Remove(l); err != nil {
		return fmt.Errorf("untag %s:%s: %w", name, tag, err)
	}
	syncDir(filepath.Dir(l))
	collect(dataDir, gen)
	return nil
}
