// Package cgroup reads a cgroup's usage counters from its files, on
// cgroup v2 (one directory) and v1 (a directory per controller): memory
// in use, its page cache, peak and limit, OOM kills, CPU time and quota,
// tasks and refused forks, and (v2) pressure stall information. It is the
// one parser of those files: the OCI runtime reads a sandbox's cgroup on
// the host with it, the agent its own container's cgroup inside a Pod.
// Finding the directories (which mount, which controller, which path) is
// left to each caller, whose views of the hierarchy differ.
//
// Imports: internal/psi and the standard library only (the agent is a
// static binary of the standard library and x/sys).
package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sheepfold/sheepfold/internal/psi"
)

// Usage is a cgroup's counters. A file that is missing or does not parse
// counts zero (a controller not enabled, an older kernel).
type Usage struct {
	MemoryBytes      int64   // v2 memory.current, v1 memory.usage_in_bytes: page cache included
	MemoryCacheBytes int64   // v2 memory.stat file, v1 memory.stat total_cache (the cgroup and its children)
	MemoryPeakBytes  int64   // v2 memory.peak (Linux 5.19+), v1 memory.max_usage_in_bytes
	MemoryLimit      int64   // v2 memory.max (-1: none), v1 memory.limit_in_bytes (its huge "none" as is)
	OOMKills         uint64  // v2 memory.events, v1 memory.oom_control (Linux 4.13+): oom_kill
	CPUNanos         uint64  // v2 cpu.stat usage_usec, v1 cpuacct.usage
	CPULimit         float64 // CPUs: v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us; 0: none
	Pids             int64   // pids.current
	PidsDenied       uint64  // pids.events max
	// Pressure is the v2 cgroup's PSI; nil on v1, or where the kernel
	// keeps none.
	Pressure *psi.Pressure
}

// ReadV2 reads the cgroup v2 directory dir. found is false when it shows
// neither memory nor CPU counters (not a cgroup, or one whose controllers
// are not enabled).
func ReadV2(dir string) (u Usage, found bool) {
	cur, errMem := Int(filepath.Join(dir, "memory.current"))
	cpu, errCPU := Key(filepath.Join(dir, "cpu.stat"), "usage_usec")
	u.MemoryBytes = cur
	u.CPUNanos = uint64(max(cpu, 0)) * 1000
	u.MemoryCacheBytes, _ = Key(filepath.Join(dir, "memory.stat"), "file")
	u.MemoryPeakBytes, _ = Int(filepath.Join(dir, "memory.peak"))
	u.MemoryLimit, _ = Int(filepath.Join(dir, "memory.max"))
	oom, _ := Key(filepath.Join(dir, "memory.events"), "oom_kill")
	u.OOMKills = uint64(max(oom, 0))
	u.CPULimit = CPUMax(filepath.Join(dir, "cpu.max"))
	u.Pids, _ = Int(filepath.Join(dir, "pids.current"))
	denied, _ := Key(filepath.Join(dir, "pids.events"), "max")
	u.PidsDenied = uint64(max(denied, 0))
	u.Pressure = psi.ReadCgroup(dir)
	return u, errMem == nil || errCPU == nil
}

// V1 names the directories of a v1 cgroup's controllers; "" is a
// controller that is not mounted (its figures read zero). CPU and CPUAcct
// are often one directory (a joint "cpu,cpuacct" mount).
type V1 struct {
	Memory, CPUAcct, CPU, Pids string
}

// ReadV1 reads the v1 controllers' directories. found is false when
// neither the memory nor the cpuacct counter could be read.
func ReadV1(d V1) (u Usage, found bool) {
	var errMem, errCPU error = os.ErrNotExist, os.ErrNotExist
	if d.Memory != "" {
		u.MemoryBytes, errMem = Int(filepath.Join(d.Memory, "memory.usage_in_bytes"))
		// total_cache counts the cgroup and its children, as
		// usage_in_bytes does.
		u.MemoryCacheBytes, _ = Key(filepath.Join(d.Memory, "memory.stat"), "total_cache")
		u.MemoryPeakBytes, _ = Int(filepath.Join(d.Memory, "memory.max_usage_in_bytes"))
		u.MemoryLimit, _ = Int(filepath.Join(d.Memory, "memory.limit_in_bytes"))
		oom, _ := Key(filepath.Join(d.Memory, "memory.oom_control"), "oom_kill")
		u.OOMKills = uint64(max(oom, 0))
	}
	if d.CPUAcct != "" {
		var n int64
		n, errCPU = Int(filepath.Join(d.CPUAcct, "cpuacct.usage"))
		u.CPUNanos = uint64(max(n, 0))
	}
	if d.CPU != "" {
		quota, _ := Int(filepath.Join(d.CPU, "cpu.cfs_quota_us"))
		period, _ := Int(filepath.Join(d.CPU, "cpu.cfs_period_us"))
		if quota > 0 && period > 0 {
			u.CPULimit = float64(quota) / float64(period)
		}
	}
	if d.Pids != "" {
		u.Pids, _ = Int(filepath.Join(d.Pids, "pids.current"))
		denied, _ := Key(filepath.Join(d.Pids, "pids.events"), "max")
		u.PidsDenied = uint64(max(denied, 0))
	}
	return u, errMem == nil || errCPU == nil
}

// ErrNoKey reports a flat-keyed file without the key asked for.
var ErrNoKey = errors.New("no such key")

// Int reads a file of one integer (memory.current, pids.current,
// cpuacct.usage...); "max" (no limit) is -1, and a v1 counter beyond
// int64 (it never is) reads as the largest int64.
func Int(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil {
			return int64(min(u, 1<<63-1)), nil
		}
		return 0, &os.PathError{Op: "parse", Path: path, Err: err}
	}
	return n, nil
}

// Key reads the value of key in a flat-keyed file of "key value" lines
// (cpu.stat, memory.stat, memory.events, pids.events,
// memory.oom_control); ErrNoKey when no line has it.
func Key(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, &os.PathError{Op: "parse " + key, Path: path, Err: err}
			}
			return n, nil
		}
	}
	return 0, &os.PathError{Op: "read " + key, Path: path, Err: ErrNoKey}
}

// CPUMax reads a v2 cpu.max ("quota period", or "max period" for no
// limit) as a number of CPUs; 0 for none, or a file that cannot be read.
func CPUMax(path string) float64 {
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
