package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sheepfold/sheepfold/internal/cgroup"
)

// A Pod's pids limit, checked before the sandbox runs.
//
// Kubernetes gives a container no pids limit of its own, and an
// RLIMIT_NPROC bounds one uid's tasks only: root in a sandbox may take
// any of the Pod's 65,536 uids, each with as many again. The sandbox's
// limit is therefore its container's pids cgroup, which the node's NRI
// plugin sets from the Pod's annotation (internal/runtime/kubernetes/nri)
// and which counts every task of the container whatever its uid. The
// container sees that cgroup read-only (and owned by the host's root), so
// nothing in the sandbox can raise it. The agent checks it once, before
// it listens: a node without the plugin (or with one that failed to set
// it) has a container without the limit, and the agent refuses to serve
// there, which fails the Pod and the create with this error.

// ErrPidsMax reports a container whose pids.max is not the sandbox's
// limit.
var ErrPidsMax = errors.New("the sandbox's container does not have its pids limit")

// CheckPidsMax checks that the cgroup of the calling process, under the
// hierarchies mounted at root (/sys/fs/cgroup: v2, or v1's pids
// controller), has pids.max want.
func CheckPidsMax(root string, want int64) error {
	self, _ := os.ReadFile("/proc/self/cgroup") // optional: a mount may be the cgroup itself
	got, path, err := readPidsMax(root, string(self))
	if err != nil {
		return fmt.Errorf("%w (pids limit %d): %v", ErrPidsMax, want, err)
	}
	if got != want {
		have := strconv.FormatInt(got, 10)
		if got < 0 {
			have = "max"
		}
		return fmt.Errorf("%w: %s is %s, not %d: the node runs no sheepfold NRI plugin (sheepfold nri-plugin, deploy/kubernetes/nri.yaml), or its containerd has NRI off", ErrPidsMax, path, have, want)
	}
	return nil
}

// readPidsMax reads pids.max (-1 for "max") of the cgroup whose
// /proc/self/cgroup is self, under root, and says which file it read.
func readPidsMax(root, self string) (int64, string, error) {
	paths := parseProcCgroup(self)
	var dir string
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		dir = cgroupDir(root, paths[""])
	} else if dir = v1Dir(root, "pids", paths); dir == "" {
		return 0, "", fmt.Errorf("no pids controller mounted under %s", root)
	}
	path := filepath.Join(dir, "pids.max")
	n, err := cgroup.Int(path)
	if err != nil {
		return 0, path, fmt.Errorf("cannot read %s (no pids controller in the container's cgroup): %v", path, err)
	}
	return n, path, nil
}
