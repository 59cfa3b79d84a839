package oci

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Paths inside every sandbox.
const (
	AgentPath = "/.sheepfold/agent"   // the agent binary, bind-mounted read-only
	SudoPath  = "/usr/local/bin/sudo" // the agent binary again, as sudo (agent.Sudo)
	// HomeSeedPath is, in an exported image, the template's home as a tar
	// archive (internal/homeseed), which a Pod's agent unpacks into the
	// empty volume mounted over SandboxHome.
	HomeSeedPath = "/.sheepfold/home.tar"
	SandboxHome  = "/home/user"
	SandboxUID   = 1000 // "user" inside; the template's passwd has it
	SandboxGID   = 1000
)

// BaseEnv is the environment every sandbox starts with; Spec.Env adds to
// it. Images exported from templates carry it as their Env too. Do not
// modify it.
var BaseEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=" + SandboxHome,
	"USER=user",
	"LOGNAME=user",
	"SHELL=/bin/bash",
	"LANG=C.UTF-8",
	"LC_ALL=C.UTF-8",
	"PYTHONUNBUFFERED=1",
	"MPLBACKEND=Agg",
}

// SandboxOOMScoreAdj is the oom_score_adj of a sandbox's init, and so of
// every process in it: when the host runs out of memory, the kernel kills
// sandboxed processes before the server (whose own score is left as it
// is). The agent raises its interpreters to 1000, so that inside a
// sandbox they go before the agent. Raising a score needs no privilege.
// Where runc holds CAP_SYS_RESOURCE the value is also the floor no process
// inside can go below; without it (hosts whose root lacks it) code inside
// may lower its own score back to 0, never below the server's.
const SandboxOOMScoreAdj = 500

// IDMap maps uids and gids 0..Size-1 to host HostID..HostID+Size-1. The
// template's files are owned by the shifted ids DefaultIDMap
// (template.BuildOptions.UIDShift); each sandbox gets a range of its own
// after it (see ids_linux.go) and sees the template through an idmapped
// mount.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// DefaultIDMap is the mapping templates are built for; no sandbox runs
// with it.
var DefaultIDMap = IDMap{HostID: 1_000_000, Size: 65536}

// DefaultIDsDir is the host-wide registry of sandboxes' id ranges.
const DefaultIDsDir = "/run/sheepfold/ids"

// DefaultSlots is how many id ranges there are by default: host ids from
// the end of the template's range up to about 269 million.
const DefaultSlots = 4096

// Config configures the OCI runtime. Zero fields take the defaults below.
type Config struct {
	// RuntimePath is the runc binary.
	RuntimePath string
	// RunscPath, when set, is gVisor's runsc (built static: `make setup`),
	// which runs the sandboxes whose Spec.Runtime is RuntimeGVisor
	// (runsc_linux.go); empty: this engine offers runc alone.
	RunscPath string
	// DefaultRuntime is the isolation of a sandbox whose Spec.Runtime is
	// empty: RuntimeRunc (the default) or RuntimeGVisor (needs RunscPath).
	DefaultRuntime string
	// CriuPath is the CRIU binary runc's checkpoint and restore run
	// (runtime.Checkpointer); its name must be "criu" (runc runs it by
	// that name from its PATH). Default: criu beside RuntimePath, where
	// `make setup` builds it (scripts/criu.sh). Only checkpoints need it.
	CriuPath string
	// StateDir holds one directory per engine instance (a server, or one
	// `sheepfold run`), each with one bundle per sandbox (config.json, the
	// overlay mount, the agent's socket and log) and the runtime's own state.
	StateDir string
	// Instance names this engine's directory under StateDir and its cgroup
	// under CgroupParent; default "server". An instance holds a lock on its
	// directory while it lives; New sweeps the directories of instances
	// whose lock is free (their process died) and destroys what they left.
	Instance string
	// AgentBin is the host path of the static agent binary, bind-mounted
	// read-only into every sandbox.
	AgentBin string
	// CgroupParent names the cgroup, under CgroupRoot, in which each
	// instance has one with a cgroup per sandbox; default "sheepfold".
	CgroupParent string
	// CgroupRoot is the cgroup (a path in the hierarchy, "/" its root)
	// under which CgroupParent is made. Empty chooses (cgroupRoot): on
	// cgroup v2, the cgroup systemd delegated to this process's service
	// (Delegate=yes) or the root of a private cgroup namespace, after
	// moving this process into a leaf of it; otherwise "/".
	CgroupRoot string
	// IDMap is the host id range templates are built with (their files'
	// owners); default DefaultIDMap. Sandboxes' ranges (of IDMap.Size
	// ids each) follow it.
	IDMap IDMap
	// IDsDir is the registry of host id ranges in use, shared by every
	// engine on the host; default DefaultIDsDir.
	IDsDir string
	// Slots is the number of id ranges, and so of sandboxes that can
	// exist at once on the host; default DefaultSlots.
	Slots int
	// Leftover, when set, is told of each sandbox of a dead instance,
	// with its last usage reading, just before the sweep destroys it (the
	// server charges what it used since its last metering flush).
	Leftover runtime.LeftoverFunc
	// DiskInMemory keeps sandboxes' writable layers in memory: a tmpfs of
	// the disk limit's size, charged to the sandbox's memory cgroup, whose
	// limit is then memory plus disk. Otherwise each sandbox has a disk of
	// its own, an ext4 image on the StateDir's filesystem behind a loop
	// device (disk_linux.go); a host without loop devices or mkfs.ext4
	// falls back to memory, with a warning.
	DiskInMemory bool
	// MinFreeDiskBytes is what StateDir's filesystem keeps free after a
	// sandbox's disk is allocated (for the database, logs and templates):
	// a create that would leave less fails with runtime.ErrCapacity;
	// default DefaultMinFreeDisk.
	MinFreeDiskBytes int64
	// VolumesDir holds the persistent volumes (runtime.Volumes,
	// volume_linux.go), one directory each, kept across engines; empty:
	// this engine keeps none and refuses sandboxes that mount one.
	VolumesDir string
	// CDISpecDirs are the directories of the host's CDI specs (the
	// Container Device Interface: /etc/cdi and /var/run/cdi where vendors
	// put them), which describe the devices sandboxes can be given
	// (runtime.Devices, cdi_linux.go); empty: none.
	CDISpecDirs []string
	// Logger receives debug and error logs; default slog.Default().
	Logger *slog.Logger
}

