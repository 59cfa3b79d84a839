package kernel

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// An execution's end is the driver's word: its "done" on the control pipe
// and its marker on stdout and stderr, which the code it runs can write
// too (Python can read the marker off the driver's frame, Bash from a
// variable, and any of them can close its stdout and stderr), and code
// can leave threads, timers or background jobs running after it returned
// honestly. So the CPU time limit does not stop at the end: until the
// next execution starts, the kernel goes on counting the CPU time of the
// interpreter's process group, and charges it to the execution that
// ended. Past the limit (the execution's own CPU time plus what ran after
// it, with idleGrace for the clock's rounding and a runtime's own threads
// finishing) it kills the group; the context's next execution reports it
// (StatusCPULimit) instead of running, and the one after runs in a fresh
// interpreter. The readings come every idleEvery while little of the
// budget is left, and up to a second apart while much is (next); none is
// taken on the execution's path, and /proc is listed for new members at
// most once a second (scanEvery).
//
// The count is read from /proc by the agent, out of the reach of the code
// (another user, a process it cannot ptrace). It covers the interpreter's
// threads and every process of its process group (background jobs,
// children it did not wait for); a process that left the group (setsid,
// setpgid) is not counted and not killed: that needs allow_subprocess,
// and such processes are bounded by the sandbox's CPU quota (while an
// execution runs, a local sandbox's cgroup count covers them too,
// internal/sandbox cpu.go).

// idleGrace is the CPU time past the limit a context may use between
// executions before it is killed.
const idleGrace = 100 * time.Millisecond

// idleEvery is the shortest wait between two readings, and the first
// one's after the end. Each reading wakes the agent (about 0.15 to 0.4
// ms of CPU time on a loaded host, in the sandbox's cgroup): ten a
// second keep an idle context under the idle stop's 1 % of a CPU, even
// under a tiny limit, at the cost of a kill up to idleEvery (on every
// CPU) past the budget.
const idleEvery = 100 * time.Millisecond

// idleWatch counts what an execution's process group burns after the
// execution ended. Nothing of it runs on the execution's path: the first
// reading is a timer's, idleEvery after the end, and the next execution
// stops the timer. The interpreter's own CPU time is counted from its
// reading at the end (finish reads it anyway); the other members of the
// group from the first reading (what they burn before it, at most
// idleEvery on each CPU, is not counted), or in full when they appear
// later.
type idleWatch struct {
	pgid     int
	ownTicks uint64  // the interpreter's utime + stime at the end
	budget   float64 // ms the group may use after the end
	usedMS   float64 // by the execution before its end
	limit    float64 // ms, the execution's limit

	// mu guards the fields below; read holds it throughout, so stop
	// waits for a reading under way.
	mu      sync.Mutex
	timer   *time.Timer
	last    map[procKey]uint64 // the last reading; nil before the first
	scanned time.Time          // when /proc was last listed (scanEvery)
	afterMS float64            // counted after the end
	killed  bool
	stopped bool
}

// idleVerdict is what an idle watch saw until it was stopped.
type idleVerdict struct {
	killed          bool
	usedMS, limitMS float64 // the execution's CPU time, the end's included; its limit
}

// watchIdle starts counting the CPU time of the process group pgid, whose
// leader's own CPU time was ownTicks, after an execution that used usedMS
// of a limit of limitMS.
func watchIdle(pgid int, ownTicks uint64, usedMS, limitMS float64) *idleWatch {
	w := &idleWatch{pgid: pgid, ownTicks: ownTicks, usedMS: usedMS, limit: limitMS,
		budget: max(limitMS-usedMS, 0) + float64(idleGrace.Milliseconds())}
	w.mu.Lock()
	w.timer = time.AfterFunc(idleEvery, w.read)
	w.mu.Unlock()
	return w
}

