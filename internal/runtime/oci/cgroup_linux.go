package oci

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// cgroups finds, reads and removes the cgroups runc makes for sandboxes. It
// works on pure cgroup v2 hosts and on v1 hosts (including the hybrid layout
// with cgroup2 mounted at /sys/fs/cgroup/unified).
type cgroups struct {
	v2     bool
	mounts []string // v2: the one cgroup2 mount; v1: every v1 hierarchy plus a hybrid cgroup2 mount
	parent string   // e.g. "sheepfold/server"
}

func detectCgroups(parent string) (*cgroups, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return nil, fmt.Errorf("statfs /sys/fs/cgroup: %w", err)
	}
	c := &cgroups{v2: st.Type == unix.CGROUP2_SUPER_MAGIC, parent: parent}
	if c.v2 {
		c.mounts = []string{"/sys/fs/cgroup"}
		return c, nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		fstype, mnt := fields[sep+1], fields[4]
		if (fstype == "cgroup" || fstype == "cgroup2") && strings.HasPrefix(mnt, "/sys/fs/cgroup/") {
			c.mounts = append(c.mounts, mnt)
		}
	}
	if len(c.mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return c, sc.Err()
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

// usage reads memory, OOM, CPU and pids figures.
func (c *cgroups) usage(id string) (runtime.Usage, error) {
	var u runtime.Usage
	if c.v2 {
		d := c.controller(id, "")
		if _, err := os.Stat(d); err != nil {
			return u, runtime.ErrNotFound
		}
		u.MemoryBytes = readInt(filepath.Join(d, "memory.current"))
		u.MemoryPeakBytes = readInt(filepath.Join(d, "memory.peak"))
		u.MemoryLimit = readInt(filepath.Join(d, "memory.max"))
		u.OOMKills = uint64(readKey(filepath.Join(d, "memory.events"), "oom_kill"))
		u.CPUNanos = uint64(readKey(filepath.Join(d, "cpu.stat"), "usage_usec")) * 1000
		u.Pids = readInt(filepath.Join(d, "pids.current"))
		return u, nil
	}
	mem := c.controller(id, "memory")
	if _, err := os.Stat(mem); err != nil {
		return u, runtime.ErrNotFound
	}
	u.MemoryBytes = readInt(filepath.Join(mem, "memory.usage_in_bytes"))
	u.MemoryPeakBytes = readInt(filepath.Join(mem, "memory.max_usage_in_bytes"))
	u.MemoryLimit = readInt(filepath.Join(mem, "memory.limit_in_bytes"))
	u.OOMKills = uint64(readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill"))
	if d := c.controller(id, "cpuacct"); d != "" {
		u.CPUNanos = uint64(readInt(filepath.Join(d, "cpuacct.usage")))
	}
	if d := c.controller(id, "pids"); d != "" {
		u.Pids = readInt(filepath.Join(d, "pids.current"))
	}
	return u, nil
}

// remove kills whatever is left in the sandbox's cgroups and removes them.
func (c *cgroups) remove(id string) error {
	var errs []error
	for _, d := range c.dirs(id) {
		if err := removeCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup empties one cgroup directory (children first) and removes it.
func removeCgroup(dir string) error {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		killProcs(filepath.Join(dir, "cgroup.procs"))
		time.Sleep(10 * time.Millisecond)
	}
}

func killProcs(procsFile string) {
	b, _ := os.ReadFile(procsFile)
	for _, line := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(line); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
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

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return -1
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// readKey reads "key value" lines (memory.events, cpu.stat, memory.oom_control).
func readKey(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
