// Package runtime defines how the sandbox engine starts and stops isolated
// sandboxes. Implementations: oci (runc or runsc driven through a generated
// OCI spec), kubernetes (a Pod per sandbox) and fake (for unit tests of the
// engine).
//
// A runtime knows nothing of code, languages or files: it starts the agent
// in a confined root filesystem, hands back how to reach the agent (its
// socket, or a dialer), reports resource usage and tears everything down
// again. It may import only the standard library, x/sys, the OCI spec and
// seccomp libraries, internal/backoff, (oci) runc's cgroup library, moby's
// mountinfo parser and internal/cgroup, and (kubernetes) client-go,
// agenttls and agentproto (egress.accept alone: a proxied sandbox's
// connections, EgressProxy).
package runtime

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// Limits bound what a sandbox may use. Zero means "no limit" for CPUs; the
// engine always sets memory, pids and disk.
type Limits struct {
	MemoryBytes int64   // memory (and memory+swap) limit of the whole sandbox
	CPUs        float64 // CPU quota in cores; 0 = unlimited
	Pids        int64   // maximum number of tasks
	DiskBytes   int64   // what the writable layer holds (its files' bytes)
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID names the sandbox; lowercase letters, digits and '-', at most 32.
	ID string
	// Template names the template; RootFS is its root filesystem, the
	// read-only lower layer (a runtime that runs images maps Template to
	// its image instead).
	Template string
	RootFS   string
	// Limits are enforced by cgroups and the size of the writable layer.
	Limits Limits
	// ReadOnly makes the whole root filesystem read-only.
	ReadOnly bool
	// WritablePaths, with ReadOnly, are the only writable places: each a
	// directory (absolute, clean, created if missing) whose contents live
	// in the sandbox's writable storage of Limits.DiskBytes, shared by all.
	WritablePaths []string
	// Env is the sandbox's environment (KEY=VALUE), added to a fixed base.
	Env []string
	// Hostname inside the sandbox; default "sandbox".
	Hostname string
	// Volumes are persistent volumes mounted in the sandbox when it
	// starts (a runtime that implements Volumes; others refuse them with
	// ErrUnsupported).
	Volumes []VolumeMount
	// Devices are the fully qualified CDI names (Device.Name) of the
	// devices the sandbox is given (a runtime that implements Devices;
	// others refuse them with ErrUnsupported).
	Devices []string
	// GPUs, for a GPUScheduler, is the number of GPUs the sandbox is
	// given by its cluster; other runtimes get Devices instead.
	GPUs int
	// Network, when set, gives the sandbox a network interface; nil keeps
	// it to its loopback alone.
	Network *Network
	// Pool marks a sandbox started ahead by a warm pool: it has no record
	// until handed out. A shared runtime labels it so, and its collector
	// leaves it be (its agent ends it when no engine renews its lease).
	Pool bool
	// Attendant marks a volume's attendant (internal/sandbox
	// attendant.go): an instance no record claims, which ends itself at
	// its Lifetime. A shared runtime labels it so, with its lifetime,
	// and its collector leaves it be until then (Held.Until).
	Attendant bool
	// Runtime chooses how the sandbox is isolated, among the names the
	// runtime offers (Offered): "gvisor", "runc"...; "" is the runtime's
	// default.
	Runtime string
	// Node, for a Placer, is the node the sandbox must run on; "" leaves
	// the choice to the runtime.
	Node string
	// Lifetime, when positive, is the lifetime the sandbox's agent starts
	// with, until the engine's first ping gives it one (the same). A
	// runtime whose sandboxes outlive the engine (kubernetes) hands it to
	// the agent at start, so that a sandbox whose engine died between
	// Create and that ping (a warm pool member of a replica killed while
	// its Pod started, which no collector takes) still ends: its agent
	// would otherwise know no deadline. Others may ignore it: the local
	// engine's next start reaps what its predecessor left.
	Lifetime time.Duration
	// User and WorkDir are the defaults of the sandbox's processes and
	// code contexts that name none (a template's last USER and WORKDIR):
	// the runtime starts the agent with them (serve --user, --workdir;
	// AgentDefaults). "" leaves the agent's own ("user", its home).
	User, WorkDir string
}

// AgentDefaults are the agent's flags for spec's User and WorkDir, for a
// runtime to add to the agent's command line (init passes them to serve).
func AgentDefaults(spec Spec) []string {
	var args []string
	if spec.User != "" {
		args = append(args, "--user", spec.User)
	}
	if spec.WorkDir != "" {
		args = append(args, "--workdir", spec.WorkDir)
	}
	return args
}

