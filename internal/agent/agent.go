package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/backoff"
)

// Config configures Serve. The zero value of every field but NewKernel is
// usable.
type Config struct {
	// Root is the host directory every file operation is confined to. In a
	// sandbox it is "/"; tests use a temporary directory. Processes and
	// kernels are not confined by it: they see the real filesystem.
	Root string
	// Home is the sandbox path relative request paths start from and the
	// default working directory of processes and contexts
	// (default /home/user).
	Home string
	// User is the user a request that names none acts as (a template's
	// last USER): "" is "user". An explicit user in a request wins.
	User string
	// WorkDir is the sandbox path processes and contexts that name no
	// working directory start in (a template's last WORKDIR); "" is the
	// user's home. Relative request paths still start from the home.
	WorkDir string
	// Version is reported by ping.
	Version string
	// NewKernel starts an interpreter for a code context. Its ctx lasts as
	// long as the agent, not just the request that asked for the context.
	// The spec's Language is canonical and its Cwd is set. Nil disables
	// code contexts (CodeUnsupported).
	NewKernel func(ctx context.Context, spec agentproto.ContextSpec) (Kernel, error)
	// Canonical maps a language name or alias to its canonical name and
	// fails for unknown languages; nil means names are canonical already.
	// Either way, a language missing from a non-empty Languages is
	// refused with CodeUnsupported.
	Canonical func(lang string) (string, error)
	// Languages lists the canonical languages NewKernel supports, reported
	// by ping. The first is the default of an execution that names neither
	// a context nor a language ("python" when empty).
	Languages []string
	// SwitchUsers requires that every process, kernel and file operation
	// run as its requested user: Serve refuses to start (and so nothing
	// runs at all) unless the agent can switch users, that is, it is uid
	// 0 of a user namespace with Root "/", as a sandbox's agent is. Unset
	// (tests, the fake runtime), the agent switches when it can and acts
	// as itself otherwise.
	SwitchUsers bool
	// Env is the base environment of started processes; nil means the
	// agent's own (os.Environ()).
	Env []string
	// SetLifetime ends the whole sandbox d from now, replacing the
	// deadline set before (a ping with LifetimeMS). Nil refuses such pings
	// (CodeUnsupported): a sandbox must not outlive a deadline it was given.
	SetLifetime func(d time.Duration) error
	// Lifetime, when positive, is the lifetime the sandbox starts with:
	// Serve sets it (SetLifetime) before it accepts a connection, and a
	// ping with LifetimeMS replaces it. An engine that dies between
	// starting the sandbox and its first ping (a warm pool member's
	// replica killed while the Pod started) then leaves nothing that runs
	// for ever: without it, an agent no ping reached had no deadline.
	Lifetime time.Duration
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
	// CgroupRoot is where the usage op finds the sandbox's cgroup
	// hierarchies (usage.go) [/sys/fs/cgroup]; tests point it at a fake
	// tree.
	CgroupRoot string
	// UsageHistory makes the agent sample its usage every
	// HistoryInterval for usage.history (history.go).
	UsageHistory bool
	// Egress, when set, is the sandbox's egress listener on its loopback
	// (egress.go): each connection made to it goes to the host through
	// an egress.accept request. Serve closes it.
	Egress net.Listener
	// Disk, when set, is the sandbox path whose file system is the
	// sandbox's disk (a Pod's scratch volume, scratch_linux.go): the usage
	// op reports its use and size.
	Disk string
	// Nproc, when positive, is the RLIMIT_NPROC (soft and hard) of every
	// process, interpreter and sudo command the agent starts (nproc.go):
	// a Pod's bound on each of its uids' tasks. Helper is the agent's
	// binary, which sets it (NprocExec) [os.Executable()].
	Nproc  int64
	Helper string
	// SubprocessDenied reports whether any code of this sandbox has been
	// asked to run under allow_subprocess: false (kernel.SubprocessDenied);
	// sudo consults it where the kernel does not count seccomp filters
	// (gVisor: confined_linux.go). nil: assume it has.
	SubprocessDenied func() bool
}

// Kernel is a long-lived interpreter behind a code context.
// *kernel.Kernel satisfies it.
type Kernel interface {
	// Language returns the kernel's canonical language.
	Language() string
	// Execute runs spec.Code, passing output and results to emit as they
	// come (emit fails once the client is gone), and returns the Done event.
	// ctx ends when the client goes away or the agent stops.
	Execute(ctx context.Context, spec agentproto.ExecuteSpec, emit func(agentproto.Event) error) agentproto.Event
	// Restart replaces the interpreter, losing its state.
	Restart(ctx context.Context) error
	// Close stops the interpreter for good.
	Close() error
}