// read takes one reading of the group, kills it past the budget, and
// sets the timer for the next one.
func (w *idleWatch) read() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	var now map[procKey]uint64
	if w.last == nil || time.Since(w.scanned) >= scanEvery {
		now = groupCPU(w.pgid, w.last)
		w.scanned = time.Now()
	} else {
		now = w.membersCPU()
	}
	for key, ticks := range now {
		prev, ok := w.last[key]
		if w.last == nil {
			prev, ok = ticks, true // there at the end: from now on
			if key.pid == uint64(w.pgid) {
				prev = w.ownTicks
			}
		}
		switch {
		case !ok:
			w.afterMS += float64(ticks) * 1000 / clockTicks // started since the last reading
		case ticks > prev:
			w.afterMS += float64(ticks-prev) * 1000 / clockTicks
		}
	}
	w.last = now
	if len(now) == 0 {
		return // the group is gone
	}
	if w.afterMS > w.budget {
		_ = syscall.Kill(-w.pgid, syscall.SIGKILL)
		w.killed = true
		return
	}
	w.timer.Reset(w.next())
}

// scanEvery is how often a reading lists /proc for the group's members
// (which costs a read of every process's stat); the readings between
// read the members already known. A process that joins the group is
// found within scanEvery and counted in full from its start.
const scanEvery = time.Second

// membersCPU reads the CPU time of the members of the last reading that
// are still in the group.
func (w *idleWatch) membersCPU() map[procKey]uint64 {
	out := make(map[procKey]uint64, len(w.last))
	for key := range w.last {
		if grp, ticks, start, ok := procStat(key.pid); ok && grp == w.pgid && start == key.start {
			out[key] = ticks
		}
	}
	return out
}

// next is the wait before the next reading: long enough that an idle
// context costs little (each reading lists /proc), short enough that the
// group cannot use more than a quarter of what is left of its budget
// meanwhile, even on every CPU; at least idleEvery, at most a second.
func (w *idleWatch) next() time.Duration {
	left := time.Duration((w.budget - w.afterMS) * float64(time.Millisecond))
	return min(max(left/time.Duration(4*goruntime.NumCPU()), idleEvery), time.Second)
}

// stop ends the watch and returns what it saw.
func (w *idleWatch) stop() idleVerdict {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
	return idleVerdict{killed: w.killed, usedMS: w.usedMS + w.afterMS, limitMS: w.limit}
}

// report is the Done (and the error event) of the execution that finds
// its context killed at the limit after the previous one ended.
func (v idleVerdict) report(emit func(agentproto.Event) error) agentproto.Event {
	_ = emit(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{Name: "CPUTimeExceeded",
		Value: fmt.Sprintf("the previous execution's code went on running after the execution ended and used %s of CPU time in all, "+
			"more than its limit of %s (cpu_time_seconds); the interpreter was killed, state is lost, and this code did not run",
			(time.Duration(v.usedMS) * time.Millisecond).Round(time.Millisecond), time.Duration(v.limitMS)*time.Millisecond)}})
	return agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusCPULimit,
		Stats: &agentproto.Stats{CPUTimeMS: v.usedMS}}
}

// procKey names a process across pid reuse: its pid and start time.
type procKey struct{ pid, start uint64 }

// groupCPU returns the CPU time (utime + stime, in clock ticks) of every
// process of the process group pgid. Its own threads count; its children
// count as the group's members (cutime would count a reaped child twice).
// prev, the last reading, only sizes the map.
func groupCPU(pgid int, prev map[procKey]uint64) map[procKey]uint64 {
	out := make(map[procKey]uint64, len(prev))
	d, err := os.Open("/proc")
	if err != nil {
		return out
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		grp, ticks, start, ok := procStat(pid)
		if ok && grp == pgid {
			out[procKey{pid, start}] = ticks
		}
	}
	return out
}

// procStat reads a process's process group, utime + stime and start time
// from /proc/<pid>/stat.
func procStat(pid uint64) (pgrp int, ticks, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(pid, 10) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(s[i+1:]) // from field 3 (state) on
	if len(f) < 20 {
		return 0, 0, 0, false
	}
	g, err1 := strconv.Atoi(f[2])                // field 5, pgrp
	ut, err2 := strconv.ParseUint(f[11], 10, 64) // field 14, utime
	st, err3 := strconv.ParseUint(f[12], 10, 64) // field 15, stime
	at, err4 := strconv.ParseUint(f[19], 10, 64) // field 22, starttime
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return 0, 0, 0, false
	}
	return g, ut + st, at, true
}

// stopIdle stops the idle watch, if any, and returns what it saw; k.mu is
// held.
func (k *Kernel) stopIdle() idleVerdict {
	if k.idle == nil {
		return idleVerdict{}
	}
	v := k.idle.stop()
	k.idle = nil
	return v
}
