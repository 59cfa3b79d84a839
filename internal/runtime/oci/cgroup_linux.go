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
	var pids string // the sandbox's pids cgroup: the tenant's counts are its tenantLeaf's
	if c.v2 {
		d := c.controller(id, "")
		if _, err := os.Stat(d); err != nil {
			return runtime.Usage{}, runtime.ErrNotFound
		}
		cu, _ = cgroup.ReadV2(d)
		pids = d
	} else {
		mem := c.controller(id, "memory")
		if _, err := os.Stat(mem); err != nil {
			return runtime.Usage{}, runtime.ErrNotFound
		}
		cu, _ = cgroup.ReadV1(cgroup.V1{Memory: mem, CPUAcct: c.controller(id, "cpuacct"), CPU: c.controller(id, "cpu")})
		pids = c.controller(id, "pids")
	}
	u := runtime.Usage{
		MemoryBytes: cu.MemoryBytes, MemoryCacheBytes: cu.MemoryCacheBytes, MemoryPeakBytes: cu.MemoryPeakBytes,
		MemoryLimit: cu.MemoryLimit, OOMKills: cu.OOMKills, CPUNanos: cu.CPUNanos, CPULimit: cu.CPULimit,
	}
	if pids != "" {
		u.Pids, u.PidsDenied = tenantPids(pids)
	}
	if cu.Pressure != nil {
		p := runtime.Pressure(*cu.Pressure)
		u.Pressure = &p
	}
	return u, nil
}

// AgentPids is how many tasks a sandbox's pids cgroup holds beyond the
// sandbox's pids limit, for its agent alone. The agent is a Go program:
// its runtime makes OS threads whenever it needs them (a goroutine
// waking, a blocking system call, each process start, which ends the
// thread it ran on: agent.StartBounded), and a thread it cannot make
// (clone fails with EAGAIN at pids.max) is a fatal error, not one it can
// handle. So no task of the tenant competes with the agent's: every
// process the agent starts is charged to the cgroup tenantLeaf below the
// sandbox's, whose pids.max is the limit the sandbox asked for, and the
// sandbox's own pids.max is that limit plus AgentPids. The agent's init
// and serve processes and their threads stay in the sandbox's cgroup.
const AgentPids = 64

// tenantLeaf is the pids cgroup, below a sandbox's, of every process its
// agent starts (kernels, commands, sudo); see AgentPids.
const tenantLeaf = "tenant"

// pidsDir is the sandbox's cgroup directory in the hierarchy of the pids
// controller ("" when there is none).
func (c *cgroups) pidsDir(id string) string {
	if c.v2 {
		return c.controller(id, "")
	}
	return c.controller(id, "pids")
}