// Network connects a sandbox to the host's egress gateway. The runtime
// creates the sandbox's processes stopped, calls Attach with the host pid
// of its init (whose network namespace is the sandbox's), and starts the
// sandbox only once Attach returned: no code of the sandbox runs before
// its interface exists. ResolvConf becomes the sandbox's /etc/resolv.conf
// (read-only).
type Network struct {
	ResolvConf string
	Attach     func(ctx context.Context, pid int) error
	// AttachNetns attaches the interface to the network namespace at
	// path (a bind mount of one) instead: for a runtime that makes the
	// sandbox's namespace itself before any of its processes, as gVisor's
	// runsc, whose kernel takes the interfaces it finds there when it
	// starts (internal/runtime/oci, runsc_linux.go). The same gateway as
	// Attach; a runtime uses one or the other.
	AttachNetns func(ctx context.Context, path string) error
	// Proxy, set for a runtime that is an EgressProxy instead, gives the
	// sandbox no interface: its agent listens for the sandbox's proxied
	// connections on ProxyAddr, its environment names that proxy
	// (ProxyEnv), and the runtime fetches each connection through the
	// agent for the engine's gateway (EgressProxy.ServeEgress; ResolvConf
	// and Attach are unset).
	Proxy bool
}

// ProxyPort is the port, on a proxied sandbox's loopback (Network.Proxy),
// where its agent listens for the connections the sandbox's code makes
// out; the server's gateway serves each (internal/egress, proxy_linux.go).
const ProxyPort = 3128

// ProxyAddr is that listener's address inside the sandbox.
const ProxyAddr = "127.0.0.1:3128"

// ProxyEnv is the environment that points a proxied sandbox's clients at
// ProxyAddr (both spellings: tools read one or the other).
func ProxyEnv() []string {
	u := "http://" + ProxyAddr
	return []string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1"}
}

// EgressProxy is a runtime whose sandboxes reach the network only through
// their agent's egress listener (a Pod: its NetworkPolicy denies all
// egress, and it has no interface the host could give it). Fetching the
// connections is the runtime's own work, on goroutines of its own that
// its Close waits for; the engine only says where they go.
type EgressProxy interface {
	// ServeEgress hands each connection the code of sandbox inst (as
	// Create or Attach returned it) makes to its egress listener to
	// serve, which owns it and may hold it for the connection's life,
	// until ctx ends. It returns at once. log, when set, is told of
	// fetches that failed (they are retried).
	ServeEgress(ctx context.Context, inst *Instance, serve func(net.Conn), log *slog.Logger)
}

// Instance is a running sandbox as the runtime sees it.
type Instance struct {
	ID string
	// Socket is the host path of the agent's listening unix socket.
	Socket string
	// Dial, when set, connects to the agent instead of Socket: a runtime
	// whose sandboxes the host reaches over a network (each connection
	// authenticated both ways, package agenttls).
	Dial func(ctx context.Context) (net.Conn, error)
	// PID is the host pid of the sandbox's init process.
	PID int
	// Node is where a Placer's sandbox runs ("" for other runtimes).
	Node string
}

// Usage is a sandbox's resource usage read from its cgroup.
type Usage struct {
	MemoryBytes      int64   // current memory use, page cache included
	MemoryCacheBytes int64   // the page cache within MemoryBytes (file pages, tmpfs included)
	MemoryPeakBytes  int64   // highest memory use since the sandbox started
	MemoryLimit      int64   // the limit in force
	OOMKills         uint64  // processes killed by the OOM killer in this sandbox
	CPUNanos         uint64  // CPU time used by all its processes
	CPULimit         float64 // the CPU limit in force, in CPUs (quota / period); 0: none
	Pids             int64   // tasks alive now, counted against Limits.Pids (not the agent's own)
	PidsDenied       uint64  // forks refused at the pids limit (pids.events "max")
	DiskBytes        int64   // bytes used in the writable layer now
	DiskTotalBytes   int64   // the writable layer's size
	// Pressure is the sandbox's pressure stall information, on cgroup v2
	// hosts whose kernel keeps it; nil elsewhere.
	Pressure *Pressure
}

