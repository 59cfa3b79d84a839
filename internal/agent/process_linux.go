package agent

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/pidfd"
)

// Tunables of process output; variables so that tests can shorten them.
var (
	// outputChunk is the largest stdout or stderr event.
	outputChunk = 32 << 10
	// maxLag is how far (in output bytes) a subscriber may fall behind
	// before it stops receiving output.
	maxLag = 8 << 20
	// drainGrace is how long, after a process exits, its output pipes may
	// stay open (held by its own background children) before Done is sent
	// anyway. The rest of their output is read and discarded.
	drainGrace = 200 * time.Millisecond
	// drainMax bounds how long Done waits, past drainGrace, for output
	// still unread in the pipes: what the process wrote before it exited,
	// which a pump not scheduled in time (a loaded host, a throttled
	// sandbox) has not read yet.
	drainMax = 5 * time.Second
	// finishedRetention is how long a finished process's Done stays
	// available to process.connect (for a client racing the exit).
	finishedRetention = 10 * time.Second
)

// defaultPath is the PATH used when the environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processTable maps pids to the processes the agent started. A finished
// process stays until its subscribers have their Done, then
// finishedRetention longer for process.connect; process.list shows only
// running ones.
type processTable struct {
	// mu guards byPID and closed. Lock order: processTable.mu before
	// process.mu before subscriber.mu.
	mu     sync.Mutex
	byPID  map[int]*process
	closed bool
}

func newProcessTable() *processTable {
	return &processTable{byPID: make(map[int]*process)}
}

// add registers p; it fails once the agent is stopping.
func (t *processTable) add(p *process) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosing
	}
	t.pruneLocked()
	t.byPID[p.pid] = p // a finished process with a reused pid is replaced
	return nil
}

func (t *processTable) get(pid int) *process {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	return t.byPID[pid]
}

func (t *processTable) pruneLocked() {
	now := time.Now()
	for pid, p := range t.byPID {
		p.mu.Lock()
		stale := p.done != nil && len(p.subs) == 0 && now.Sub(p.finishedAt) > finishedRetention
		p.mu.Unlock()
		if stale {
			delete(t.byPID, pid)
		}
	}
}

func (t *processTable) list() []agentproto.ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	out := []agentproto.ProcessInfo{}
	for _, p := range t.byPID {
		p.mu.Lock()
		if !p.exited {
			out = append(out, p.info)
		}
		p.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b agentproto.ProcessInfo) int { return a.PID - b.PID })
	return out
}

// closeAll kills every process group the agent started and still knows
// of (finished ones too: their background children may live on in the
// group without holding the output pipes) and closes their pipes; the
// server's WaitGroup then waits for their goroutines.
func (t *processTable) closeAll(log *slog.Logger) {
	t.mu.Lock()
	t.closed = true
	all := t.byPID
	t.byPID = make(map[int]*process)
	t.mu.Unlock()
	for _, p := range all {
		if err := unix.Kill(-p.pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
			log.Warn("kill process group", "pid", p.pid, "err", err)
		}
		p.closeStdin()
		for _, f := range p.outputs {
			f.Close()
		}
	}
}

// process is one process started by process.start.
type process struct {
	pid       int
	info      agentproto.ProcessInfo
	proc      *os.Process
	started   time.Time
	timer     *time.Timer // the TimeoutMS timer, or nil
	outputs   []*os.File  // read ends of stdout and stderr
	pumpsLeft atomic.Int32
	pumpsDone chan struct{} // closed when both output pipes reached EOF

	stdin       *os.File // write end of stdin, nil unless ProcessSpec.Stdin
	pty         *os.File // the terminal's master side, nil unless ProcessSpec.PTY
	stdinMu     sync.Mutex
	stdinClosed atomic.Bool

	// mu guards the fields below.
	mu         sync.Mutex
	subs       map[*subscriber]struct{}
	exited     bool   // the leader has exited (perhaps not reaped yet): never signal it again
	status     string // StatusTimeout or StatusOutputLimit once the agent killed it for that
	done       *agentproto.Event
	finishedAt time.Time
}

