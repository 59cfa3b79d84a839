package sandbox

import (
	"context"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// limitCounts are the sandbox cgroup's counters of limits hit: processes
// the OOM killer ended (memory) and forks refused at pids.max (pids.events
// "max").
type limitCounts struct {
	oomKills, pidsDenied uint64
	memoryPeak           int64 // read when an OOM kill ended the whole sandbox
}

// reportLimits emits resource_exceeded for the memory and pids limits the
// cgroup counted since the sandbox last reported them. It is called after
// something failed (an execution that did not succeed, a command that
// exited non-zero or by a signal), never on the way of one that went
// well: a fork refused inside code that then succeeds is not reported.
// memory is false where the caller reports an OOM kill itself (an
// execution, whose error says so). A disk full at its limit is reported
// here for commands (diskFull); executions report it from the kernel.
// It returns whether a fork was refused at pids.max since the last report.
func (s *Sandbox) reportLimits(execID string, u runtime.Usage, memory, diskFull bool) (pids bool) {
	s.mu.Lock()
	seen := s.seen
	s.seen.oomKills = max(seen.oomKills, u.OOMKills)
	s.seen.pidsDenied = max(seen.pidsDenied, u.PidsDenied)
	lim := s.Limits
	s.mu.Unlock()
	if u.PidsDenied > seen.pidsDenied {
		// A fork is refused when the sandbox holds pids.max tasks: what
		// was observed is the limit reached, and how many were refused.
		s.emit(events.ResourceExceeded, execID, map[string]any{"resource": events.ResourcePids, "limit": lim.Pids,
			"observed": lim.Pids, "refused": u.PidsDenied - seen.pidsDenied, "unit": "tasks"})
	}
	if memory && u.OOMKills > seen.oomKills {
		s.emit(events.ResourceExceeded, execID, map[string]any{"resource": events.ResourceMemory, "limit": lim.MemoryBytes,
			"observed": u.MemoryPeakBytes, "oom_kills": u.OOMKills - seen.oomKills, "unit": "bytes"})
	}
	if diskFull && lim.DiskBytes > 0 && u.DiskBytes >= lim.DiskBytes-lim.DiskBytes/100 {
		s.emit(events.ResourceExceeded, execID, map[string]any{"resource": events.ResourceDisk, "limit": lim.DiskBytes,
			"observed": u.DiskBytes, "unit": "bytes"})
	}
	return u.PidsDenied > seen.pidsDenied
}

// commandEnded reports the limits a command that failed may have hit.
func (s *Sandbox) commandEnded(res *ProcessResult) {
	if res.ExitCode == 0 && res.Signal == 0 {
		return
	}
	u, err := s.usage(context.Background())
	if err != nil {
		return
	}
	s.reportLimits("", u, true, true)
}
