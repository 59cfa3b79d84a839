package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// Tags: a template's tag is a copy of one of its builds, frozen under a
// name of its own, "NAME:TAG", which Get, Hold and so a sandbox's create
// take as they take a template's name. The name alone is the newest build
// (its tag DefaultTag, "NAME:default" being the name itself); building the
// name again changes it and leaves its tags where they are. A tag is a
// link <templates>/.tags/NAME/TAG to a generation beside it,
// .gen-<random> (dot names: List does not show them), which holds a
// template as a template's directory does: its rootfs hard links to the
// tree it was tagged from (template trees are never changed in place: a
// build installs a new one), its template.json that of the build with
// Name "NAME:TAG" and Tagged its time. A generation never changes nor
// moves: Tag points the link at a new one (or, for a tag of a tag, at
// that tag's), Untag removes the link. The sandboxes running on an old
// generation hold it (Hold) and go on with it; the release of the last
// removes it (hold_linux.go). Removing a template leaves its tags.

// DefaultTag is the tag of a template's newest build: its name alone.
const DefaultTag = "default"

var tagRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// genPrefix starts a tag generation's directory name, stagingPrefix one
// being made; genRE is a whole generation name.
const (
	genPrefix     = ".gen-"
	stagingPrefix = ".staging-"
)

var genRE = regexp.MustCompile(`^\.gen-[A-Za-z0-9]+$`)

// ValidTag checks a tag: [a-z0-9][a-z0-9._-]*, at most 63 characters.
func ValidTag(tag string) error {
	if !tagRE.MatchString(tag) || strings.Contains(tag, "..") {
		return fmt.Errorf("invalid tag %q: want [a-z0-9][a-z0-9._-]*, at most 63 characters", tag)
	}
	return nil
}

// SplitRef splits a template reference "NAME" or "NAME:TAG" and checks
// both; "NAME:default" is NAME (tag "").
func SplitRef(ref string) (name, tag string, err error) {
	name, tag, _ = strings.Cut(ref, ":")
	if err := validName(name); err != nil {
		return "", "", err
	}
	if tag == DefaultTag || !strings.Contains(ref, ":") {
		return name, "", nil
	}
	if err := ValidTag(tag); err != nil {
		return "", "", err
	}
	return name, tag, nil
}

// tagDir is the link of name's tag.
func tagDir(dataDir, name, tag string) string {
	return filepath.Join(templatesDir(dataDir), ".tags", name, tag)
}

// tagGen is the generation directory tag link link points at:
// fs.ErrNotExist when there is no such tag.
func tagGen(link string) (string, error) {
	t, err := os.Readlink(link)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && errors.Is(pe.Err, syscall.EINVAL) {
			return "", fmt.Errorf("tag %s is not a link to a generation", link)
		}
		return "", err
	}
	if !genRE.MatchString(t) {
		return "", fmt.Errorf("tag %s links to %q, not a generation", link, t)
	}
	return filepath.Join(filepath.Dir(link), t), nil
}

// readGen reads generation gen of template name as tag's: a generation
// may be several tags', so its template.json names the template alone.
func readGen(gen, name, tag string) (Info, error) {
	info, err := readInfo(gen, name)
	info.Name = name + ":" + tag
	return info, err
}

// getRef reads the template a reference names.
func getRef(dataDir, ref string) (Info, error) {
	name, tag, err := SplitRef(ref)
	if err != nil {
		return Info{}, err
	}
	if tag == "" {
		return readInfo(filepath.Join(templatesDir(dataDir), name), name)
	}
	gen, err := tagGen(tagDir(dataDir, name, tag))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: template %s has no tag %q", ErrNotBuilt, name, tag)
	}
	if err != nil {
		return Info{}, err
	}
	info, err := readGen(gen, name, tag)
	if errors.Is(err, ErrNotBuilt) {
		return Info{}, fmt.Errorf("%w: template %s has no tag %q", ErrNotBuilt, name, tag)
	}
	return info, err
}

// Tags lists template name's tags (DefaultTag not among them), sorted by
// tag. A tag that cannot be read is left out and reported in the error.
func Tags(dataDir, name string) ([]Info, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(templatesDir(dataDir), ".tags", name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list tags of %s: %w", name, err)
	}
	var out []Info
	var errs []error
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 || ValidTag(e.Name()) != nil {
			continue // generations and staging start with a dot
		}
		gen, err := tagGen(tagDir(dataDir, name, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // untagged meanwhile
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		info, err := readGen(gen, name, e.Name())
		if errors.Is(err, ErrNotBuilt) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

// TagOf is the tag of a template's Info ("" for a name alone).
func TagOf(info Info) string {
	_, tag, _ := strings.Cut(info.Name, ":")
	return tag
}