// killLocked kills the process group for a reason, unless the process has
// exited. p.mu is held, so the pid cannot have been reaped and reused.
func (p *process) killLocked(status string) {
	if p.exited {
		return
	}
	if p.status == "" {
		p.status = status
	}
	p.signalLocked(unix.SIGKILL)
}

// signalLocked signals the process group, or the process alone when it has
// left its group.
func (p *process) signalLocked(sig unix.Signal) error {
	err := unix.Kill(-p.pid, sig)
	if err == unix.ESRCH {
		err = unix.Kill(p.pid, sig)
	}
	return err
}

func (p *process) closeStdin() {
	if p.stdin != nil {
		p.stdinClosed.Store(true)
		p.stdin.Close()
	}
}

// broadcast hands an output event to every subscriber.
func (p *process) broadcast(typ string, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return // output after Done (from leftover children) is discarded
	}
	for sb := range p.subs {
		if sb.offer(agentproto.Event{Type: typ, Data: data}) {
			p.killLocked(agentproto.StatusOutputLimit)
		}
	}
}

// finish records the final event and hands it to every subscriber.
func (p *process) finish(done agentproto.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if done.Code == "" {
		done.Status = p.status
	}
	p.done = &done
	p.finishedAt = time.Now()
	for sb := range p.subs {
		sb.finish(done)
	}
}

func (p *process) unsubscribe(sb *subscriber) {
	p.mu.Lock()
	delete(p.subs, sb)
	p.mu.Unlock()
}

// subscriber is one connection streaming a process's events. Output is
// queued without blocking the process; a subscriber more than maxLag bytes
// behind stops receiving output and gets a truncated Done.
type subscriber struct {
	limit int64         // MaxOutputBytes of this connection; 0: none
	wake  chan struct{} // signalled when events are queued

	// mu guards the fields below.
	mu      sync.Mutex
	queue   []agentproto.Event
	pending int   // output bytes queued
	sent    int64 // output bytes accepted, for limit
	capped  bool  // limit reached
	lagging bool  // fell maxLag behind
	closed  bool  // Done queued
}

func newSubscriber(limit int64) *subscriber {
	return &subscriber{limit: limit, wake: make(chan struct{}, 1)}
}

func (sb *subscriber) pushLocked(ev agentproto.Event) {
	sb.queue = append(sb.queue, ev)
	select {
	case sb.wake <- struct{}{}:
	default:
	}
}

func (sb *subscriber) push(ev agentproto.Event) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.pushLocked(ev)
}

// offer queues an output event. It reports whether this event took the
// subscriber past its output cap (the process must then be killed).
func (sb *subscriber) offer(ev agentproto.Event) (overCap bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.closed || sb.capped || sb.lagging {
		return false
	}
	if sb.limit > 0 && sb.sent+int64(len(ev.Data)) > sb.limit {
		ev.Data = ev.Data[:sb.limit-sb.sent]
		sb.capped = true
		overCap = true
	}
	if sb.pending+len(ev.Data) > maxLag {
		sb.lagging = true
		return overCap
	}
	if len(ev.Data) > 0 {
		sb.sent += int64(len(ev.Data))
		sb.pending += len(ev.Data)
		sb.pushLocked(ev)
	}
	return overCap
}

// finish queues the subscriber's own copy of the final event.
func (sb *subscriber) finish(done agentproto.Event) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.closed {
		return
	}
	if sb.capped {
		done.Truncated = true
		if done.Status == "" {
			done.Status = agentproto.StatusOutputLimit
		}
	}
	if sb.lagging {
		done.Truncated = true
		done.Message = "output dropped: the client fell more than 8 MiB behind"
	}
	sb.closed = true
	sb.pushLocked(done)
}