// Pressure is PSI (cpu.pressure, memory.pressure, io.pressure of a
// cgroup v2): the share of the last 10 seconds, in percent, in which
// some of the sandbox's tasks (Some) or all of them (Full) were stalled
// waiting for the resource.
type Pressure struct {
	CPUSome    float64
	MemorySome float64
	MemoryFull float64
	IOSome     float64
	IOFull     float64
}

// LeftoverFunc is told of a sandbox left over from an engine that died
// (a crash), just before it is destroyed, with its last usage reading or
// the error of taking it (its cgroup gone): the server charges what it
// used since its last metering flush (internal/metering, recover.go).
// ctx bounds it; the destroy follows whatever it does.
type LeftoverFunc func(ctx context.Context, id string, u Usage, err error)

// DiskMemory is implemented by runtimes that may keep sandboxes' disks in
// memory: a tmpfs charged to the sandbox's memory cgroup, whose limit then
// holds memory plus disk. Admission counts such a disk as memory; a disk
// of its own (the oci runtime's loop-mounted image) is reserved on the
// host's disk by the runtime itself, which refuses a create it has no
// room for with ErrCapacity.
type DiskMemory interface {
	DiskInMemory() bool
}

// CPUCounter is implemented by runtimes that can read a sandbox's CPU
// time alone, cheaply (one cgroup file): the engine reads it a few times
// per execution that has a CPU time limit. It counts every process and
// thread of the sandbox, background ones included.
type CPUCounter interface {
	CPUTime(id string) (time.Duration, error)
}

// Resizer is implemented by runtimes that change a running sandbox's
// memory limit and the size of its writable layer. Resize sets each of
// l.MemoryBytes and l.DiskBytes that is above 0 and leaves the others.
// Shrinking the writable layer below what it holds fails with
// ErrTooSmall, growing it where the host cannot with ErrCannotGrow; both
// leave the sandbox untouched.
type Resizer interface {
	Resize(ctx context.Context, id string, l Limits) error
}

// OOMCounter is implemented by runtimes that can read a sandbox's OOM-kill
// count alone, cheaply (one cgroup file): the engine reads it before
// every execution, to tell an out-of-memory kill from another death.
type OOMCounter interface {
	OOMKills(id string) (uint64, error)
}

// Runtime starts and stops sandboxes.
type Runtime interface {
	// Name says which runtime this is ("runc", "runsc", "fake").
	Name() string
	// Create starts a sandbox and returns once its agent is listening.
	// On error nothing of the sandbox remains.
	Create(ctx context.Context, spec Spec) (*Instance, error)
	// Destroy kills every process of the sandbox and removes its cgroups,
	// mounts and files. Destroying an unknown or already destroyed sandbox
	// returns nil.
	Destroy(ctx context.Context, id string) error
	// Usage reads the sandbox's resource usage. A runtime whose host
	// cannot read its sandboxes' cgroups (kubernetes: they are on the
	// nodes) returns ErrUnsupported, and the engine asks the sandbox's
	// agent instead (agentproto.OpUsage).
	Usage(ctx context.Context, id string) (Usage, error)
	// List returns the IDs of every sandbox the runtime holds state for,
	// including ones left behind by a crashed process.
	List(ctx context.Context) ([]string, error)
}

// Checkpointer is implemented by runtimes that can save a running
// sandbox's processes, memory included, to a directory and end them
// (Checkpoint), and start them again from it (Restore), while the
// sandbox's files stay where they are. Between the two the sandbox holds
// no memory and no process; Destroy still removes it. A checkpoint
// needs every connection to the sandbox's agent closed, and a restored
// agent is reached at the Instance Restore returns (a new socket).
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, id, dir string) (*Instance, error)
}

// Snapshotter is implemented by Checkpointers that can also save a
// running sandbox's processes, memory and files to a directory while it
// runs on (Snapshot), and start a new sandbox from such a directory
// (Clone): spec is the new sandbox's (its own ID; the template, limits,
// writable paths and environment of the one snapshotted; a Network when
// the one snapshotted had one, else none), which gets a host id range,
// user namespace, cgroups and agent socket of its own, and its Network
// attached once its processes are restored (they run for that moment
// with no route out). One snapshot may be cloned any number of times;
// the directory is only read.
//
// A sandbox with a network is checkpointed or snapshotted only with its
// network detached (the TUN gone: egress.Gateway.Detach); the engine
// attaches its gateway again to the instance Restore returns, or to the
// same one after a Snapshot.
type Snapshotter interface {
	Snapshot(ctx context.Context, id, dir string) error
	Clone(ctx context.Context, spec Spec, dir string) (*Instance, error)
}