// Timeouts of a connection's reads; variables so that tests can shorten
// them.
var (
	// requestTimeout bounds the wait for the request frame.
	requestTimeout = 60 * time.Second
	// bodyIdleTimeout bounds the silence between reads of a file body.
	bodyIdleTimeout = 60 * time.Second
	// sendTimeout bounds each write to the host, so that a host that
	// stops reading (it passes on a slow client's backpressure) cannot
	// pin a handler forever.
	sendTimeout = 2 * time.Minute
)

func (cfg Config) withDefaults() (Config, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Home == "" {
		cfg.Home = "/home/user"
	}
	if !path.IsAbs(cfg.Home) {
		return cfg, fmt.Errorf("agent: home %q is not absolute", cfg.Home)
	}
	cfg.Home = path.Clean(cfg.Home)
	if cfg.WorkDir != "" {
		if !path.IsAbs(cfg.WorkDir) {
			return cfg, fmt.Errorf("agent: working directory %q is not absolute", cfg.WorkDir)
		}
		cfg.WorkDir = path.Clean(cfg.WorkDir)
	}
	if cfg.User != "" && !validUserName(cfg.User) {
		return cfg, fmt.Errorf("agent: invalid user name %q", cfg.User)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// Serve accepts connections on ln and serves one request on each, in its own
// goroutine, until ctx ends. It then closes ln and every connection, kills
// every process it started (their whole process groups), closes every
// kernel, waits for all its goroutines and returns nil. It returns an error
// (having closed ln) if cfg is invalid, Root cannot be opened, or ln fails
// for another reason (after the same clean up).
func Serve(ctx context.Context, ln net.Listener, cfg Config) error {
	return serve(ctx, ln, cfg, nil)
}

// serve is Serve, handing its server to started (tests inspect it).
func serve(ctx context.Context, ln net.Listener, cfg Config, started func(*server)) error {
	if cfg.Lifetime > 0 && cfg.SetLifetime == nil {
		ln.Close()
		return errors.New("agent: a starting lifetime needs SetLifetime: a sandbox must not outlive a deadline it was given")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		ln.Close()
		return err
	}
	s, err := newServer(ctx, cfg)
	if err != nil {
		ln.Close()
		return err
	}
	if cfg.Lifetime > 0 {
		if err := s.setLifetime(cfg.Lifetime); err != nil {
			s.shutdown()
			ln.Close()
			return fmt.Errorf("agent: the sandbox's starting lifetime: %w", err)
		}
	}
	if started != nil {
		started(s)
	}
	stop := context.AfterFunc(s.ctx, func() { ln.Close() })
	defer stop()
	if s.switchUsers {
		s.wg.Go(s.serveSudo) // in a sandbox: sudo_linux.go
	}
	if cfg.UsageHistory {
		s.wg.Go(s.sampleUsage)
	}
	if cfg.Egress != nil {
		defer context.AfterFunc(s.ctx, func() { cfg.Egress.Close() })()
		s.wg.Go(s.egressAccepts)
	}

	var serveErr error
	retry := backoff.Backoff{Base: 5 * time.Millisecond, Max: time.Second}
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				serveErr = fmt.Errorf("agent: accept: %w", err)
				break
			}
			// Out of descriptors or an aborted connection: back off and
			// retry, as net/http does.
			delay := retry.Next()
			s.log.Warn("accept failed; retrying", "err", err, "delay", delay)
			select {
			case <-time.After(delay):
			case <-s.ctx.Done():
			}
			continue
		}
		retry.Reset()
		if !s.track(nc) {
			nc.Close()
			break
		}
		s.wg.Go(func() { s.serveConn(nc) })
	}
	s.shutdown()
	return serveErr
}

// server is the state of one Serve call.
type server struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // ends when Serve's ctx ends or Serve stops
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the server starts

	files *fileSystem
	procs *processTable
	ctxs  *contextTable
	// switchUsers: processes and file operations run as the requested
	// user (canSwitchUsers, users_linux.go); otherwise as the agent.
	switchUsers bool
	// helper is the agent's binary, for nproc-exec (nproc.go).
	helper string

	// mu guards conns and closed.
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	// panics counts recovered panics (tests and fuzzing check it).
	panics atomic.Int64

	// Activity, for pings: requests in flight other than pings, when the
	// last one ended (unix nanoseconds), and the sandbox's deadline
	// (unix nanoseconds; 0: none set).
	busy     atomic.Int64
	lastDone atomic.Int64
	deadline atomic.Int64

	// egress passes connections from egressAccepts to egress.accept;
	// egressWaiting counts the requests waiting for one.
	egress        chan net.Conn
	egressWaiting atomic.Int64
	// history is the usage samples of Config.UsageHistory.
	history history
	// budgets are the sandbox's budgets its engines take from.
	budgets budgets
}