// take removes and returns the queued events.
func (sb *subscriber) take() []agentproto.Event {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	evs := sb.queue
	sb.queue = nil
	sb.pending = 0
	return evs
}

// stream writes a subscriber's events to its connection and returns the
// final Done, or a zero Event when the client hung up.
func (s *server) stream(c *conn, p *process, sb *subscriber) agentproto.Event {
	gone := c.hangup()
	for {
		for _, ev := range sb.take() {
			if ev.Type == agentproto.EventDone {
				p.unsubscribe(sb)
				return ev
			}
			if err := c.send(ev); err != nil {
				p.unsubscribe(sb)
				return agentproto.Event{}
			}
		}
		select {
		case <-sb.wake:
		case <-gone:
			p.unsubscribe(sb)
			return agentproto.Event{}
		}
	}
}

func (s *server) processStart(c *conn, req *agentproto.Request) agentproto.Event {
	spec := req.Process
	if spec == nil || spec.Cmd == "" {
		return fail(agentproto.CodeBadRequest, "process.start needs a command")
	}
	if spec.TimeoutMS < 0 || spec.MaxOutputBytes < 0 {
		return fail(agentproto.CodeBadRequest, "negative timeout or output cap")
	}
	if hasNUL(spec.Cmd) || hasNUL(spec.Cwd) || slices.ContainsFunc(spec.Args, hasNUL) {
		return fail(agentproto.CodeBadRequest, "NUL byte in command, arguments or cwd")
	}
	id, bad := s.user(spec.User, s.passwd)
	if bad != nil {
		return *bad
	}
	base := s.cfg.Env
	if base == nil {
		base = os.Environ()
	}
	if s.switchUsers {
		base, _ = mergeEnv(base, id.env())
	}
	env, err := mergeEnv(base, spec.Env)
	if err != nil {
		return fail(agentproto.CodeBadRequest, "%v", err)
	}
	cwd := spec.Cwd
	if cwd == "" && s.cfg.WorkDir != "" {
		cwd = s.cfg.WorkDir // the template's WORKDIR
	} else if cwd == "" {
		cwd = id.home
	} else if !path.IsAbs(cwd) {
		cwd = path.Join(id.home, cwd)
	}
	cwd = hostPath(s.cfg.Root, path.Clean(cwd))
	if st, err := os.Stat(cwd); spec.Cwd == "" && (err != nil || !st.IsDir()) {
		cwd = hostPath(s.cfg.Root, "/") // a user without a home, as login(1) does
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return fail(agentproto.CodeBadRequest, "working directory %s does not exist or is not a directory", cwd)
	}
	exe, err := lookPath(spec.Cmd, env, cwd)
	if err != nil {
		return fail(agentproto.CodeNotFound, "%s: command not found", spec.Cmd)
	}

	p, err := s.spawn(exe, spec, env, cwd, s.credential(id))
	if err != nil {
		return failErr(spec.Cmd, err)
	}
	sb := newSubscriber(spec.MaxOutputBytes)
	sb.push(agentproto.Event{Type: agentproto.EventStart, PID: p.pid})
	p.subs[sb] = struct{}{}
	if spec.TimeoutMS > 0 {
		p.timer = time.AfterFunc(time.Duration(spec.TimeoutMS)*time.Millisecond, func() {
			p.mu.Lock()
			p.killLocked(agentproto.StatusTimeout)
			p.mu.Unlock()
		})
	}
	if err := s.procs.add(p); err != nil {
		unix.Kill(-p.pid, unix.SIGKILL)
	}
	if p.pty != nil {
		s.wg.Go(func() { s.pump(p, p.outputs[0], agentproto.EventPTY) })
	} else {
		s.wg.Go(func() { s.pump(p, p.outputs[0], agentproto.EventStdout) })
		s.wg.Go(func() { s.pump(p, p.outputs[1], agentproto.EventStderr) })
	}
	s.wg.Go(func() { s.reap(p) })
	return s.stream(c, p, sb)
}

