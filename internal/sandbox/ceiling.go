package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// One ceiling: every way of asking for a sandbox's resources (the /v1
// `resources`, the security policy's resource_limits and the
// sandbox_config shorthand, E2B's cpuCount and memoryMB, the CLI's flags,
// a lifetime at create or later) is decided by Grant, against the
// engine's own bounds (Config.MaxLimits, MaxTimeout), the account's
// maxima and the host's admission capacity (Ceiling). What it grants is
// what the runtime is given: the cgroup's memory and pids limits, the CPU
// quota and the size of the writable layer.

// FieldNames are the caller's names for what a create asks for, so that
// a refusal names the field the caller wrote: "resources.memory_mb" on
// the /v1 API, "memoryMB" on E2B's, "--memory" on the command line. An
// empty name takes the engine's own ("limits.memory", ...).
type FieldNames struct {
	CPUs, Memory, Disk, Pids, Timeout string
	// PolicyMemory and PolicyDisk name the security policy's
	// resource_limits.memory_mb and disk_write_mb (or the shorthand's
	// max_memory_mb, where that set it).
	PolicyMemory, PolicyDisk string
}

func (n FieldNames) orDefaults() FieldNames {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&n.CPUs, "limits.cpus")
	def(&n.Memory, "limits.memory")
	def(&n.Disk, "limits.disk")
	def(&n.Pids, "limits.pids")
	def(&n.Timeout, "timeout")
	def(&n.PolicyMemory, "security_policy.resource_limits.memory_mb")
	def(&n.PolicyDisk, "security_policy.resource_limits.disk_write_mb")
	return n
}

// Ceiling is what bounds one sandbox beyond the engine's own
// Config.MaxLimits and MaxTimeout: an account's per-sandbox maxima (zero:
// no bound of the account's) and the host's admission capacity.
type Ceiling struct {
	CPUs        float64       // the account's max_cpus
	MemoryBytes int64         // the account's max_memory_mb
	DiskBytes   int64         // the account's max_disk_mb
	Timeout     time.Duration // the account's max_timeout
	// HostBytes bounds what admission counts of one sandbox against the
	// host's memory (Manager.Footprint): the most the host can ever
	// commit to it.
	HostBytes int64
}

// Grant is what a new sandbox is given.
type Grant struct {
	Limits  runtime.Limits
	Timeout time.Duration
}

// The smallest sandbox.
const (
	minMemoryBytes = 32 << 20
	minDiskBytes   = 1 << 20
	minPids        = 8
	minCPUs        = 0.05
)

// bound is one resource's ceiling, in the resource's unit (CPUs,
// bytes, tasks, seconds), with whose it is for refusals.
type bound struct {
	most  float64
	whose string // "this account's max_memory_mb", "this server's largest sandbox"
}

// tighter is the lower of the engine's bound and the account's (0: none).
func tighter(engine, account float64, accountName string) bound {
	if account > 0 && account < engine {
		return bound{account, "this account's " + accountName}
	}
	return bound{engine, "this server's largest sandbox"}
}