// errCannotSwitchUsers refuses to serve when Config.SwitchUsers is set
// and the agent cannot act as other users: failing closed.
var errCannotSwitchUsers = errors.New("agent: required to run everything as its requested user, but cannot switch users (not uid 0 of a user namespace with root /)")

func newServer(ctx context.Context, cfg Config) (*server, error) {
	switchUsers := canSwitchUsers(cfg.Root)
	if cfg.SwitchUsers && !switchUsers {
		return nil, errCannotSwitchUsers
	}
	fs, err := openFileSystem(cfg.Root, cfg.Home)
	if err != nil {
		return nil, err
	}
	helper := cfg.Helper
	if helper == "" && cfg.Nproc > 0 {
		if helper, err = os.Executable(); err != nil {
			fs.Close()
			return nil, fmt.Errorf("agent: own binary for nproc-exec: %w", err)
		}
	}
	s := &server{
		cfg:    cfg,
		helper: helper,
		log:    cfg.Logger,
		files:  fs,
		conns:  make(map[net.Conn]struct{}),
		egress: make(chan net.Conn),

		switchUsers: switchUsers,
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.lastDone.Store(time.Now().UnixNano())
	s.procs = newProcessTable()
	s.ctxs = newContextTable()
	return s, nil
}

// track registers a new connection; it fails once the server is closing.
func (s *server) track(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[nc] = struct{}{}
	return true
}

func (s *server) untrack(nc net.Conn) {
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
}

// shutdown stops everything in reverse order of how it starts: connections,
// processes, kernels; then it waits for every goroutine.
func (s *server) shutdown() {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	for nc := range s.conns {
		nc.Close()
	}
	s.mu.Unlock()
	s.procs.closeAll(s.log)
	s.ctxs.closeAll(s.log)
	s.wg.Wait()
	s.files.Close()
}

// serveConn serves the one request of a connection.
func (s *server) serveConn(nc net.Conn) {
	c := newConn(nc)
	defer s.untrack(nc)
	defer c.close()
	defer func() {
		if r := recover(); r != nil {
			s.panics.Add(1)
			s.log.Error("panic serving a request", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			c.send(fail(agentproto.CodeInternal, "internal error"))
		}
	}()

	req, err := c.readRequest()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return // a dial without a request (a health probe)
		}
		s.log.Debug("bad request frame", "err", err)
		c.send(fail(agentproto.CodeBadRequest, "malformed request: %v", err))
		return
	}
	// The engines' own checks are not use; nor is an egress.accept
	// waiting (it counts once it carries a connection), nor a budget
	// taken (what it is taken for is).
	// The use ends before the Done goes out, so that a ping the client
	// sends once it has the Done sees the work over (it saw it busy, and
	// idle since the use before, when the end came after the reply).
	var end func()
	switch req.Op {
	case agentproto.OpPing, agentproto.OpUsage, agentproto.OpUsageHistory, agentproto.OpEgressAccept, agentproto.OpBudgetTake:
	default:
		s.busy.Add(1)
		var once sync.Once
		end = func() {
			once.Do(func() {
				s.lastDone.Store(time.Now().UnixNano())
				s.busy.Add(-1)
			})
		}
		defer end() // a panic, too
	}
	done := s.dispatch(c, req)
	if end != nil {
		end()
	}
	if done.Type == "" {
		return // the client is gone, or the handler replied itself
	}
	done.Type = agentproto.EventDone
	if err := c.send(done); err != nil {
		s.log.Debug("write done", "op", req.Op, "err", err)
	}
}

// dispatch runs the handler of req.Op, file operations as req.User
// (asFileUser). It returns the Done event to send; a zero Event means
// nothing more is to be sent.
func (s *server) dispatch(c *conn, req *agentproto.Request) agentproto.Event {
	return s.asFileUser(req, func() agentproto.Event { return s.dispatchOp(c, req) })
}