// spawn starts the process in its own process group with piped output,
// as cred (nil: as the agent).
func (s *server) spawn(exe string, spec *agentproto.ProcessSpec, env []string, cwd string, cred *syscall.Credential) (*process, error) {
	var closeAfter, closeOnError []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	fail := func(err error) (*process, error) {
		for _, f := range closeOnError {
			f.Close()
		}
		return nil, err
	}

	if spec.PTY != nil {
		return s.spawnPTY(exe, spec, env, cwd, cred)
	}
	var stdin, stdinW *os.File
	if spec.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		stdin, stdinW = r, w
		closeOnError = append(closeOnError, w)
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		stdin = f
	}
	closeAfter = append(closeAfter, stdin)
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	closeAfter = append(closeAfter, outW)
	closeOnError = append(closeOnError, outR)
	errR, errW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	closeAfter = append(closeAfter, errW)
	closeOnError = append(closeOnError, errR)

	started := time.Now()
	var proc *os.Process
	exe, argv := s.nprocCommand(exe, append([]string{spec.Cmd}, spec.Args...))
	err = StartBounded(cred, func() (err error) {
		proc, err = os.StartProcess(exe, argv, &os.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []*os.File{stdin, outW, errW},
			Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
		})
		return err
	})
	if err != nil {
		return fail(err)
	}
	p := &process{
		pid:     proc.Pid,
		proc:    proc,
		started: started,
		outputs: []*os.File{outR, errR},
		stdin:   stdinW,
		subs:    make(map[*subscriber]struct{}),
		info: agentproto.ProcessInfo{
			PID:     proc.Pid,
			Cmd:     spec.Cmd,
			Args:    spec.Args,
			Env:     spec.Env,
			Cwd:     cwd,
			Tag:     spec.Tag,
			Started: started.UTC(),
		},
		pumpsDone: make(chan struct{}),
	}
	p.pumpsLeft.Store(2)
	return p, nil
}

// spawnPTY starts the process on a new pseudo-terminal (from the
// sandbox's own devpts instance) as the leader of a new session whose
// controlling terminal it is. The agent keeps only the master side: once
// every process holding the terminal has gone, reading it ends (EIO).
func (s *server) spawnPTY(exe string, spec *agentproto.ProcessSpec, env []string, cwd string, cred *syscall.Credential) (*process, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open a terminal: %w", err)
	}
	slave, err := openPeer(master, spec.PTY, cred)
	if err != nil {
		master.Close()
		return nil, err
	}
	defer slave.Close()
	started := time.Now()
	var proc *os.Process
	exe, argv := s.nprocCommand(exe, append([]string{spec.Cmd}, spec.Args...))
	err = StartBounded(cred, func() (err error) {
		proc, err = os.StartProcess(exe, argv, &os.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []*os.File{slave, slave, slave},
			Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred},
		})
		return err
	})
	if err != nil {
		master.Close()
		return nil, err
	}
	p := &process{
		pid:     proc.Pid,
		proc:    proc,
		started: started,
		outputs: []*os.File{master},
		pty:     master,
		subs:    make(map[*subscriber]struct{}),
		info: agentproto.ProcessInfo{PID: proc.Pid, Cmd: spec.Cmd, Args: spec.Args, Env: spec.Env, Cwd: cwd,
			Tag: spec.Tag, Started: started.UTC()},
		pumpsDone: make(chan struct{}),
	}
	p.pumpsLeft.Store(1)
	return p, nil
}

// openPeer unlocks a terminal's master side, sets its size and opens its
// slave side, which it gives to cred's user (nil: the agent's).
func openPeer(master *os.File, size *agentproto.TermSize, cred *syscall.Credential) (*os.File, error) {
	var n uint32
	err := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock the terminal: %w", err)
		}
		var err error
		if n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("terminal number: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := setSize(master, size); err != nil {
		return nil, err
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the terminal: %w", err)
	}
	if cred != nil {
		if err := control(slave, func(fd int) error { return unix.Fchown(fd, int(cred.Uid), int(cred.Gid)) }); err != nil {
			slave.Close()
			return nil, fmt.Errorf("give the terminal to its user: %w", err)
		}
	}
	return slave, nil
}