// The names of the runtimes a sandbox may choose (runtime.Spec.Runtime).
const (
	RuntimeRunc   = "runc"   // runc: namespaces, seccomp and cgroups on the host kernel
	RuntimeGVisor = "gvisor" // gVisor's runsc: the Sentry, a kernel in user space, in front of the host's
)

// DefaultMinFreeDisk is Config.MinFreeDiskBytes's default.
const DefaultMinFreeDisk = 256 << 20

func (c *Config) setDefaults() error {
	if c.RuntimePath == "" || c.StateDir == "" || c.AgentBin == "" {
		return errors.New("oci: RuntimePath, StateDir and AgentBin are required")
	}
	if !filepath.IsAbs(c.StateDir) {
		return errors.New("oci: StateDir must be absolute")
	}
	switch c.DefaultRuntime {
	case "":
		c.DefaultRuntime = RuntimeRunc
	case RuntimeRunc:
	case RuntimeGVisor:
		if c.RunscPath == "" {
			return errors.New("oci: the default runtime gvisor needs RunscPath (gVisor's runsc: make setup builds it)")
		}
	default:
		return fmt.Errorf("oci: unknown default runtime %q: %s or %s", c.DefaultRuntime, RuntimeRunc, RuntimeGVisor)
	}
	if c.RunscPath != "" && !filepath.IsAbs(c.RunscPath) {
		return fmt.Errorf("oci: RunscPath %q must be absolute", c.RunscPath)
	}
	if c.CriuPath == "" {
		c.CriuPath = filepath.Join(filepath.Dir(c.RuntimePath), "criu")
	}
	if filepath.Base(c.CriuPath) != "criu" || !filepath.IsAbs(c.CriuPath) {
		return fmt.Errorf("oci: CriuPath %q must be an absolute path to a file named criu (runc runs it by that name)", c.CriuPath)
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "sheepfold"
	}
	if c.Instance == "" {
		c.Instance = "server"
	}
	if !validID(c.CgroupParent) || !validID(c.Instance) {
		return errors.New("oci: CgroupParent and Instance must be lowercase letters, digits and '-'")
	}
	if c.CgroupRoot != "" && (!path.IsAbs(c.CgroupRoot) || path.Clean(c.CgroupRoot) != c.CgroupRoot) {
		return fmt.Errorf("oci: CgroupRoot %q is not a clean absolute cgroup path such as /system.slice/sheepfold.service", c.CgroupRoot)
	}
	if c.IDMap.Size == 0 {
		c.IDMap = DefaultIDMap
	}
	if c.IDsDir == "" {
		c.IDsDir = DefaultIDsDir
	}
	if c.Slots <= 0 {
		c.Slots = DefaultSlots
	}
	if c.MinFreeDiskBytes <= 0 {
		c.MinFreeDiskBytes = DefaultMinFreeDisk
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// validID accepts what we use as sandbox ids and cgroup names: 1 to 40
// lowercase letters, digits and '-', not starting with '-'.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 40 || id[0] == '-' {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