func (s *server) dispatchOp(c *conn, req *agentproto.Request) agentproto.Event {
	switch req.Op {
	case agentproto.OpPing:
		if req.LifetimeMS > 0 {
			if s.cfg.SetLifetime == nil {
				return fail(agentproto.CodeUnsupported, "this agent cannot end the sandbox at a deadline")
			}
			if err := s.setLifetime(time.Duration(req.LifetimeMS) * time.Millisecond); err != nil {
				return fail(agentproto.CodeInternal, "set the sandbox's deadline: %v", err)
			}
		}
		return s.ping()

	case agentproto.OpProcessStart:
		return s.processStart(c, req)
	case agentproto.OpProcessConnect:
		return s.processConnect(c, req)
	case agentproto.OpProcessInput:
		return s.processInput(req)
	case agentproto.OpProcessSignal:
		return s.processSignal(req)
	case agentproto.OpProcessResize:
		return s.processResize(req)
	case agentproto.OpProcessList:
		return s.processList()

	case agentproto.OpContextCreate:
		return s.contextCreate(req)
	case agentproto.OpContextList:
		return s.contextList()
	case agentproto.OpContextRestart:
		return s.contextRestart(c, req)
	case agentproto.OpContextDelete:
		return s.contextDelete(req)
	case agentproto.OpExecute:
		return s.execute(c, req)

	case agentproto.OpFileRead:
		return s.fileRead(c, req)
	case agentproto.OpFileWrite:
		return s.fileWrite(c, req)
	case agentproto.OpFileList:
		return s.fileList(req)
	case agentproto.OpFileStat:
		return s.fileStat(req)
	case agentproto.OpFileMkdir:
		return s.fileMkdir(req)
	case agentproto.OpFileRemove:
		return s.fileRemove(req)
	case agentproto.OpFileMove:
		return s.fileMove(req)
	case agentproto.OpFileWatch:
		return s.fileWatch(c, req)

	case agentproto.OpPortConnect:
		return s.portConnect(c, req)
	case agentproto.OpPortList:
		return s.portList()

	case agentproto.OpUsage:
		return s.usage()
	case agentproto.OpEgressAccept:
		return s.egressAccept(c)
	case agentproto.OpUsageHistory:
		return s.usageHistory()
	case agentproto.OpBudgetTake:
		return s.budgetTake(req)
	}
	return fail(agentproto.CodeBadRequest, "unknown op %q", req.Op)
}

// setLifetime ends the sandbox d from now (Config.SetLifetime) and keeps
// the deadline for pings.
func (s *server) setLifetime(d time.Duration) error {
	if s.cfg.SetLifetime == nil {
		return errors.New("this agent cannot end the sandbox at a deadline")
	}
	if err := s.cfg.SetLifetime(d); err != nil {
		return err
	}
	s.deadline.Store(time.Now().Add(d).UnixNano())
	return nil
}

func (s *server) ping() agentproto.Event {
	langs := s.cfg.Languages
	if s.cfg.NewKernel == nil || langs == nil {
		langs = []string{}
	}
	now := time.Now().UnixNano()
	var left int64
	if d := s.deadline.Load(); d > now {
		left = (d - now) / int64(time.Millisecond)
	}
	return agentproto.Event{Type: agentproto.EventDone, Agent: &agentproto.AgentInfo{
		Version:         s.cfg.Version,
		ProtocolVersion: agentproto.ProtocolVersion,
		Languages:       langs,
		LifetimeLeftMS:  left,
		Busy:            s.busy.Load(),
		IdleMS:          max(now-s.lastDone.Load(), 0) / int64(time.Millisecond),
	}}
}

// ok returns a successful Done.
func ok() agentproto.Event { return agentproto.Event{Type: agentproto.EventDone} }

// fail returns a failed Done.
func fail(code, format string, args ...any) agentproto.Event {
	return agentproto.Event{Type: agentproto.EventDone, Code: code, Message: fmt.Sprintf(format, args...)}
}

// conn is one client connection. Writes are serialised; reads happen only
// on the serving goroutine until the request (and file body) is read, then
// only in the watcher that notices the client leaving.
type conn struct {
	nc net.Conn
	pc *agentproto.Conn

	wmu sync.Mutex // serialises writes

	watchOnce sync.Once
	gone      chan struct{} // closed when the client hangs up
	watchDone chan struct{} // closed when the watcher has returned
}

func newConn(nc net.Conn) *conn {
	c := &conn{nc: nc, gone: make(chan struct{}), watchDone: make(chan struct{})}
	c.pc = agentproto.NewConn(idleReadWriter{nc})
	return c
}

// idleReadWriter gives every read its own deadline, so that a client that
// stalls while sending a request or a body does not hold a goroutine
// forever.
type idleReadWriter struct{ nc net.Conn }

func (rw idleReadWriter) Read(p []byte) (int, error) {
	rw.nc.SetReadDeadline(time.Now().Add(bodyIdleTimeout))
	return rw.nc.Read(p)
}

func (rw idleReadWriter) Write(p []byte) (int, error) { return rw.nc.Write(p) }

