package oci

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// runc hides the directories of maskedPaths under one read-only tmpfs,
// mounted on the first of them that exists and bound on the others. CRIU
// dumps a tmpfs's contents with tar and gzip and restores them the same
// way: two programs at the dump and two at every restore (resume, clone),
// for a tmpfs that is empty and read-only. A dump therefore names that
// mount a CRIU external (maskedKey: CRIU keeps no contents of it), and a
// restore binds in its place a directory of the host's that is as empty
// (maskedDir: root's, 0555, nothing ever written to it), with the
// dumped mount's flags (read-only, nosuid, nodev, noexec), its binds on
// the other masked directories following it. The sandbox sees an empty
// directory it cannot write to, as before; its owner is the host's root
// (nobody, seen from inside) rather than the sandbox's.

// maskedKey names the masked tmpfs among a dump's CRIU externals.
const maskedKey = "sheepfold-masked"

// maskedMount returns where, in the sandbox whose init is pid, runc's
// masked tmpfs is mounted, or the directory a restore bound in its place
// (host, this runtime's maskedDir: "" when none is, or when no masked
// directory exists).
func maskedMount(pid int, host string) (string, error) {
	var dev string
	var st unix.Stat_t
	if unix.Stat(host, &st) == nil {
		dev = fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 || !slices.Contains(maskedPaths, f[4]) || !slices.Contains(strings.Split(f[5], ","), "ro") {
			continue
		}
		// The first is runc's own (or the restore's); the others bind it.
		if g[0] == "tmpfs" && f[3] == "/" || dev != "" && f[2] == dev && strings.HasSuffix(host, f[3]) {
			return f[4], nil
		}
	}
	return "", sc.Err()
}

// maskedDir returns the host's empty directory a restore binds in place
// of the masked tmpfs, made when missing.
func (o *OCI) maskedDir() (string, error) {
	dir := o.maskedPath()
	if err := os.MkdirAll(dir, 0o555); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		return "", err
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return "", fmt.Errorf("%s must be an empty directory (%v)", dir, err)
	}
	return dir, nil
}

// maskedPath is where maskedDir is.
func (o *OCI) maskedPath() string { return filepath.Join(o.dir, "masked") }
