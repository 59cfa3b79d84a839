package template

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The sandbox user, as the runtime and the agent expect it.
const (
	sandboxUser  = "user"
	sandboxUID   = 1000
	sandboxGID   = 1000
	sandboxHome  = "home/user" // relative to the rootfs
	sandboxShell = "/bin/bash"
	sandboxHost  = "sandbox"
)

// neutralSourcesMirror replaces the build mirror in the rootfs's
// etc/apt/sources.list, so a private mirror's name does not show inside.
const neutralSourcesMirror = "http://deb.debian.org/debian"

// configureRootfs makes the host-side edits of a freshly bootstrapped root
// filesystem: the sandbox user and its home, neutral host identity files
// (debootstrap copies the build host's hostname and resolv.conf), and no apt
// caches or build logs. It needs no root and runs nothing from the rootfs;
// owners of new files are fixed later by chownTree.
//
// No untrusted code has run in root at this point, but the edits still never
// follow a symlink out of it: every parent directory is checked to be a real
// directory, and files are replaced rather than written through links.
func configureRootfs(root, suite string, now time.Time) error {
	steps := []struct {
		name string
		fn   func() error
	}{
		{"hostname", func() error { return replaceFile(root, "etc/hostname", []byte(sandboxHost+"\n"), 0o644) }},
		{"hosts", func() error {
			return replaceFile(root, "etc/hosts", []byte("127.0.0.1\tlocalhost "+sandboxHost+"\n::1\tlocalhost\n"), 0o644)
		}},
		{"resolv.conf", func() error { return replaceFile(root, "etc/resolv.conf", nil, 0o644) }},
		{"machine-id", func() error { return truncateIfExists(root, "etc/machine-id") }},
		{"apt sources", func() error {
			return replaceIfExists(root, "etc/apt/sources.list",
				[]byte(fmt.Sprintf("deb %s %s main\n", neutralSourcesMirror, suite)))
		}},
		{"user", func() error { return addUser(root, now) }},
		{"home", func() error { return makeHome(root) }},
		{"apt caches", func() error { return removeCaches(root) }},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			return fmt.Errorf("configure %s: %w", s.name, err)
		}
	}
	return nil
}

// inRoot returns root/rel after checking that every directory between root
// and the last element of rel is a real directory, not a symlink.
func inRoot(root, rel string) (string, error) {
	rel = filepath.Clean(rel)
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("path %q escapes the rootfs", rel)
	}
	p := root
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory (%s)", p, fi.Mode().Type())
		}
	}
	return filepath.Join(root, rel), nil
}

// dirInRoot is inRoot for a directory: root/rel itself must be a real
// directory too.
func dirInRoot(root, rel string) (string, error) {
	p, err := inRoot(root, rel)
	if err != nil {
		return "", err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory (%s)", p, fi.Mode().Type())
	}
	return p, nil
}

// replaceFile makes root/rel a regular file holding data. An existing
// regular file is rewritten in place (keeping its mode and owner); anything
// else there (a symlink, say) is removed first and the file created with perm.
func replaceFile(root, rel string, data []byte, perm fs.FileMode) error {
	p, err := inRoot(root, rel)
	if err != nil {
		return err
	}
	flag := os.O_WRONLY | os.O_TRUNC | noFollow
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.Mode().IsRegular():
	case err == nil:
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		flag |= os.O_CREATE | os.O_EXCL
	case errors.Is(err, fs.ErrNotExist):
		flag |= os.O_CREATE | os.O_EXCL
	default:
		return err
	}
	f, err := os.OpenFile(p, flag, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// replaceIfExists is replaceFile for a file that may be absent.
func replaceIfExists(root, rel string, data []byte) error {
	p, err := inRoot(root, rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return replaceFile(root, rel, data, 0o644)
}

func truncateIfExists(root, rel string) error { return replaceIfExists(root, rel, nil) }

// editLines rewrites the colon-separated database root/rel (passwd, group,
// shadow, gshadow): it drops the lines drop matches and appends add.
func editLines(root, rel string, drop func(fields []string) bool, add string) error {
	p, err := inRoot(root, rel)
	if err != nil {
		return err
	}
	old, err := readRegular(p)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(old), "\n") {
		if line == "" {
			continue
		}
		if drop(strings.Split(strings.TrimSuffix(line, "\n"), ":")) {
			continue
		}
		out.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			out.WriteByte('\n')
		}
	}
	out.WriteString(add + "\n")
	return replaceFile(root, rel, out.Bytes(), 0o644)
}