// readRequest reads and decodes the request frame. Unknown fields are
// ignored (newer hosts may send more); a frame that is not a JSON object
// is malformed.
func (c *conn) readRequest() (*agentproto.Request, error) {
	c.nc.SetReadDeadline(time.Now().Add(requestTimeout))
	kind, p, err := c.pc.ReadFrame()
	if err != nil {
		return nil, err
	}
	if kind != agentproto.FrameJSON {
		return nil, fmt.Errorf("%w: want a JSON frame, got %q", agentproto.ErrBadFrame, kind)
	}
	var req agentproto.Request
	if err := json.Unmarshal(p, &req); err != nil {
		return nil, fmt.Errorf("%w: %v", agentproto.ErrBadFrame, err)
	}
	return &req, nil
}

// send writes one event frame. An event too large for a frame is split
// (output), cut (an error's text, an entry's metadata) or replaced by an
// EventDropped (a result) or a failed Done saying so: what cannot be sent
// is reported, never silently lost, and the connection stays usable.
func (c *conn) send(ev agentproto.Event) error {
	b, err := agentproto.MarshalJSON(ev)
	if err != nil {
		return err
	}
	if len(b)+1 > agentproto.MaxFrame {
		return c.sendLarge(ev, len(b))
	}
	return c.write(agentproto.FrameJSON, b)
}

// sendData writes one data frame.
func (c *conn) sendData(p []byte) error {
	return c.write(agentproto.FrameData, p)
}

func (c *conn) write(kind byte, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(sendTimeout))
	return agentproto.WriteFrame(c.nc, kind, p)
}

// Bounds of the texts of an event cut to fit in a frame.
const (
	maxErrorName  = 1 << 10
	maxErrorValue = 64 << 10
	maxTraceback  = 512 << 10
)

// sendLarge sends what it can of an event whose encoding (size bytes)
// does not fit in a frame.
func (c *conn) sendLarge(ev agentproto.Event, size int) error {
	switch ev.Type {
	case agentproto.EventStdout, agentproto.EventStderr:
		if len(ev.Data) > 1 {
			half := len(ev.Data) / 2
			first, second := ev, ev
			first.Data, second.Data = ev.Data[:half], ev.Data[half:]
			if err := c.send(first); err != nil {
				return err
			}
			return c.send(second)
		}
	case agentproto.EventError:
		if ev.Error != nil {
			cut := *ev.Error
			cut.Name = clip(cut.Name, maxErrorName)
			cut.Value = clip(cut.Value, maxErrorValue)
			cut.Traceback = clip(cut.Traceback, maxTraceback)
			if cut != *ev.Error {
				ev.Error = &cut
				return c.send(ev)
			}
		}
	case agentproto.EventDone:
		return c.send(fail(agentproto.CodeTooLarge,
			"the reply (%d bytes) is over the agent protocol's limit of %d bytes", size, agentproto.MaxFrame))
	default:
		if ev.Entry != nil && ev.Entry.Metadata != nil {
			entry := *ev.Entry
			entry.Metadata = nil
			ev.Entry = &entry
			return c.send(ev)
		}
	}
	return c.send(agentproto.Event{Type: agentproto.EventDropped, Dropped: &agentproto.Dropped{
		Type: ev.Type, Bytes: int64(size),
		Reason: fmt.Sprintf("a %s of %d bytes is over the agent protocol's limit of %d bytes", ev.Type, size, agentproto.MaxFrame),
	}})
}

// clip cuts s to at most n bytes (on a rune boundary), saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + fmt.Sprintf("… [%d bytes cut]", len(s)-i)
}

// hangup returns a channel closed when the client hangs up (or shuts down
// its writing side: a client must not half-close a connection whose events
// it still wants). The first call starts the watcher; call it only once
// the request and its body are read.
func (c *conn) hangup() <-chan struct{} {
	c.watchOnce.Do(func() {
		c.nc.SetReadDeadline(time.Time{})
		go func() {
			defer close(c.watchDone)
			defer close(c.gone)
			var buf [512]byte
			for {
				if _, err := c.nc.Read(buf[:]); err != nil {
					return
				}
			}
		}()
	})
	return c.gone
}

// close closes the connection and waits for its watcher.
func (c *conn) close() {
	c.nc.Close()
	started := true
	c.watchOnce.Do(func() { started = false })
	if started {
		<-c.watchDone
	}
}

// hostPath is where a sandbox path is for processes: the same path in a
// sandbox (Root is "/"), under Root when tests confine the agent to a
// directory.
func hostPath(root, p string) string {
	if root == "/" || root == "" {
		return p
	}
	return filepath.Join(root, p)
}
