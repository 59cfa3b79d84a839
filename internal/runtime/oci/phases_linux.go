package oci

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Where a restore's time goes, logged with each restore ("restore
// phases", at info level: restores are few and each takes hundreds of
// ms) for `sheepfold bench` to break down (internal/bench). From CRIU's
// own log (restore.log in its work dir: each line starts with the time
// since CRIU started, "(ss.micros)"):
//
//	criu_start   to "Reading image tree": CRIU's start, its probe of the kernel
//	             (none when it reads its cache: kdat_linux.go)
//	criu_tasks   to the first task's memory read ("Preadv"): namespaces,
//	             mounts (a tmpfs's contents through tar and gzip), tasks
//	             forked, files, sockets
//	criu_memory  to the last task's memory read: the sandbox's pages copied
//	             from the images into the new processes
//	criu_finish  to "Restore finished": cgroups, the network unlock
//	             (netlock_linux.go), credentials, seccomp, the tasks resumed
//
// and of the engine's own: runc (the whole `runc restore`, CRIU in it),
// runc_before (from runc's start to CRIU's log's: runc's own work before
// it hands over, its probe of CRIU's version, CRIU's start) and after
// (what the restore does once CRIU is done: lo up, the namespace's limits
// through nsenter, the tenant's pids cgroup).

// criuPhases are the phases of CRIU's restore read from its log; ok is
// false when the log lacks a milestone.
type criuPhases struct {
	start, tasks, memory, finish time.Duration
	ok                           bool
}

// readCriuPhases reads CRIU's restore log at path.
func readCriuPhases(path string) criuPhases {
	f, err := os.Open(path)
	if err != nil {
		return criuPhases{}
	}
	defer f.Close()
	var tree, firstRead, lastRead, done time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Bytes()
		at, ok := criuStamp(l)
		if !ok {
			continue
		}
		switch {
		case tree == 0 && bytes.Contains(l, []byte("Reading image tree")):
			tree = at
		case bytes.Contains(l, []byte(": Preadv ")):
			if firstRead == 0 {
				firstRead = at
			}
		case bytes.Contains(l, []byte(": `- returned ")):
			lastRead = at
		case bytes.Contains(l, []byte("Restore finished successfully")):
			done = at
		}
	}
	if tree == 0 || firstRead < tree || lastRead < firstRead || done < lastRead {
		return criuPhases{}
	}
	return criuPhases{start: tree, tasks: firstRead - tree, memory: lastRead - firstRead, finish: done - lastRead, ok: true}
}

// criuStamp reads the "(ss.micros)" a CRIU log line starts with.
func criuStamp(l []byte) (time.Duration, bool) {
	if len(l) < 3 || l[0] != '(' {
		return 0, false
	}
	end := bytes.IndexByte(l, ')')
	if end < 0 {
		return 0, false
	}
	s, err := strconv.ParseFloat(string(l[1:end]), 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}

// logRestorePhases logs where restore what ("resume", "clone") of
// sandbox id spent its time: runc is the whole of `runc restore`, begun
// at began, after what followed it, and CRIU's own phases are read from
// its log in work.
func (o *OCI) logRestorePhases(id, what, work string, began time.Time, runc, after time.Duration) {
	const r = 10 * time.Microsecond
	args := []any{"id", id, "what", what, "runc", runc.Round(r), "after", after.Round(r)}
	var stx unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, work+"/restore.log", 0, unix.STATX_BTIME, &stx) == nil && stx.Mask&unix.STATX_BTIME != 0 {
		// A log older than this restore (of one that failed before) is
		// not this restore's.
		if d := time.Unix(stx.Btime.Sec, int64(stx.Btime.Nsec)).Sub(began); d >= 0 && d <= runc {
			args = append(args, "runc_before", d.Round(r))
		}
	}
	if p := readCriuPhases(work + "/restore.log"); p.ok {
		args = append(args, "criu_start", p.start.Round(r), "criu_tasks", p.tasks.Round(r), "criu_memory", p.memory.Round(r), "criu_finish", p.finish.Round(r))
	}
	o.cfg.Logger.Info("restore phases", args...)
}