// readRegular reads p, refusing anything but a regular file.
func readRegular(p string) ([]byte, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", p, fi.Mode().Type())
	}
	return os.ReadFile(p)
}

// addUser adds the sandbox user and group, replacing any entry with the
// same name or id. The password is locked: nobody logs in, and the runtime
// sets the uid directly.
func addUser(root string, now time.Time) error {
	byNameOrID := func(id int) func([]string) bool {
		return func(f []string) bool {
			return f[0] == sandboxUser || (len(f) > 2 && f[2] == fmt.Sprint(id))
		}
	}
	byName := func(f []string) bool { return f[0] == sandboxUser }
	days := now.Unix() / 86400
	edits := []struct {
		file     string
		optional bool
		drop     func([]string) bool
		line     string
	}{
		{"etc/passwd", false, byNameOrID(sandboxUID),
			fmt.Sprintf("%s:x:%d:%d::/%s:%s", sandboxUser, sandboxUID, sandboxGID, sandboxHome, sandboxShell)},
		{"etc/group", false, byNameOrID(sandboxGID), fmt.Sprintf("%s:x:%d:", sandboxUser, sandboxGID)},
		{"etc/shadow", false, byName, fmt.Sprintf("%s:!:%d:0:99999:7:::", sandboxUser, days)},
		{"etc/gshadow", true, byName, sandboxUser + ":!::"},
	}
	for _, e := range edits {
		err := editLines(root, e.file, e.drop, e.line)
		if e.optional && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// makeHome creates the sandbox user's home (0755) with the files of
// etc/skel. chownTree gives it to the user afterwards.
func makeHome(root string) error {
	home, err := inRoot(root, sandboxHome)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(home); err != nil {
		return err
	}
	if err := os.Mkdir(home, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(home, 0o755); err != nil { // not subject to the umask
		return err
	}
	skel, err := dirInRoot(root, "etc/skel")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return filepath.WalkDir(skel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(skel, p)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(home, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			return os.Chmod(dst, fi.Mode().Perm())
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				return err
			}
			return os.Chmod(dst, fi.Mode().Perm())
		}
		return nil // skel holds no links or devices worth copying
	})
}

// removeCaches removes apt's package lists and caches and the debootstrap
// log (which names the build host's staging path). apt recreates what it
// needs; sandboxes have no network for it anyway.
func removeCaches(root string) error {
	type glob struct {
		dir  string
		keep func(name string, isDir bool) bool
	}
	globs := []glob{
		{"var/lib/apt/lists", func(n string, dir bool) bool { return dir }}, // keeps partial/
		{"var/cache/apt/archives", func(n string, dir bool) bool { return dir || !strings.HasSuffix(n, ".deb") }},
		{"var/cache/apt", func(n string, dir bool) bool { return dir || !strings.HasSuffix(n, ".bin") }},
	}
	for _, g := range globs {
		dir, err := dirInRoot(root, g.dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if g.keep(e.Name(), e.IsDir()) {
				continue
			}
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for _, rel := range []string{"var/log/bootstrap.log", "debootstrap"} {
		p, err := inRoot(root, rel)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// stripSetid removes the setuid and setgid bits from every file and
// directory under root and returns how many it changed.
func stripSetid(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) == 0 {
			return nil
		}
		n++
		return os.Chmod(p, fi.Mode()&^(fs.ModeSetuid|fs.ModeSetgid))
	})
	return n, err
}