// openPids makes the sandbox's pids cgroup (runc, which comes next, takes
// it as it finds it) and opens it for the agent, which makes every
// process it starts begin in its tenantLeaf (agent.UseTenantCgroup).
// Opened here, as the host's root, because the sandbox mounts no cgroup
// filesystem; the agent only ever opens tenantLeaf's files through it,
// which makeTenant gives it.
func (c *cgroups) openPids(id string) (*os.File, error) {
	d := c.pidsDir(id)
	if d == "" {
		return nil, errors.New("no pids cgroup hierarchy: a sandbox's pids limit cannot be kept")
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("make the sandbox's pids cgroup: %w", err)
	}
	return os.OpenFile(d, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// mkCgroup makes a cgroup directory; tests replace it with one that also
// makes the files the kernel would.
var mkCgroup = func(dir string) error { return os.Mkdir(dir, 0o755) }

// makeTenant makes the sandbox's tenantLeaf with pids.max limit, once runc
// has made the sandbox's cgroup and started its agent, and lets the
// agent (host uid owner, the sandbox's root) move one of its own threads
// into it: the agent forks each process it starts from a thread there, so
// the kernel charges the fork to the tenant's limit, and the thread ends
// afterwards. On cgroup v1 a thread moves through the leaf's tasks file.
// On cgroup v2 a thread may leave its process's cgroup only for a
// threaded one, so the leaf is threaded, the pids controller (a threaded
// one) is enabled below the sandbox's cgroup, and the move goes through
// cgroup.threads; the kernel then also asks for write access to the
// sandbox's own cgroup.procs (the common ancestor), and that the agent
// sees both cgroups from its cgroup namespace, whose root is the
// sandbox's cgroup.
func (c *cgroups) makeTenant(id string, limit int64, owner int) error {
	return c.setTenant(id, limit, owner, false)
}

// restoreTenant is makeTenant after a restore, which finds the tenant's
// cgroup made already, by CRIU, with the tenant's processes in it
// (checkpoint_linux.go).
func (c *cgroups) restoreTenant(id string, limit int64, owner int) error {
	return c.setTenant(id, limit, owner, true)
}

func (c *cgroups) setTenant(id string, limit int64, owner int, existing bool) error {
	d := c.pidsDir(id)
	t := filepath.Join(d, tenantLeaf)
	if err := mkCgroup(t); err != nil && !(existing && errors.Is(err, os.ErrExist)) {
		return fmt.Errorf("make the tenant's cgroup: %w", err)
	}
	move := []string{filepath.Join(t, "tasks")}
	if c.v2 {
		if err := cg.WriteFile(t, "cgroup.type", "threaded"); err != nil {
			return fmt.Errorf("make the tenant's cgroup threaded: %w", err)
		}
		if err := cg.WriteFile(d, "cgroup.subtree_control", "+pids"); err != nil {
			return fmt.Errorf("enable pids below the sandbox's cgroup: %w", err)
		}
		move = []string{filepath.Join(t, "cgroup.threads"), filepath.Join(d, "cgroup.procs")}
	}
	if err := cg.WriteFile(t, "pids.max", strconv.FormatInt(limit, 10)); err != nil {
		return fmt.Errorf("set the tenant's pids limit: %w", err)
	}
	for _, f := range move {
		if err := os.Chown(f, owner, -1); err != nil {
			return fmt.Errorf("give the agent %s: %w", f, err)
		}
	}
	return nil
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
// forks included (on a hybrid host it then thaws the v1 freezer, where a
// frozen sandbox's killed tasks wait). Otherwise it freezes the v1 freezer cgroup, signals
// every task (frozen tasks cannot exit or fork, so no pid is reused while
// it does) and thaws them so that they die. Never by a pid read from an
// unfrozen cgroup, which may already belong to another process.
func (c *cgroups) kill(id string) error {
	deadline := time.Now().Add(10 * time.Second)
	unified := ""
	if c.unified != "" {
		unified = filepath.Join(c.unified, c.parent, id)
		if _, err := os.Stat(unified); errors.Is(err, os.ErrNotExist) {
			if c.v2 {
				return nil
			}
			// A hybrid host's sandbox that runsc placed in the v1
			// hierarchies alone (a gVisor one): the v1 freezer's way.
			unified = ""
		}
	}
	if unified != "" {
		dir := unified
		if err := cg.WriteFile(dir, "cgroup.kill", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", dir, err)
		}
		// On a hybrid host a sandbox frozen by the v1 freezer (Freeze)
		// cannot die until it is thawed: it is, once signalled.
		if fz := c.controller(id, "freezer"); !c.v2 && fz != "" {
			if _, err := os.Stat(fz); err == nil {
				if err := (&cgfs.FreezerGroup{}).Set(fz, &cg.Resources{Freezer: cg.Thawed}); err != nil {
					return fmt.Errorf("thaw %s: %w", fz, err)
				}
			}
		}
		return waitEmpty(dir, deadline)
	}
	dir := c.controller(id, "freezer")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	freezer := &cgfs.FreezerGroup{}
	// A cgroup whose tasks keep forking may stay FREEZING past the
	// library's own tries (a fork chain on a loaded host): it is what is
	// being killed, so the freeze is tried again until the deadline.
	for {
		err := freezer.Set(dir, &cg.Resources{Freezer: cg.Frozen})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze %s: %w", dir, err)
		}
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

// makeParent makes the instance's cgroup, under the top one all
// instances share, in every hierarchy; it stays for the instance's life
// (removeParent). Another instance's removeParent removes the top cgroup
// whenever it is empty: were the instance's cgroup made only by runc at
// each create, a removal between runc's mkdir of the top cgroup and of
// the instance's would fail the create. Once the instance's cgroup
// exists the top one is not empty. A mkdir that finds the top cgroup
// gone again starts over; any other failure is left to runc, which may
// not use that hierarchy.
func (c *cgroups) makeParent() []error {
	var errs []error
	for _, m := range c.mounts {
		d := filepath.Join(m, c.parent)
		for attempt := 0; ; attempt++ {
			err := os.MkdirAll(d, 0o755)
			if err == nil {
				break
			}
			if !errors.Is(err, os.ErrNotExist) || attempt == 100 {
				errs = append(errs, err)
				break
			}
		}
	}
	return errs
}

// removeParent removes the instance's cgroups, and the top one when no
// other instance uses it; cgroups with sandboxes in them stay.
func (c *cgroups) removeParent() {
	for _, m := range c.mounts {
		_ = unix.Rmdir(filepath.Join(m, c.parent))
		_ = unix.Rmdir(filepath.Join(m, filepath.Dir(c.parent)))
	}
}

// tenantPids reads the tasks and refused forks the sandbox's pids limit
// counts, in the sandbox's pids cgroup d: its tenantLeaf's (the agent's
// own threads, outside the limit, are not the tenant's), or d's for a
// sandbox without one (no pids limit). A file that cannot be read counts
// nothing.
func tenantPids(d string) (pids int64, denied uint64) {
	if fi, err := os.Stat(filepath.Join(d, tenantLeaf)); err == nil && fi.IsDir() {
		d = filepath.Join(d, tenantLeaf)
	}
	pids, _ = cgroup.Int(filepath.Join(d, "pids.current"))
	n, _ := cgroup.Key(filepath.Join(d, "pids.events"), "max")
	return max(pids, 0), uint64(max(n, 0))
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
