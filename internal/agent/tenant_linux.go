package agent

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The tenant's cgroup. In a sandbox with a pids limit the host passes the
// agent its pids cgroup, opened outside (the sandbox mounts no cgroup
// filesystem), and makes in it the leaf "tenant", whose pids.max is the
// sandbox's limit, while the sandbox's own cgroup holds a reserve beyond
// it for the agent (internal/runtime/oci AgentPids). Every process the
// agent starts is forked from a thread moved into that leaf first, so the
// kernel charges the fork, and everything it forks in turn, to the
// tenant's limit: a tenant at its limit gets EAGAIN, and the agent still
// makes the OS threads its Go runtime needs (a thread it cannot make is
// fatal to it). The thread moved is the one StartIn ends afterwards; the
// agent's other threads never leave the sandbox's cgroup. Nor does the
// moved thread make any: the Go runtime never clones a new thread from a
// locked one (newm hands the job to its template thread, made at the
// process's first LockOSThread, before any move), so no thread of the
// agent's is ever made in, or charged to, the tenant's cgroup.

// tenantCgroup is the descriptor of the sandbox's pids cgroup (-1: none);
// set once before the agent serves.
var tenantCgroup atomic.Int32

func init() { tenantCgroup.Store(-1) }

// tenantMoves are the files, relative to the sandbox's pids cgroup, that
// move one thread into the tenant's cgroup: cgroup v2's cgroup.threads of
// a threaded cgroup, cgroup v1's tasks.
var tenantMoves = []string{"tenant/cgroup.threads", "tenant/tasks"}

// UseTenantCgroup makes every process started through StartIn (or
// StartBounded) from now on start in the tenant's cgroup below dirfd, the
// sandbox's pids cgroup, or fail: none starts outside it.
func UseTenantCgroup(dirfd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil {
		return fmt.Errorf("pids cgroup descriptor %d: %w", dirfd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("pids cgroup descriptor %d is not a directory", dirfd)
	}
	unix.CloseOnExec(dirfd) // no process the agent starts may hold it
	tenantCgroup.Store(int32(dirfd))
	return nil
}

// errNoTenantCgroup reports a tenant's cgroup that the host has not made.
var errNoTenantCgroup = errors.New("the sandbox's tenant cgroup is missing")

// enterTenant moves the calling OS thread, which must be locked and end
// afterwards, into the tenant's cgroup, if the agent has one.
func enterTenant() error {
	dirfd := int(tenantCgroup.Load())
	if dirfd < 0 {
		return nil
	}
	tid := []byte(strconv.Itoa(unix.Gettid()))
	for _, name := range tenantMoves {
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open the tenant's cgroup: %w", err)
		}
		_, err = unix.Write(fd, tid)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("enter the tenant's cgroup: %w", err)
		}
		return nil
	}
	return errNoTenantCgroup
}