// setSize sets a terminal's size (TIOCSWINSZ on the master side; the
// session gets SIGWINCH).
func setSize(master *os.File, size *agentproto.TermSize) error {
	if size == nil || size.Cols == 0 || size.Rows == 0 {
		return errors.New("a terminal needs a size of at least 1x1")
	}
	ws := &unix.Winsize{Col: size.Cols, Row: size.Rows}
	if err := control(master, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) }); err != nil {
		return fmt.Errorf("set the terminal's size: %w", err)
	}
	return nil
}

// control calls fn with f's descriptor without taking it out of the
// runtime's poller (as File.Fd would).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// unread reports whether output waits unread in the process's pipes (or
// terminal).
func (p *process) unread() bool {
	for _, f := range p.outputs {
		n := 0
		control(f, func(fd int) error {
			n, _ = unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD; an error (closed: read to its end) leaves 0
			return nil
		})
		if n > 0 {
			return true
		}
	}
	return false
}

// processResize changes the size of a process's terminal.
func (s *server) processResize(req *agentproto.Request) agentproto.Event {
	p := s.procs.get(req.PID)
	if p == nil {
		return fail(agentproto.CodeNotFound, "no process %d", req.PID)
	}
	if p.pty == nil {
		return fail(agentproto.CodeBadRequest, "process %d has no terminal", req.PID)
	}
	if err := setSize(p.pty, req.Size); err != nil {
		return fail(agentproto.CodeBadRequest, "%v", err)
	}
	return ok()
}

// pump reads one output pipe until EOF and broadcasts what it reads.
func (s *server) pump(p *process, f *os.File, typ string) {
	defer func() {
		if p.pumpsLeft.Add(-1) == 0 {
			close(p.pumpsDone)
		}
	}()
	defer f.Close()
	buf := make([]byte, outputChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.broadcast(typ, bytes.Clone(buf[:n]))
		}
		if err != nil {
			return
		}
	}
}

// reap waits for the process, lets its output drain and sends its Done.
func (s *server) reap(p *process) {
	// Wait without reaping first, and mark the process exited under its
	// lock: from then on nothing signals its pid, which a reaped process
	// would free for reuse. Parked on the poller (pidfd), not holding an
	// OS thread for each process: the agent's threads must stay within
	// its reserve of tasks whatever the tenant runs (pidfd's doc).
	if err := pidfd.AwaitExit(p.pid); err != nil {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
	}
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
	}
	ps, err := p.proc.Wait()
	end := time.Now()
	p.closeStdin()

	grace := time.NewTimer(drainGrace)
drain:
	for {
		select {
		case <-p.pumpsDone:
			break drain
		case <-grace.C:
			if time.Since(end) < drainMax && p.unread() {
				grace.Reset(drainGrace)
				continue
			}
			break drain
		}
	}
	grace.Stop()

	if err != nil {
		s.log.Error("wait for process", "pid", p.pid, "err", err)
		p.finish(fail(agentproto.CodeInternal, "wait for process %d: %v", p.pid, err))
		return
	}
	done := ok()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Exited():
			code := ws.ExitStatus()
			done.ExitCode = &code
		case ws.Signaled():
			done.Signal = int(ws.Signal())
		}
	}
	stats := &agentproto.Stats{DurationMS: ms(end.Sub(p.started))}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		stats.CPUTimeMS = ms(cpu)
		stats.PeakMemoryBytes = ru.Maxrss * 1024
	}
	done.Stats = stats
	p.finish(done)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *server) processConnect(c *conn, req *agentproto.Request) agentproto.Event {
	p := s.procs.get(req.PID)
	if p == nil {
		return fail(agentproto.CodeNotFound, "no process %d", req.PID)
	}
	start := agentproto.Event{Type: agentproto.EventStart, PID: p.pid}
	p.mu.Lock()
	if p.done != nil {
		done := *p.done
		p.mu.Unlock()
		if err := c.send(start); err != nil {
			return agentproto.Event{}
		}
		return done
	}
	sb := newSubscriber(0)
	sb.push(start)
	p.subs[sb] = struct{}{}
	p.mu.Unlock()
	return s.stream(c, p, sb)
}

