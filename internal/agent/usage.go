package agent

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/psi"
)

// The usage op: the sandbox's resource usage, read from the agent's own
// cgroup. The host reads a local sandbox's cgroup itself (runtime.Usage);
// a Pod's cgroup is on its node, out of the server's reach, so the
// server asks the Pod's agent, which sees its container's cgroup:
//
//   - cgroup v2 with a cgroup namespace (containerd's default there):
//     /sys/fs/cgroup is the container's own cgroup;
//   - cgroup v1 (runc, also on a hybrid host): each controller's
//     hierarchy is mounted at /sys/fs/cgroup/<controller>, bound to the
//     container's own directory of it ("cpu,cpuacct" with "cpu" and
//     "cpuacct" symlinks to it).
//
// Where a hierarchy is mounted whole instead (no cgroup namespace), the
// agent's own path in /proc/self/cgroup, looked up under the mount, is
// its cgroup; a path that does not exist there means the mount is the
// cgroup itself.
//
// What the host may trust of the answer: the figures are the kernel's
// counters of the container's cgroup, read by the agent (uid 0 of the
// sandbox's user namespace, non-dumpable, so nothing in the sandbox can
// ptrace it or read its memory). User code runs as uid 1000 with no
// capabilities, and even the sandbox's root lacks CAP_SYS_ADMIN and
// CAP_SYS_PTRACE. The counters (memory.current, cpu.stat, the events
// files) are the kernel's, which no write changes; the files that could
// be written (the limits) are on the read-only mount container runtimes
// give unprivileged containers; and nothing in the sandbox can remount or
// mount over /sys/fs/cgroup or reach into the agent. So no code of the
// sandbox can change what the agent answers. It can only kill the
// sandbox (its root may signal the agent's serve), and a dead agent
// answers nothing.

// cgroupRoot is where a container sees its cgroups.
const cgroupRoot = "/sys/fs/cgroup"

// errNoCgroup reports an agent that found no cgroup of its own to read (a
// fake runtime's agent outside any container, a kernel without the files).
var errNoCgroup = errors.New("no cgroup of the sandbox found")

// usage answers the usage op.
func (s *server) usage() agentproto.Event {
	root := s.cfg.CgroupRoot
	if root == "" {
		root = cgroupRoot
	}
	self, _ := os.ReadFile("/proc/self/cgroup") // optional: a mount may be the cgroup itself
	u, err := readCgroupUsage(root, string(self))
	if errors.Is(err, errNoCgroup) {
		return fail(agentproto.CodeUnsupported, "%v under %s", err, root)
	}
	if err != nil {
		return fail(agentproto.CodeInternal, "read the sandbox's cgroup: %v", err)
	}
	if s.cfg.Disk != "" {
		if u.DiskBytes, u.DiskTotalBytes, err = diskUsage(hostPath(s.cfg.Root, s.cfg.Disk)); err != nil {
			return fail(agentproto.CodeInternal, "read the sandbox's disk: %v", err)
		}
	}
	return agentproto.Event{Type: agentproto.EventDone, Usage: &u}
}

// readCgroupUsage reads the usage of the cgroup the process whose
// /proc/self/cgroup is self belongs to, from the hierarchies mounted
// under root: v2 when root is a cgroup2 mount (it has
// cgroup.controllers), else v1. A file that is missing counts 0 (a
// controller not enabled, an older kernel); only a cgroup that shows
// neither memory nor CPU counters fails, with errNoCgroup.
func readCgroupUsage(root, self string) (agentproto.Usage, error) {
	paths := parseProcCgroup(self)
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return readV2(cgroupDir(root, paths[""]))
	}
	return readV1(root, paths)
}

// readV2 reads a cgroup v2 directory (what runc's cgroup library reads,
// as internal/runtime/oci does on the host).
func readV2(d string) (agentproto.Usage, error) {
	u := agentproto.Usage{Cgroup: "v2"}
	cur, okMem := readInt(filepath.Join(d, "memory.current"))
	cpu, okCPU := readKey(filepath.Join(d, "cpu.stat"), "usage_usec")
	if !okMem && !okCPU {
		return u, errNoCgroup
	}
	u.MemoryBytes = cur
	u.CPUNanos = uint64(max(cpu, 0)) * 1000
	u.MemoryCacheBytes, _ = readKey(filepath.Join(d, "memory.stat"), "file")
	u.MemoryPeakBytes, _ = readInt(filepath.Join(d, "memory.peak")) // Linux 5.19+
	u.MemoryLimit, _ = readInt(filepath.Join(d, "memory.max"))
	oom, _ := readKey(filepath.Join(d, "memory.events"), "oom_kill")
	u.OOMKills = uint64(max(oom, 0))
	u.CPULimit = cpuMax(filepath.Join(d, "cpu.max"))
	u.Pids, _ = readInt(filepath.Join(d, "pids.current"))
	denied, _ := readKey(filepath.Join(d, "pids.events"), "max")
	u.PidsDenied = uint64(max(denied, 0))
	if p := psi.ReadCgroup(d); p != nil {
		ap := agentproto.Pressure(*p)
		u.Pressure = &ap
	}
	return u, nil
}

