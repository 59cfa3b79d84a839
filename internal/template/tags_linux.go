package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Tag makes each of tags of template source's name point at source (a
// name, its newest build, or "NAME:TAG"): a copy of its tree in hard
// links and its template.json, replacing the tag's old copy. It returns
// the source's Info. A tag in use (Use) is refused with ErrInUse; tags
// done before it stay done.
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
	src, err := Get(dataDir, source)
	if err != nil {
		return Info{}, err
	}
	parent := filepath.Join(dir, ".tags", name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Info{}, err
	}
	for _, t := range tags {
		if err := tagOne(ctx, dir, parent, src, name, t); err != nil {
			return Info{}, fmt.Errorf("tag %s:%s: %w", name, t, err)
		}
	}
	return src, nil
}

func tagOne(ctx context.Context, dir, parent string, src Info, name, tag string) error {
	ref := name + ":" + tag
	final := filepath.Join(parent, tag)
	if src.Path == filepath.Join(final, rootfsDir) {
		return nil // already this tag
	}
	unuse, err := claimUnused(dir, ref)
	if err != nil {
		return err
	}
	defer unuse()
	staging, err := os.MkdirTemp(parent, "."+tag+".tag-")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			removeStaging(staging)
		}
	}()
	if err := os.Chmod(staging, 0o755); err != nil {
		return err
	}
	if err := linkTree(ctx, src.Path, filepath.Join(staging, rootfsDir)); err != nil {
		return err
	}
	info := src
	info.Name, info.Tagged = ref, time.Now().UTC()
	if err := writeInfo(staging, info); err != nil {
		return err
	}
	aside := ""
	if _, err := os.Lstat(final); err == nil {
		aside = filepath.Join(parent, "."+tag+".old-"+time.Now().Format("150405.000000000"))
		if err := os.Rename(final, aside); err != nil {
			return err
		}
	}
	if err := os.Rename(staging, final); err != nil {
		if aside != "" {
			os.Rename(aside, final)
		}
		return err
	}
	done = true
	if aside != "" {
		return removeStaging(aside)
	}
	return nil
}

// Untag removes tag of template name: ErrNotBuilt when it has none,
// ErrInUse while a running engine uses it.
func Untag(dataDir, name, tag string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := ValidTag(tag); err != nil {
		return err
	}
	if tag == DefaultTag {
		return fmt.Errorf("tag %q is the newest build's: remove the template instead", DefaultTag)
	}
	dir := templatesDir(dataDir)
	unlock, err := lockTemplate(context.Background(), dir, name)
	if err != nil {
		return err
	}
	defer unlock()
	final := tagDir(dataDir, name, tag)
	if _, err := os.Lstat(final); os.IsNotExist(err) {
		return fmt.Errorf("%w: template %s has no tag %q", ErrNotBuilt, name, tag)
	}
	unuse, err := claimUnused(dir, name+":"+tag)
	if err != nil {
		return fmt.Errorf("untag %s:%s: %w", name, tag, err)
	}
	defer unuse()
	aside := filepath.Join(filepath.Dir(final), "."+tag+".old-"+time.Now().Format("150405.000000000"))
	if err := os.Rename(final, aside); err != nil {
		return err
	}
	return removeStaging(aside)
}