// Differ is implemented by Snapshotters that can list what a sandbox
// cloned from a snapshot changed in its files since: Changes compares
// sandbox id's files with the snapshot's in dir, over the template root
// lower (the files neither has written). Paths are the sandbox's,
// absolute, sorted.
type Differ interface {
	Changes(ctx context.Context, id, dir, lower string) (Changes, error)
}

// Changes are the paths a sandbox added, changed (content, type,
// permissions, link target) and deleted.
type Changes struct {
	Added, Changed, Deleted []string
}

// CheckpointKeeper is implemented by Checkpointers whose checkpointed
// sandboxes outlive the engine that paused them (the OCI runtime: a
// checkpointed sandbox's bundle, disk and id range stay until it is
// destroyed, and its runtime's Close leaves it): Checkpointed returns nil
// when sandbox id is checkpointed (no process runs) with a complete
// checkpoint of it in dir, which Restore can take, and otherwise says why
// not.
type CheckpointKeeper interface {
	Checkpointed(ctx context.Context, id, dir string) error
}

// Freezer is implemented by runtimes that can stop every process of a
// running sandbox where it is (Freeze: the cgroup freezer), memory kept,
// and let them go on (Thaw). A frozen sandbox's agent does not answer.
type Freezer interface {
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
}

// Attacher is implemented by runtimes whose sandboxes outlive the engine
// that created them and are served by every engine of a deployment (the
// replicas of a Kubernetes-backed server): Attach reaches a running
// sandbox another engine created. ErrNotFound: it is not running.
type Attacher interface {
	Attach(ctx context.Context, id string) (*Instance, error)
}

// Held is a sandbox a shared runtime holds, as its collector sees it.
type Held struct {
	ID      string
	Created time.Time
	// Pool: started ahead by a warm pool (Spec.Pool).
	Pool bool
	// Until, for a volume's attendant (Spec.Attendant), is its creation
	// plus its lifetime: no record claims it, and the collector leaves
	// it be until then unless it ended. Zero for others.
	Until time.Time
	// Ended: nothing of it runs any more (its agent exited: its
	// lifetime ended, or it crashed), or only leftovers of a failed
	// create remain; destroying it is all that is left to do.
	Ended bool
}

// Inventory is implemented by shared runtimes (see Attacher): it lists
// what they hold, for the server's garbage collector, which compares it
// with the sandboxes' records.
type Inventory interface {
	Inventory(ctx context.Context) ([]Held, error)
}

// Chooser is implemented by a runtime that offers each sandbox a choice
// of isolation (Spec.Runtime), such as the kubernetes runtime's
// RuntimeClasses.
type Chooser interface {
	// Runtimes names the choices, sorted.
	Runtimes() []string
}

// Placer is implemented by a runtime whose sandboxes run on several
// nodes, such as the kubernetes runtime's: the warm pool keeps its
// members on each node (Spec.Node) and hands out the one on the node
// running the fewest sandboxes.
type Placer interface {
	// Nodes names the nodes a sandbox can start on now, sorted.
	Nodes(ctx context.Context) ([]string, error)
}

// Offered names the values of Spec.Runtime that r accepts besides "":
// a Chooser's Runtimes, or else r's Name alone (a runtime without a
// choice is only itself).
func Offered(r Runtime) []string {
	if c, ok := r.(Chooser); ok {
		return c.Runtimes()
	}
	return []string{r.Name()}
}

// ErrNotFound reports an unknown sandbox.
var ErrNotFound = errors.New("sandbox not found")

// ErrTooSmall is Resize's error when the writable layer holds more than
// the size asked for.
var ErrTooSmall = errors.New("the sandbox holds more than the size asked for")

// ErrCannotGrow is Resize's error when the writable layer would have to
// grow past what it was made with and this host cannot grow it while the
// sandbox runs; nothing changed.
var ErrCannotGrow = errors.New("this host cannot grow a running sandbox's disk")

// ErrCapacity reports that the host has no room for another sandbox (a
// per-host resource the runtime hands out is used up).
var ErrCapacity = errors.New("no room for another sandbox on this host")

// ErrUnsupported reports a runtime that cannot work on this host, or
// cannot do what was asked of it (a network for a Pod, a Pod's usage).
var ErrUnsupported = errors.New("runtime not supported on this host")