// readV1 reads the v1 controllers' directories under root.
func readV1(root string, paths map[string]string) (agentproto.Usage, error) {
	u := agentproto.Usage{Cgroup: "v1"}
	okMem, okCPU := false, false
	if d := v1Dir(root, "memory", paths); d != "" {
		var n int64
		n, okMem = readInt(filepath.Join(d, "memory.usage_in_bytes"))
		u.MemoryBytes = n
		// total_cache counts the cgroup and its children, as
		// usage_in_bytes does.
		u.MemoryCacheBytes, _ = readKey(filepath.Join(d, "memory.stat"), "total_cache")
		u.MemoryPeakBytes, _ = readInt(filepath.Join(d, "memory.max_usage_in_bytes"))
		u.MemoryLimit, _ = readInt(filepath.Join(d, "memory.limit_in_bytes"))
		oom, _ := readKey(filepath.Join(d, "memory.oom_control"), "oom_kill") // Linux 4.13+
		u.OOMKills = uint64(max(oom, 0))
	}
	if d := v1Dir(root, "cpuacct", paths); d != "" {
		var n int64
		n, okCPU = readInt(filepath.Join(d, "cpuacct.usage"))
		u.CPUNanos = uint64(max(n, 0))
	}
	if !okMem && !okCPU {
		return u, errNoCgroup
	}
	if d := v1Dir(root, "cpu", paths); d != "" {
		quota, _ := readInt(filepath.Join(d, "cpu.cfs_quota_us"))
		period, _ := readInt(filepath.Join(d, "cpu.cfs_period_us"))
		if quota > 0 && period > 0 {
			u.CPULimit = float64(quota) / float64(period)
		}
	}
	if d := v1Dir(root, "pids", paths); d != "" {
		u.Pids, _ = readInt(filepath.Join(d, "pids.current"))
		denied, _ := readKey(filepath.Join(d, "pids.events"), "max")
		u.PidsDenied = uint64(max(denied, 0))
	}
	return u, nil
}

// parseProcCgroup maps each controller of a /proc/self/cgroup
// ("ID:controllers:path" lines) to its cgroup path; the v2 hierarchy's
// ("0::path") is under "".
func parseProcCgroup(text string) map[string]string {
	paths := map[string]string{}
	for line := range strings.Lines(text) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	return paths
}

// v1Dir returns the directory of the controller's cgroup under root: the
// hierarchy mounted for it (root/<controller>, or a joint mount such as
// root/cpu,cpuacct), and in it the agent's own path when that exists
// there; "" when the controller is not mounted.
func v1Dir(root, controller string, paths map[string]string) string {
	mount := filepath.Join(root, controller)
	if st, err := os.Stat(mount); err != nil || !st.IsDir() {
		mount = ""
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			for c := range strings.SplitSeq(e.Name(), ",") {
				if c == controller && e.IsDir() {
					mount = filepath.Join(root, e.Name())
				}
			}
		}
		if mount == "" {
			return ""
		}
	}
	return cgroupDir(mount, paths[controller])
}

// cgroupDir is the cgroup p under a hierarchy's mount, or the mount
// itself when p is not found there (a mount bound to the container's own
// cgroup, or a cgroup namespace's root).
func cgroupDir(mount, p string) string {
	if p == "" || p == "/" || !filepath.IsAbs(p) {
		return mount
	}
	d := filepath.Join(mount, filepath.Clean(p))
	if st, err := os.Stat(d); err == nil && st.IsDir() {
		return d
	}
	return mount
}

// readInt reads a file of one integer; "max" (no limit) is -1. ok is
// false when the file is missing or malformed.
func readInt(path string) (n int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, true
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		// A v1 counter beyond int64 (it never is): keep it whole.
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil {
			return int64(min(u, 1<<63-1)), true
		}
		return 0, false
	}
	return n, true
}

// readKey reads the value of key in a file of "key value" lines
// (memory.stat, memory.events, cpu.stat, memory.oom_control).
func readKey(path, key string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// cpuMax reads a v2 cpu.max ("quota period", or "max period" for no
// limit) as a number of CPUs; 0 for none.
func cpuMax(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	q, p, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	quota, err1 := strconv.ParseInt(q, 10, 64)
	period, err2 := strconv.ParseInt(p, 10, 64)
	if !ok || err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0
	}
	return float64(quota) / float64(period)
}