func (s *server) processInput(req *agentproto.Request) agentproto.Event {
	p := s.procs.get(req.PID)
	if p == nil {
		return fail(agentproto.CodeNotFound, "no process %d", req.PID)
	}
	if p.pty != nil {
		// Typed on its terminal. A terminal has no end of input to close.
		if req.EOF {
			return fail(agentproto.CodeBadRequest, "process %d reads a terminal: there is no stdin to close", req.PID)
		}
		if _, err := p.pty.Write(req.Data); err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EIO) {
				return fail(agentproto.CodeBadRequest, "the terminal of process %d is closed", req.PID)
			}
			return failErr("terminal", err)
		}
		return ok()
	}
	if p.stdin == nil {
		return fail(agentproto.CodeBadRequest, "process %d was started without stdin", req.PID)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinClosed.Load() {
		return fail(agentproto.CodeBadRequest, "stdin of process %d is closed", req.PID)
	}
	if len(req.Data) > 0 {
		if _, err := p.stdin.Write(req.Data); err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EPIPE) {
				return fail(agentproto.CodeBadRequest, "stdin of process %d is closed", req.PID)
			}
			return failErr("stdin", err)
		}
	}
	if req.EOF {
		p.closeStdin()
	}
	return ok()
}

func (s *server) processSignal(req *agentproto.Request) agentproto.Event {
	if req.Signal <= 0 || req.Signal > 64 {
		return fail(agentproto.CodeBadRequest, "bad signal %d", req.Signal)
	}
	p := s.procs.get(req.PID)
	if p == nil {
		return fail(agentproto.CodeNotFound, "no process %d", req.PID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return fail(agentproto.CodeNotFound, "process %d has exited", req.PID)
	}
	if err := p.signalLocked(unix.Signal(req.Signal)); err != nil {
		return failErr("signal", err)
	}
	return ok()
}

func (s *server) processList() agentproto.Event {
	ev := ok()
	ev.Processes = s.procs.list()
	return ev
}

func hasNUL(s string) bool { return strings.IndexByte(s, 0) >= 0 }

// mergeEnv returns base with add's variables set (replacing any of the same
// name), in a stable order.
func mergeEnv(base []string, add map[string]string) ([]string, error) {
	out := make([]string, 0, len(base)+len(add))
	idx := make(map[string]int, len(base)+len(add))
	set := func(k, kv string) {
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		set(k, kv)
	}
	keys := make([]string, 0, len(add))
	for k := range add {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := add[k]
		if k == "" || strings.ContainsAny(k, "=\x00") || hasNUL(v) {
			return nil, errors.New("bad environment variable name or value")
		}
		set(k, k+"="+v)
	}
	return out, nil
}

// lookPath finds cmd the way a shell would with env's PATH: a name with a
// slash is taken as is (relative to cwd); otherwise the first executable
// regular file of that name in an absolute PATH directory. Relative PATH
// entries are skipped, as os/exec refuses them.
func lookPath(cmd string, env []string, cwd string) (string, error) {
	if strings.Contains(cmd, "/") {
		if !path.IsAbs(cmd) {
			cmd = path.Join(cwd, cmd)
		}
		return cmd, nil
	}
	pathEnv := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	for dir := range strings.SplitSeq(pathEnv, ":") {
		if !path.IsAbs(dir) {
			continue
		}
		p := path.Join(dir, cmd)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}
