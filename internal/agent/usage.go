package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/cgroup"
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

// readV2 reads a cgroup v2 directory (internal/cgroup, as
// internal/runtime/oci reads one on the host).
func readV2(d string) (agentproto.Usage, error) {
	cu, found := cgroup.ReadV2(d)
	if !found {
		return agentproto.Usage{Cgroup: "v2"}, errNoCgroup
	}
	return fromCgroup("v2", cu), nil
}

// readV1 reads the v1 controllers' directories under root.
func readV1(root string, paths map[string]string) (agentproto.Usage, error) {
	cu, found := cgroup.ReadV1(cgroup.V1{
		Memory: v1Dir(root, "memory", paths), CPUAcct: v1Dir(root, "cpuacct", paths),
		CPU: v1Dir(root, "cpu", paths), Pids: v1Dir(root, "pids", paths),
	})
	if !found {
		return agentproto.Usage{Cgroup: "v1"}, errNoCgroup
	}
	return fromCgroup("v1", cu), nil
}

// fromCgroup is a cgroup's counters on the wire.
func fromCgroup(version string, cu cgroup.Usage) agentproto.Usage {
	u := agentproto.Usage{
		Cgroup: version, MemoryBytes: cu.MemoryBytes, MemoryCacheBytes: cu.MemoryCacheBytes, MemoryPeakBytes: cu.MemoryPeakBytes,
		MemoryLimit: cu.MemoryLimit, OOMKills: cu.OOMKills, CPUNanos: cu.CPUNanos, CPULimit: cu.CPULimit,
		Pids: cu.Pids, PidsDenied: cu.PidsDenied,
	}
	if cu.Pressure != nil {
		p := agentproto.Pressure(*cu.Pressure)
		u.Pressure = &p
	}
	return u
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
