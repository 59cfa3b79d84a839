package oci

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	cg "github.com/opencontainers/cgroups"
	cgfs "github.com/opencontainers/cgroups/fs"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/cgroup"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// cgroups finds, reads, kills and removes the cgroups runc makes for
// sandboxes. It works on pure cgroup v2 hosts and on v1 hosts (including
// the hybrid layout with cgroup2 mounted at /sys/fs/cgroup/unified, where
// runc makes each sandbox a cgroup there too).
type cgroups struct {
	v2      bool
	mounts  []string // v2: the one cgroup2 mount; v1: every v1 hierarchy plus a hybrid cgroup2 mount
	unified string   // the cgroup2 mount, if any (v2, or hybrid v1)
	parent  string   // e.g. "sheepfold/server"
}

func detectCgroups(parent string) (*cgroups, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return nil, fmt.Errorf("statfs /sys/fs/cgroup: %w", err)
	}
	c := &cgroups{v2: st.Type == unix.CGROUP2_SUPER_MAGIC, parent: parent}
	if c.v2 {
		c.mounts = []string{"/sys/fs/cgroup"}
		c.unified = c.mounts[0]
		return c, nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	freezer := false
	for _, m := range mounts {
		if !strings.HasPrefix(m.Mountpoint, "/sys/fs/cgroup/") {
			continue
		}
		c.mounts = append(c.mounts, m.Mountpoint)
		if m.FSType == "cgroup2" {
			c.unified = m.Mountpoint
		}
		freezer = freezer || slices.Contains(strings.Split(m.VFSOptions, ","), "freezer")
	}
	if len(c.mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	if c.unified == "" && !freezer {
		return nil, errors.New("neither a cgroup2 hierarchy nor the v1 freezer: a sandbox's processes cannot be killed atomically")
	}
	return c, nil
}

// path is the cgroupsPath given to the runtime.
func (c *cgroups) path(id string) string { return "/" + c.parent + "/" + id }

// mode names the layout for logs and doctor output.
func (c *cgroups) mode() string {
	if c.v2 {
		return "v2"
	}
	return "v1"
}

// dirs lists the sandbox's cgroup directories that exist now.
func (c *cgroups) dirs(id string) []string {
	var out []string
	for _, m := range c.mounts {
		d := filepath.Join(m, c.parent, id)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// controller returns the directory of a v1 controller (or the v2 dir).
func (c *cgroups) controller(id, name string) string {
	if c.v2 {
		return filepath.Join(c.mounts[0], c.parent, id)
	}
	for _, m := range c.mounts {
		for _, part := range strings.Split(filepath.Base(m), ",") {
			if part == name {
				return filepath.Join(m, c.parent, id)
			}
		}
	}
	return ""
}

// usage reads memory, OOM, CPU and pids figures (internal/cgroup).
func (c *cgroups) usage(id string) (runtime.Usage, error) {
	var cu cgroup.Usage
	if c.v2 {
		d := c.controller(id, "")
		if _, err := os.Stat(d); err != nil {
			return runtime.Usage{}, runtime.ErrNotFound
		}
		cu, _ = cgroup.ReadV2(d)
	} else {
		mem := c.controller(id, "memory")
		if _, err := os.Stat(mem); err != nil {
			return runtime.Usage{}, runtime.ErrNotFound
		}
		cu, _ = cgroup.ReadV1(cgroup.V1{Memory: mem, CPUAcct: c.controller(id, "cpuacct"), CPU: c.controller(id, "cpu"), Pids: c.controller(id, "pids")})
	}
	u := runtime.Usage{
		MemoryBytes: cu.MemoryBytes, MemoryCacheBytes: cu.MemoryCacheBytes, MemoryPeakBytes: cu.MemoryPeakBytes,
		MemoryLimit: cu.MemoryLimit, OOMKills: cu.OOMKills, CPUNanos: cu.CPUNanos, CPULimit: cu.CPULimit,
		Pids: cu.Pids, PidsDenied: cu.PidsDenied,
	}
	if cu.Pressure != nil {
		p := runtime.Pressure(*cu.Pressure)
		u.Pressure = &p
	}
	return u, nil
}

// setMemory changes the sandbox's memory (and memory+swap) limit: v2
// memory.max (its memory.swap.max stays 0), v1 memory.limit_in_bytes and
// memory.memsw.limit_in_bytes, in the order that keeps memsw at or above
// the limit. Lowering it below what the sandbox uses makes the kernel
// reclaim, and past that its OOM killer ends a process.
func (c *cgroups) setMemory(id string, b int64) error {
	d := c.controller(id, "memory")
	if _, err := os.Stat(d); d == "" || err != nil {
		return runtime.ErrNotFound
	}
	v := []byte(strconv.FormatInt(b, 10))
	if c.v2 {
		return os.WriteFile(filepath.Join(d, "memory.max"), v, 0)
	}
	limit, memsw := filepath.Join(d, "memory.limit_in_bytes"), filepath.Join(d, "memory.memsw.limit_in_bytes")
	files := []string{limit, memsw}
	if cur, _ := cgroup.Int(limit); b > cur {
		files = []string{memsw, limit}
	}
	for _, f := range files {
		if err := os.WriteFile(f, v, 0); err != nil && !(f == memsw && errors.Is(err, os.ErrNotExist)) {
			return err
		}
	}
	return nil
}

// memoryLimit reads the sandbox's memory limit: v2 memory.max, v1
// memory.limit_in_bytes (a sandbox always has one: "max" is an error).
func (c *cgroups) memoryLimit(id string) (int64, error) {
	d := c.controller(id, "memory")
	name := "memory.limit_in_bytes"
	if c.v2 {
		name = "memory.max"
	}
	if d == "" {
		return 0, runtime.ErrNotFound
	}
	n, err := cgroup.Int(filepath.Join(d, name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, runtime.ErrNotFound
	case err != nil:
		return 0, err
	case n < 0:
		return 0, fmt.Errorf("%s: no memory limit", filepath.Join(d, name))
	}
	return n, nil
}

// oomKills reads the sandbox's OOM-kill count alone: v1 memory.oom_control,
// v2 memory.events (oom_kill). One file, where usage reads nine and
// stats the writable layer.
func (c *cgroups) oomKills(id string) (uint64, error) {
	path := filepath.Join(c.controller(id, "memory"), "memory.oom_control")
	if c.v2 {
		path = filepath.Join(c.controller(id, ""), "memory.events")
	}
	n, err := cgroup.Key(path, "oom_kill")
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, runtime.ErrNotFound
	case errors.Is(err, cgroup.ErrNoKey):
		return 0, nil // a kernel that does not count OOM kills
	case err != nil:
		return 0, err
	}
	return uint64(max(n, 0)), nil
}

// cpuTime reads the sandbox's CPU time alone: v1 cpuacct.usage
// (nanoseconds), v2 cpu.stat usage_usec. One file, a few microseconds.
func (c *cgroups) cpuTime(id string) (time.Duration, error) {
	if c.v2 {
		n, err := cgroup.Key(filepath.Join(c.mounts[0], c.parent, id, "cpu.stat"), "usage_usec")
		return time.Duration(n) * time.Microsecond, err
	}
	d := c.controller(id, "cpuacct")
	if d == "" {
		return 0, errors.New("no cpuacct cgroup hierarchy")
	}
	n, err := cgroup.Int(filepath.Join(d, "cpuacct.usage"))
	return time.Duration(n), err
}

// kill kills every process of the sandbox at once and waits until they
// are gone. With a cgroup2 hierarchy (v2, or hybrid v1) it writes
// cgroup.kill, which the kernel applies to the whole cgroup tree, new
// forks included. Otherwise it freezes the v1 freezer cgroup, signals
// every task (frozen tasks cannot exit or fork, so no pid is reused while
// it does) and thaws them so that they die. Never by a pid read from an
// unfrozen cgroup, which may already belong to another process.
func (c *cgroups) kill(id string) error {
	deadline := time.Now().Add(10 * time.Second)
	if c.unified != "" {
		dir := filepath.Join(c.unified, c.parent, id)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err := cg.WriteFile(dir, "cgroup.kill", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", dir, err)
		}
		return waitEmpty(dir, deadline)
	}
	dir := c.controller(id, "freezer")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	freezer := &cgfs.FreezerGroup{}
	if err := freezer.Set(dir, &cg.Resources{Freezer: cg.Frozen}); err != nil {
		return fmt.Errorf("freeze %s: %w", dir, err)
	}
	pids, err := cg.GetAllPids(dir)
	for _, pid := range pids {
		if kerr := unix.Kill(pid, unix.SIGKILL); kerr != nil && !errors.Is(kerr, unix.ESRCH) {
			err = errors.Join(err, fmt.Errorf("kill %d: %w", pid, kerr))
		}
	}
	if terr := freezer.Set(dir, &cg.Resources{Freezer: cg.Thawed}); terr != nil {
		err = errors.Join(err, fmt.Errorf("thaw %s: %w", dir, terr))
	}
	if err != nil {
		return err
	}
	return waitEmpty(dir, deadline)
}

// waitEmpty waits until no process is left in dir's tree. Killed tasks
// leave when the kernel has torn them down, which takes a moment.
func waitEmpty(dir string, deadline time.Time) error {
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		pids, err := cg.GetAllPids(dir)
		if errors.Is(err, os.ErrNotExist) || err == nil && len(pids) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes still there after SIGKILL", dir, len(pids))
		}
		time.Sleep(delay)
	}
}

// remove removes the sandbox's cgroups, which kill has emptied.
func (c *cgroups) remove(id string) error {
	var errs []error
	for _, d := range c.dirs(id) {
		if err := cg.RemovePath(d); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// listIDs returns sandbox ids that have a cgroup under the parent.
func (c *cgroups) listIDs() []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range c.mounts {
		entries, _ := os.ReadDir(filepath.Join(m, c.parent))
		for _, e := range entries {
			if e.IsDir() && validID(e.Name()) && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// removeParent removes the instance's cgroups, and the top one when no
// other instance uses it; cgroups with sandboxes in them stay.
func (c *cgroups) removeParent() {
	for _, m := range c.mounts {
		_ = unix.Rmdir(filepath.Join(m, c.parent))
		_ = unix.Rmdir(filepath.Join(m, filepath.Dir(c.parent)))
	}
}

// supervisorLeaf is the cgroup, in a delegated one, that the engine's own
// process moves into (see cgroupRoot).
const supervisorLeaf = "supervisor"

// cgroupRoot returns the cgroup under which the engine makes its own:
// root as configured, or, when root is empty, the one this process may
// manage. On cgroup v2 that is the cgroup systemd delegated to its service
// (Delegate=yes, which systemd marks with a trusted.delegate or
// user.delegate attribute) or the root of a private cgroup namespace (a
// container's): sandboxes then live inside the service, as systemd's
// delegation contract asks (systemd owns the hierarchy's root and may
// rewrite its subtree_control, and stopping the service reaches the
// sandboxes). A cgroup with processes in it cannot give controllers to its
// children ("no internal processes"), so this process first moves itself
// into the leaf <delegated>/supervisor. Anywhere else (cgroup v1, a shell's
// session) it is the hierarchy's root, "/".
func cgroupRoot(root string) (string, error) {
	if root != "" {
		return root, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "/", nil
	}
	own, err := ownCgroup()
	if err != nil {
		return "", err
	}
	d, ok := delegatedCgroup(own)
	if !ok {
		return "/", nil
	}
	if own == d {
		leaf := filepath.Join("/sys/fs/cgroup", d, supervisorLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("make the server's leaf cgroup: %w", err)
		}
		// "0" is the writer: the whole process, every thread, moves.
		if err := cg.WriteFile(leaf, "cgroup.procs", "0"); err != nil {
			return "", fmt.Errorf("move into the leaf cgroup %s: %w", leaf, err)
		}
	}
	return d, nil
}

// ownCgroup reads this process's cgroup v2 path from /proc/self/cgroup.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}

// delegatedCgroup returns own, or its parent when own is our supervisor
// leaf, if that cgroup was delegated to this process: marked so by
// systemd, or the root of a private cgroup namespace (which, unlike the
// hierarchy's real root, has a cgroup.type file). Cgroups further up are
// not ours even when delegated (a user's systemd instance).
func delegatedCgroup(own string) (string, bool) {
	cands := []string{own}
	if path.Base(own) == supervisorLeaf {
		cands = append(cands, path.Dir(own))
	}
	for _, c := range cands {
		dir := filepath.Join("/sys/fs/cgroup", c)
		for _, attr := range []string{"trusted.delegate", "user.delegate"} {
			var v [8]byte
			if n, err := unix.Getxattr(dir, attr, v[:]); err == nil && string(v[:n]) == "1" {
				return c, true
			}
		}
		if c == "/" {
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.type"); err == nil {
				return c, true
			}
		}
	}
	return "", false
}