// Grant decides a new sandbox's limits and lifetime from opt (Limits,
// Timeout and the policy's resource_limits, named by opt.Names) under c
// and the engine's own bounds. Each value asked for must lie between the
// smallest sandbox and the ceiling: otherwise ERR_BAD_REQUEST naming the
// field (Details["field"]). The policy's memory and disk, when set, are
// what the sandbox gets (both they and the plain limits are checked);
// what nobody asked for is the engine's default cut to the ceiling.
// Its footprint (memory, plus disk where the runtime keeps disks in
// memory) must fit c.HostBytes. Every create passes here twice:
// at the server with the account's ceiling, and in Manager.Create with
// the engine's bounds alone, whoever calls it.
func (m *Manager) Grant(opt CreateOptions, c Ceiling) (Grant, error) {
	n := opt.Names.orDefaults()
	most, def := m.cfg.MaxLimits, m.cfg.DefaultLimits
	cpus := tighter(most.CPUs, c.CPUs, "max_cpus")
	mem := tighter(float64(most.MemoryBytes), float64(c.MemoryBytes), "max_memory_mb")
	disk := tighter(float64(most.DiskBytes), float64(c.DiskBytes), "max_disk_mb")
	pids := tighter(float64(most.Pids), 0, "")
	life := tighter(m.cfg.MaxTimeout.Seconds(), c.Timeout.Seconds(), "max_timeout")

	type ask struct {
		field string
		v     float64 // 0: not asked
		b     bound
		least float64
		show  func(float64) string
		out   *float64
	}
	var cpu, memory, diskSize, tasks, seconds float64
	asks := []ask{
		{n.CPUs, opt.Limits.CPUs, cpus, minCPUs, showCPUs, &cpu},
		{n.Memory, float64(opt.Limits.MemoryBytes), mem, minMemoryBytes, showMiB, &memory},
		{n.PolicyMemory, float64(opt.Policy.MemoryBytes()), mem, minMemoryBytes, showMiB, &memory},
		{n.Disk, float64(opt.Limits.DiskBytes), disk, minDiskBytes, showMiB, &diskSize},
		{n.PolicyDisk, float64(opt.Policy.DiskBytes()), disk, minDiskBytes, showMiB, &diskSize},
		{n.Pids, float64(opt.Limits.Pids), pids, minPids, showCount, &tasks},
		{n.Timeout, opt.Timeout.Seconds(), life, 1e-3, showSeconds, &seconds},
	}
	for _, a := range asks {
		switch {
		case a.v == 0:
		case math.IsNaN(a.v) || a.v < a.least:
			return Grant{}, refuse(a.field, "%s asks for %s; the smallest sandbox has %s", a.field, a.show(a.v), a.show(a.least))
		case a.v > a.b.most:
			return Grant{}, refuse(a.field, "%s asks for %s, above %s of %s", a.field, a.show(a.v), a.b.whose, a.show(a.b.most))
		default:
			*a.out = a.v // a later ask of the same resource (the policy's) wins
		}
	}
	g := Grant{Limits: runtime.Limits{CPUs: cpu, MemoryBytes: int64(memory), DiskBytes: int64(diskSize), Pids: int64(tasks)},
		Timeout: opt.Timeout}
	// What nobody asked for: the engine's default, cut to the ceiling.
	if g.Limits.CPUs == 0 {
		g.Limits.CPUs = min(def.CPUs, cpus.most)
	}
	if g.Limits.MemoryBytes == 0 {
		g.Limits.MemoryBytes = min(def.MemoryBytes, int64(mem.most))
	}
	if g.Limits.DiskBytes == 0 {
		g.Limits.DiskBytes = min(def.DiskBytes, int64(disk.most))
	}
	if g.Limits.Pids == 0 {
		g.Limits.Pids = min(def.Pids, int64(pids.most))
	}
	if g.Timeout == 0 {
		g.Timeout = min(m.cfg.DefaultTimeout, time.Duration(life.most*float64(time.Second)))
	}
	// A ceiling below the smallest sandbox leaves nothing to grant.
	for _, a := range []struct {
		field string
		got   float64
		b     bound
		least float64
		show  func(float64) string
	}{
		{n.CPUs, g.Limits.CPUs, cpus, minCPUs, showCPUs},
		{n.Memory, float64(g.Limits.MemoryBytes), mem, minMemoryBytes, showMiB},
		{n.Disk, float64(g.Limits.DiskBytes), disk, minDiskBytes, showMiB},
	} {
		if a.got < a.least {
			return Grant{}, refuse(a.field, "%s: %s of %s is below the smallest sandbox (%s)", a.field, a.b.whose, a.show(a.b.most), a.show(a.least))
		}
	}
	// Admission counts the footprint: one sandbox larger than the host
	// could ever hold is the request's mistake, not a wait for capacity.
	// The field named is the larger of the two that was asked for (the
	// memory alone where the disk is not memory).
	if c.HostBytes > 0 && m.Footprint(g.Limits) > c.HostBytes {
		memField, diskField := "", ""
		switch {
		case opt.Policy.MemoryBytes() > 0:
			memField = n.PolicyMemory
		case opt.Limits.MemoryBytes > 0:
			memField = n.Memory
		}
		switch {
		case opt.Policy.DiskBytes() > 0:
			diskField = n.PolicyDisk
		case opt.Limits.DiskBytes > 0:
			diskField = n.Disk
		}
		if !m.DiskInMemory() {
			if memField == "" {
				memField = n.Memory // nothing asked: the default does not fit
			}
			return Grant{}, refuse(memField, "%s: memory %s is more than this host can hold for one sandbox (%s)",
				memField, showMiB(float64(g.Limits.MemoryBytes)), showMiB(float64(c.HostBytes)))
		}
		field := memField
		if field == "" || diskField != "" && g.Limits.DiskBytes > g.Limits.MemoryBytes {
			field = diskField
		}
		if field == "" {
			field = n.Memory // nothing asked: the defaults do not fit
		}
		return Grant{}, refuse(field, "%s: memory %s plus disk %s (kept in memory) is more than this host can hold for one sandbox (%s)",
			field, showMiB(float64(g.Limits.MemoryBytes)), showMiB(float64(g.Limits.DiskBytes)), showMiB(float64(c.HostBytes)))
	}
	return g, nil
}

// DiskInMemory says whether the runtime keeps sandboxes' disks in memory
// (runtime.DiskMemory): a runtime that does not say so keeps them on disk.
func (m *Manager) DiskInMemory() bool {
	dm, ok := m.cfg.Runtime.(runtime.DiskMemory)
	return ok && dm.DiskInMemory()
}

// Footprint is what a sandbox of these limits may take of the host's
// memory, what admission counts: its memory limit, plus its disk where
// the runtime keeps disks in memory. Zero fields are the engine's defaults.
func (m *Manager) Footprint(l runtime.Limits) int64 {
	mem, disk := l.MemoryBytes, l.DiskBytes
	if mem <= 0 {
		mem = m.cfg.DefaultLimits.MemoryBytes
	}
	if !m.DiskInMemory() {
		return mem
	}
	if disk <= 0 {
		disk = m.cfg.DefaultLimits.DiskBytes
	}
	return mem + disk
}

// refuse is a ceiling's refusal, naming the field.
func refuse(field, format string, args ...any) error {
	return &apierr.Error{Code: apierr.BadRequest, Message: fmt.Sprintf(format, args...), Details: map[string]any{"field": field}}
}

func showMiB(b float64) string {
	if int64(b)%(1<<20) == 0 {
		return strconv.FormatInt(int64(b)>>20, 10) + " MiB"
	}
	return strconv.FormatFloat(b/(1<<20), 'f', 2, 64) + " MiB"
}

func showCPUs(v float64) string    { return strconv.FormatFloat(v, 'g', -1, 64) + " CPUs" }
func showCount(v float64) string   { return strconv.FormatFloat(v, 'f', 0, 64) + " tasks" }
func showSeconds(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) + " s" }
