package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Templates resolves a template name to its root filesystem.
type Templates interface {
	RootFS(name string) (string, error)
}

// TemplateRuntimes is implemented by Templates whose templates may name
// the runtime of their sandboxes that name none (template.Info.Runtime);
// "" leaves it to the runtime's default.
type TemplateRuntimes interface {
	Runtime(name string) string
}

// TemplateDevices is implemented by Templates whose templates may ask for
// devices (template.Info.GPUs, Devices): each sandbox of the template is
// given them unless its create names its own (devices.go).
type TemplateDevices interface {
	Devices(name string) (gpus int, devices []string)
}

// TemplatesFunc adapts a function to Templates.
type TemplatesFunc func(name string) (string, error)

// RootFS implements Templates.
func (f TemplatesFunc) RootFS(name string) (string, error) { return f(name) }

// Config configures a Manager. Zero fields take the defaults in brackets.
type Config struct {
	Runtime   runtime.Runtime
	Templates Templates

	DefaultTemplate string         // ["python"]
	DefaultTimeout  time.Duration  // a sandbox's lifetime [5m]
	MaxTimeout      time.Duration  // the longest lifetime one may ask for [24h]
	DefaultLimits   runtime.Limits // [512 MiB memory, 1 CPU, 256 pids, 256 MiB disk]
	MaxLimits       runtime.Limits // the most one sandbox may ask for [8 GiB, 2 CPUs, 4096 pids, 8 GiB]
	MaxSandboxes    int            // running at once [64]
	// IdleTimeout stops a sandbox that has been idle this long: no request
	// in flight or made, and under 1% of a CPU used by its processes (so a
	// silent long job is not idle). 0 turns the idle stop off.
	IdleTimeout time.Duration
	// AutoPauseNotice is how long before an auto-pause (CreateOptions.
	// AutoPause) sandbox.pausing is sent, and how long an auto-pause
	// sandbox must have been idle to be paused (autopause.go)
	// [DefaultAutoPauseNotice].
	AutoPauseNotice time.Duration
	AgentTimeout    time.Duration // how long a new agent may take to answer [10s]
	// StartTimeout bounds how long a template's start command may take
	// to pass its ready check (TemplateStarts) [DefaultStartTimeout].
	StartTimeout time.Duration
	// RetryInterval is the first wait before a failed destroy is tried
	// again; it doubles up to a minute [1s] (reap.go).
	RetryInterval time.Duration
	// PoolSize is how many sandboxes of each template in PoolTemplates
	// the warm pool keeps started ahead (pool.go), on each node of a
	// runtime.Placer; 0 turns the pool off. Members do not count against
	// MaxSandboxes until handed out.
	PoolSize      int
	PoolTemplates []string // [DefaultTemplate]
	PoolPreload   []string // modules members import ahead [DefaultPoolPreload]
	// PoolMax is the most members one pool grows to on demand; above
	// PoolSize the pools follow demand, one per template and resource
	// shape asked for, and shrink back to PoolSize when unused for
	// PoolShrinkAfter [0: PoolSize, a fixed pool] (pool.go). PoolMemory
	// bounds the members above the floors, all pools together
	// [DefaultPoolMemory].
	PoolMax         int
	PoolMemory      int64
	PoolShrinkAfter time.Duration // [DefaultPoolShrinkAfter]
	// MaxResultMemory and MaxSandboxResultMemory bound the bytes of
	// executions' results the engine holds at once, in all and per sandbox
	// (budget.go) [DefaultMaxResultMemory, DefaultMaxSandboxResultMemory;
	// at least 2 × agentproto.MaxFrame].
	MaxResultMemory        int64
	MaxSandboxResultMemory int64
	// OutputRate is how many bytes per second of output (of executions
	// and processes) one sandbox may push through the engine, after a
	// burst of 8 MiB; past it the engine reads its agent more slowly and
	// the code's writes stall (budget.go) [DefaultOutputRate].
	OutputRate int64
	// Events receives every sandbox's events (internal/events)
	// [events.Discard]; the Manager puts its own sink in front (sink.go).
	Events events.Sink
	// Egress configures the network gateway of sandboxes whose policy
	// allows a network (internal/egress); its Events and Logger default
	// to the Manager's. Its events are marked as the gateway's.
	Egress egress.Options
	// Reports bound the events made of what sandboxes report about
	// themselves (reports.go).
	Reports ReportLimits
	// EventRate bounds the events a sandbox's code can cause (its
	// reports, the agent's, the egress gateway's), per sandbox, source,
	// type and kind; past it they are coalesced (coalesce.go).
	EventRate EventRate
	// Shared says that other engines (the server's other replicas) serve
	// these sandboxes too, which outlive this engine (shared.go): nothing
	// is destroyed at start or Close, and deadlines and idleness are the
	// agent's. The Runtime must implement runtime.Attacher.
	Shared bool
	// Leftover, when set, is told of each sandbox New finds left over
	// from a crash, with its last usage reading, just before New
	// destroys it (reap.go): the server charges what it used since its
	// last metering flush. engine.Open hands it to the runtime's sweep
	// of dead instances too.
	Leftover runtime.LeftoverFunc
	// CheckpointDir keeps the checkpoints of paused sandboxes (pause.go),
	// one directory per sandbox; "" turns pausing off. Its parents must
	// let other users pass (a restore reads the images as the sandbox's
	// host uid).
	CheckpointDir string
	// SnapshotDir keeps snapshots (snapshot.go; the server names and
	// lists them) [CheckpointDir's sibling "snapshots", when it is set].
	SnapshotDir string
	// KeepPaused keeps paused sandboxes (checkpointed, not frozen) across
	// a restart of the engine over the same runtime instance (keep.go):
	// Close leaves them as they are, and New takes back each whose
	// checkpoint is complete, in state paused, instead of destroying it.
	KeepPaused bool
	// GPUClass is the CDI class (vendor/class) a request for a number of
	// GPUs draws devices from [DefaultGPUClass]; ShareDevices lets live
	// sandboxes hold the same device (devices.go).
	GPUClass     string
	ShareDevices bool
	Logger       *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.SnapshotDir == "" && c.CheckpointDir != "" {
		c.SnapshotDir = filepath.Join(filepath.Dir(c.CheckpointDir), "snapshots")
	}
	if c.Runtime == nil || c.Templates == nil {
		return errors.New("sandbox: Runtime and Templates are required")
	}
	if _, ok := c.Runtime.(runtime.Attacher); c.Shared && !ok {
		return fmt.Errorf("sandbox: the %s runtime cannot share sandboxes between engines", c.Runtime.Name())
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "python"
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = 5 * time.Minute
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = 24 * time.Hour
	}
	c.DefaultLimits = fillLimits(c.DefaultLimits, DefaultLimits)
	c.MaxLimits = fillLimits(c.MaxLimits, runtime.Limits{MemoryBytes: 8 << 30, CPUs: 2, Pids: 4096, DiskBytes: 8 << 30})
	if c.MaxSandboxes <= 0 {
		c.MaxSandboxes = DefaultMaxSandboxes
	}
	if c.AutoPauseNotice <= 0 {
		c.AutoPauseNotice = DefaultAutoPauseNotice
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.AgentTimeout <= 0 {
		c.AgentTimeout = 10 * time.Second
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = time.Second
	}
	if c.MaxResultMemory <= 0 {
		c.MaxResultMemory = DefaultMaxResultMemory
	}
	if c.MaxSandboxResultMemory <= 0 {
		c.MaxSandboxResultMemory = DefaultMaxSandboxResultMemory
	}
	if c.OutputRate <= 0 {
		c.OutputRate = DefaultOutputRate
	}
	c.Reports = c.Reports.withDefaults()
	c.EventRate = c.EventRate.withDefaults()
	c.MaxResultMemory = max(c.MaxResultMemory, 2*agentproto.MaxFrame)
	c.MaxSandboxResultMemory = max(c.MaxSandboxResultMemory, 2*agentproto.MaxFrame)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Events == nil {
		c.Events = events.Discard
	}
	if c.Egress.Logger == nil {
		c.Egress.Logger = c.Logger
	}
	if c.PoolSize < 0 || c.PoolMax < 0 || c.PoolMemory < 0 || c.PoolShrinkAfter < 0 {
		return errors.New("sandbox: PoolSize, PoolMax, PoolMemory and PoolShrinkAfter must not be negative")
	}
	if c.PoolMemory == 0 {
		c.PoolMemory = DefaultPoolMemory()
	}
	if c.PoolShrinkAfter == 0 {
		c.PoolShrinkAfter = DefaultPoolShrinkAfter
	}
	if c.PoolTemplates == nil {
		c.PoolTemplates = []string{c.DefaultTemplate}
	}
	if c.PoolPreload == nil {
		c.PoolPreload = DefaultPoolPreload
	}
	return nil
}

func fillLimits(l, def runtime.Limits) runtime.Limits {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.CPUs <= 0 {
		l.CPUs = def.CPUs
	}
	if l.Pids <= 0 {
		l.Pids = def.Pids
	}
	if l.DiskBytes <= 0 {
		l.DiskBytes = def.DiskBytes
	}
	return l
}

// createdNow is a sandbox's creation time: now, to the microsecond, as
// every store keeps times (PostgreSQL's timestamptz), so that replicas
// that read it from the record show, order and page sandboxes by the same
// time as the one that created them.
func createdNow() time.Time { return time.Now().Truncate(time.Microsecond) }

// DefaultLimits are a sandbox's limits when neither the caller nor the
// Config sets them.
var DefaultLimits = runtime.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 256, DiskBytes: 256 << 20}

// DefaultMaxSandboxes is how many sandboxes may run at once when the
// Config does not say.
const DefaultMaxSandboxes = 64

// Manager owns every sandbox of one engine.
type Manager struct {
	cfg Config
	log *slog.Logger
	out events.Sink // Config.Events as given: past the sink (sink.go)

	// ctx ends when Close begins: it aborts creates in flight and stops
	// the idle loop, the pool's lease renewal and background destroys.
	ctx    context.Context
	cancel context.CancelFunc
	pool   *pool          // nil when Config.PoolSize and PoolMax are 0
	snaps  snapPools      // snapshots' pools (snappool.go)
	reaps  sync.WaitGroup // background destroys (reap.go)
	hooks  atomic.Pointer[Hooks]
	// autoOnce starts the auto-pause loop at the first auto-pause
	// sandbox (autopause.go).
	autoOnce sync.Once

	resultsOnce sync.Once
	results     *budget // every execution's results held at once (budget.go)

	// mu guards sandboxes, leftovers, lost and closed.
	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	leftovers map[string]error  // ids destroyed in the background, with their last error
	lost      map[string]string // paused sandboxes New could not take back, with why (keep.go)
	closed    bool
	// removing are the volumes being removed (volumes.go): no create
	// mounts one meanwhile.
	removing map[string]bool

	// holdsMu guards holds: the release of each sandbox's hold on its
	// template's root (holds.go), by sandbox id.
	holdsMu sync.Mutex
	holds   map[string]func(collect bool)
	// attendants are the live attendants of volumes, by volume id, and
	// measured the volumes' last measurements (attendant.go); both are
	// guarded by mu, as each attendant's users, idle and drained.
	attendants map[string]*attendant
	measured   map[string]measurement
}

// New returns a Manager. It first destroys every sandbox the runtime still
// holds: sandboxes do not outlive the engine that made them, so anything
// found at start is left over from a crash. New waits a few seconds for
// that at most: what cannot be destroyed by then is retried in the
// background and reported by Leftovers, never fatal (reap.go).
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, sandboxes: map[string]*Sandbox{}, leftovers: map[string]error{}, out: cfg.Events}
	m.cfg.Events = sink{m: m, out: cfg.Events}
	if m.cfg.Egress.Events == nil {
		m.cfg.Egress.Events = m.cfg.Events
	}
	m.cfg.Egress.Events = gatewayEvents{m.cfg.Egress.Events}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if !cfg.Shared {
		kept := m.takeBack(ctx) // paused sandboxes of an earlier engine (keep.go)
		m.reconcile(ctx, kept)  // shared ones are the server's collector's
		m.removeCheckpoints(kept)
	}
	if cfg.IdleTimeout > 0 {
		go m.idleLoop(min(cfg.IdleTimeout/4, 5*time.Second))
	}
	if cfg.PoolSize > 0 || cfg.PoolMax > 0 {
		m.pool = newPool(m)
	}
	return m, nil
}

// CreateOptions describe a new sandbox. Zero fields take the Manager's defaults.
type CreateOptions struct {
	Template string
	Timeout  time.Duration
	Limits   runtime.Limits
	ReadOnly bool
	Env      map[string]string
	Metadata map[string]string
	// Policy is the sandbox's security policy (internal/policy); nil means
	// the defaults: no network, no import rules, no output filtering.
	Policy *policy.Policy
	// Owner is who the sandbox belongs to (the server's key owner). The
	// engine only copies it into the sandbox's events, for their fan-out.
	Owner string
	// Runtime chooses the sandbox's isolation among those the runtime
	// offers (runtime.Offered), e.g. "gvisor"; "" is its default. A
	// sandbox with a choice never comes from the warm pool.
	Runtime string
	// AccountRuntime is the runtime of its account's sandboxes that
	// choose none and whose template names none (resolveRuntime: the
	// request, then the template, then the account, then the server's
	// default); with RuntimeLocked, it is the only runtime the sandbox
	// may run under, whatever the request or the template says.
	AccountRuntime string
	RuntimeLocked  bool
	// Names are the caller's names for Limits, Timeout and the policy's
	// resource limits, for refusals (Grant, ceiling.go).
	Names FieldNames
	// Volumes are mounted in the sandbox when it starts (volumes.go); a
	// sandbox with volumes never comes from the warm pool.
	Volumes []VolumeMount
	// Snapshot, when set, is the directory of a snapshot (Sandbox.Snapshot)
	// the sandbox starts from, with its processes and files; the other
	// options must be those the snapshotted sandbox was made with
	// (snapshot.go).
	Snapshot string
	// SnapshotPool, with Snapshot, names the snapshot pool
	// (Manager.SetSnapshotPool) a member of which the sandbox is, when
	// one is ready (snappool.go).
	SnapshotPool string
	// AutoPause pauses the sandbox instead of stopping it when its
	// lifetime ends or it is idle past IdleTimeout, once it is idle
	// (autopause.go). The engine must be able to pause (CanPause).
	AutoPause bool
	// Devices are devices to give the sandbox, by their CDI names, and
	// GPUs a number of devices of Config.GPUClass (devices.go); a sandbox
	// with devices never comes from the warm pool. When GPUs is 0 and
	// Devices nil, the template's (TemplateDevices) are given; an empty
	// non-nil Devices asks for none.
	Devices []string
	GPUs    int
	// MaxDevices bounds the devices the live sandboxes of Owner hold at
	// once, this one's included (the account's max_devices); 0: no bound.
	MaxDevices int
}

// RuntimeGVisor is the runtime choice (CreateOptions.Runtime) of gVisor,
// whose sandboxes cannot be checkpointed (no pause, snapshot or auto
// pause) nor mount volumes yet.
const RuntimeGVisor = "gvisor"

// defaultRuntime is implemented by a runtime whose sandboxes that name no
// runtime get a named one (the OCI runtime's runc or gvisor).
type defaultRuntime interface{ DefaultRuntime() string }

// runtimeOf names the runtime a sandbox asking for choice gets.
func (m *Manager) runtimeOf(choice string) string {
	if choice != "" {
		return choice
	}
	if d, ok := m.cfg.Runtime.(defaultRuntime); ok {
		return d.DefaultRuntime()
	}
	return m.cfg.Runtime.Name()
}

// Runtimes lists the runtimes a sandbox may ask for (runtime.Offered).
func (m *Manager) Runtimes() []string { return runtime.Offered(m.cfg.Runtime) }

// resolveRuntime sets opt.Runtime to the runtime the sandbox runs under:
// the request's, else its template's, else its account's, else ""
// (the server's default). An account whose runtime is locked refuses
// any other (ERR_FORBIDDEN): the operator chose it, and neither the
// tenant's request nor a template it built may leave it.
func (m *Manager) resolveRuntime(opt *CreateOptions) error {
	asked := opt.Runtime
	if tr, ok := m.cfg.Templates.(TemplateRuntimes); ok && opt.Runtime == "" {
		opt.Runtime = tr.Runtime(opt.Template) // the template's choice
	}
	if opt.Runtime == "" {
		opt.Runtime = opt.AccountRuntime
	}
	if opt.RuntimeLocked && opt.AccountRuntime != "" && m.runtimeOf(opt.Runtime) != m.runtimeOf(opt.AccountRuntime) {
		by := "the request"
		if asked == "" {
			by = "template " + strconv.Quote(opt.Template)
		}
		return apierr.New(apierr.Forbidden, "this account's sandboxes run under runtime %q, set by the operator; %s asks for %q",
			opt.AccountRuntime, by, opt.Runtime)
	}
	return nil
}

// create starts a sandbox and returns once its agent answers (Create).
func (m *Manager) create(ctx context.Context, opt CreateOptions) (*Sandbox, error) {
	if opt.Template == "" {
		opt.Template = m.cfg.DefaultTemplate
	}
	if err := m.resolveRuntime(&opt); err != nil {
		return nil, err
	}
	m.templateDevices(&opt)
	if opt.Runtime != "" {
		if offered := runtime.Offered(m.cfg.Runtime); !slices.Contains(offered, opt.Runtime) {
			if opt.Runtime == RuntimeGVisor {
				return nil, apierr.New(apierr.NotSupported, "runtime %q is not installed on this server (gVisor's runsc: make setup builds it); offered: %s", opt.Runtime, strings.Join(offered, ", "))
			}
			return nil, apierr.New(apierr.BadRequest, "runtime %q is not offered by this server; offered: %s", opt.Runtime, strings.Join(offered, ", "))
		}
		if d, ok := m.cfg.Runtime.(defaultRuntime); ok && d.DefaultRuntime() == opt.Runtime {
			opt.Runtime = "" // the default's: a warm pool member will do
		}
	}
	if _, local := m.cfg.Runtime.(defaultRuntime); local && m.runtimeOf(opt.Runtime) == RuntimeGVisor {
		switch {
		case opt.AutoPause:
			return nil, apierr.New(apierr.NotSupported, "auto_pause: a gVisor sandbox cannot be paused (no checkpoint under gVisor)")
		case opt.Snapshot != "":
			return nil, apierr.New(apierr.NotSupported, "a gVisor sandbox cannot start from a snapshot (no checkpoint under gVisor)")
		case len(opt.Volumes) > 0:
			return nil, apierr.New(apierr.NotSupported, "volumes are not mounted in gVisor sandboxes yet")
		case opt.Policy.DenySubprocess():
			// Its kernel filter (seccomp user notification) is one the
			// Sentry does not implement: every execution would fail.
			return nil, apierr.New(apierr.NotSupported, "allow_subprocess: false cannot be enforced in a gVisor sandbox (gVisor has no seccomp user notification); use runtime runc")
		}
	}
	kpol, err := applyCreatePolicy(&opt)
	if err != nil {
		return nil, err
	}
	pol := policyState{pol: opt.Policy, kernel: kpol, gen: 1}
	// The engine's own bounds, whoever calls: the server granted within
	// the account's ceiling already (ceiling.go).
	g, err := m.Grant(opt, Ceiling{})
	if err != nil {
		return nil, err
	}
	limits := g.Limits
	opt.Timeout = g.Timeout
	if _, err := envList(opt.Env); err != nil { // refused before anything starts
		return nil, err
	}
	rootfs, err := m.cfg.Templates.RootFS(opt.Template)
	if err != nil {
		return nil, apierr.Wrap(err, apierr.TemplateNotFound, "template %q is not available: %v", opt.Template, err)
	}
	start, err := m.templateStart(opt.Template)
	if err != nil {
		return nil, err
	}
	egressPolicy, err := policy.CompileEgress(opt.Policy.NetworkPolicy())
	if err != nil {
		return nil, invalidPolicy(err)
	}
	if err := m.checkVolumes(opt.Volumes); err != nil {
		return nil, err
	}
	devs, err := m.listDevices(opt)
	if err != nil {
		return nil, err
	}
	if opt.Snapshot != "" && opt.wantsDevices() {
		return nil, apierr.New(apierr.NotSupported, "a sandbox with devices cannot start from a snapshot")
	}
	if opt.Snapshot != "" {
		if egressPolicy.Enabled() && m.proxiesEgress() {
			return nil, apierr.New(apierr.NotSupported, "a sandbox with a network cannot start from a snapshot on this runtime")
		}
		if _, err := m.snapshotter(); err != nil {
			return nil, err
		}
		// A networked snapshot's clones are never pooled (snappool.go):
		// each gets its gateway as it is made.
		if opt.SnapshotPool != "" && !opt.AutoPause && len(opt.Volumes) == 0 && !egressPolicy.Enabled() {
			if s, ok, err := m.fromSnapPool(ctx, opt); ok {
				return s, err
			}
		}
	}
	if !egressPolicy.Enabled() && opt.Runtime == "" && len(opt.Volumes) == 0 && opt.Snapshot == "" && !opt.wantsDevices() {
		if s, ok, err := m.fromPool(ctx, opt, limits, pol); ok {
			return s, err
		}
	}

	s := &Sandbox{
		ID: newID(), Template: opt.Template, Limits: limits, ReadOnly: opt.ReadOnly,
		Env: opt.Env, Metadata: opt.Metadata, Created: createdNow(), m: m, state: StateStarting, owner: opt.Owner, pol: pol,
		created: make(chan struct{}), volumes: slices.Clone(opt.Volumes),
	}
	var mounts []string
	for _, v := range opt.Volumes {
		mounts = append(mounts, v.Path)
	}
	s.project = newProject(start, rootfs, mounts)
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return nil, apierr.New(apierr.Capacity, "the engine is shutting down")
	case len(m.sandboxes) >= m.cfg.MaxSandboxes:
		m.mu.Unlock()
		return nil, &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("all %d sandbox slots are in use", m.cfg.MaxSandboxes)}
	}
	if err := m.volumesFree(s); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	if err := m.takeDevices(s, opt, devs); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	m.sandboxes[s.ID] = s
	m.mu.Unlock()
	s.root, s.startUser, s.startUserKnown = rootfs, start.User, opt.Snapshot == ""
	if err := m.holdRoot(s.ID, rootfs); err != nil {
		close(s.created)
		m.destroy(s, reasonFailed)
		return nil, apierr.Wrap(err, apierr.TemplateNotFound, "template %q is not available: %v", opt.Template, err)
	}
	// No attendant holds a volume a sandbox's Pod is to mount (attendant.go).
	for _, v := range opt.Volumes {
		m.stopAttendants(ctx, v.ID)
	}

	spec := runtime.Spec{
		ID: s.ID, Template: opt.Template, RootFS: rootfs, Limits: limits, ReadOnly: opt.ReadOnly, Env: sandboxEnv(start.Env, limits, opt.Env),
		WritablePaths: opt.Policy.WritablePaths(), Runtime: opt.Runtime, Volumes: runtimeVolumes(opt.Volumes),
		Devices: s.devices, GPUs: s.gpuCount(m),
		// What waitAgent's ping says, from the start (runtime.Spec.Lifetime).
		Lifetime: opt.Timeout + lifetimeGrace,
		User:     start.User, WorkDir: start.WorkDir,
	}
	if egressPolicy.Enabled() {
		gw, err := egress.New(m.cfg.Egress, s.ID, egressPolicy, opt.Policy.NetworkRequests())
		if err != nil {
			close(s.created)
			m.destroy(s, reasonFailed)
			return nil, apierr.Wrap(err, apierr.Internal, "could not start the sandbox's network")
		}
		s.net = gw
		spec.Network = &runtime.Network{ResolvConf: egress.ResolvConf, Attach: gw.Attach, AttachNetns: gw.AttachNetns}
		if m.proxiesEgress() {
			spec.Network = &runtime.Network{Proxy: true}
			s.shareEgressBudget()
		}
	}
	// Close aborts a create in flight; the sandbox is then destroyed by
	// whoever stops it, once the runtime's Create has returned.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	began := time.Now()
	var inst *runtime.Instance
	if opt.Snapshot != "" {
		inst, err = m.startFrom(ctx, spec, opt.Snapshot)
	} else {
		inst, err = m.cfg.Runtime.Create(ctx, spec)
	}
	runtimeDone := time.Now()
	if err == nil {
		s.agent, s.inst = newAgentClient(inst, m.agentCall, m.log.With("sandbox", inst.ID)), inst
		m.mu.Lock() // s is in the table: nodeLoad reads it
		s.node = inst.Node
		m.mu.Unlock()
	}
	close(s.created)
	if err != nil {
		m.destroy(s, reasonFailed)
		return nil, m.startErr(err, "could not start the sandbox")
	}
	if err := s.waitAgent(ctx, m.cfg.AgentTimeout, opt.Timeout); err != nil {
		m.destroy(s, reasonFailed)
		return nil, m.startErr(err, "the sandbox agent did not start")
	}
	if !s.startLife(opt.Timeout) {
		// Stopped while starting: the engine is closing, or a Kill.
		return nil, s.running()
	}
	if spec.Network != nil && spec.Network.Proxy {
		s.serveEgress(inst)
	}
	if opt.Snapshot != "" {
		start.Command = "" // the snapshot's processes run on: its start command among them
	}
	if err := s.runTemplateStart(ctx, start, m.cfg.StartTimeout); err != nil {
		m.destroy(s, reasonFailed)
		if m.ctx.Err() != nil {
			return nil, m.startErr(err, "the sandbox did not start")
		}
		return nil, err
	}
	m.log.Info("sandbox created", "sandbox", s.ID, "template", s.Template,
		"runtime", runtimeDone.Sub(began).Round(10*time.Microsecond), "agent", time.Since(runtimeDone).Round(10*time.Microsecond))
	s.announce(false)
	return s, nil
}

// startErr is the error of a create that failed: "shutting down" when
// Close aborted it.
func (m *Manager) startErr(err error, msg string) error {
	if m.ctx.Err() != nil {
		return apierr.Wrap(err, apierr.Capacity, "the engine is shutting down")
	}
	if errors.Is(err, runtime.ErrCapacity) {
		return apierr.Wrap(err, apierr.Capacity, "this host has no room for another sandbox; try again when one stops")
	}
	if errors.Is(err, runtime.ErrVolumeNotFound) {
		return apierr.Wrap(err, apierr.VolumeNotFound, "%s: a volume to mount is gone", msg)
	}
	if errors.Is(err, runtime.ErrDeviceNotFound) {
		return apierr.Wrap(err, apierr.DeviceNotFound, "%s: %v", msg, err)
	}
	if errors.Is(err, runtime.ErrUnsupported) {
		// The request asks for what this server's runtime cannot do
		// (a network for a Pod): the caller's to change.
		return apierr.Wrap(err, apierr.BadRequest, "%s: %v", msg, err)
	}
	return apierr.Wrap(err, apierr.Internal, "%s", msg)
}

// startLife moves a starting sandbox to running with a lifetime of d from
// now. It fails if the sandbox is no longer starting (someone stopped it).
func (s *Sandbox) startLife(d time.Duration) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateStarting {
		return false
	}
	s.state = StateRunning
	s.lastActive = now
	s.lastCPU = 0
	s.deadline = now.Add(d)
	s.timer = time.AfterFunc(d, func() { s.m.expire(s) })
	return true
}

// lifetimeGrace is how long after the engine's deadline the agent ends a
// sandbox on its own: the engine's timer normally acts first, and the
// agent's is the backstop that holds while no engine runs (after a crash).
const lifetimeGrace = 2 * time.Second

// lifetimeCallTimeout bounds telling the agent its lifetime.
const lifetimeCallTimeout = 5 * time.Second

// waitAgent pings the agent until it answers; the pings tell it to end the
// sandbox lifetime (plus lifetimeGrace) from now.
func (s *Sandbox) waitAgent(ctx context.Context, timeout, lifetime time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ping := agentproto.Request{Op: agentproto.OpPing, LifetimeMS: (lifetime + lifetimeGrace).Milliseconds()}
	for {
		ev, err := s.agent.call(ctx, ping, nil, agentproto.Handlers{}, callOptions{})
		if err == nil {
			if ev.Agent == nil || ev.Agent.ProtocolVersion != agentproto.ProtocolVersion {
				return fmt.Errorf("agent speaks another protocol version: %+v", ev.Agent)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func envList(env map[string]string) ([]string, error) {
	keys := slices.Sorted(maps.Keys(env))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(env[k], 0) {
			return nil, apierr.New(apierr.BadRequest, "invalid environment variable %q", k)
		}
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// newID returns a random sandbox id: 20 lowercase hex characters.
func newID() string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Get returns a sandbox that is still known to the Manager.
func (m *Manager) Get(id string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sandboxes[id]
	if !ok {
		return nil, apierr.New(apierr.SandboxNotFound, "sandbox %q not found", id)
	}
	return s, nil
}

// List returns every sandbox, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	out := make([]Info, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		out = append(out, s.Info())
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Kill stops a sandbox and removes everything it had.
func (m *Manager) Kill(ctx context.Context, id string) error {
	s, err := m.Get(id)
	if err != nil {
		return err
	}
	return m.destroy(s, "killed")
}

// Why sandboxes stop (Info.StopReason).
const (
	reasonTimeout  = "timed out" // the lifetime ended
	reasonFailed   = "failed to start"
	reasonShutdown = "engine shut down"
)

func (m *Manager) expire(s *Sandbox) {
	s.mu.Lock()
	early := time.Now().Before(s.deadline) // SetTimeout moved it as the timer fired
	paused := s.state == StatePaused       // paused as the timer fired: its lifetime stands still
	s.mu.Unlock()
	if early || paused || m.expireAuto(s) {
		return
	}
	if m.cfg.Shared {
		// Another engine may have moved the deadline: the agent knows.
		if d, ok := s.sharedDeadline(); ok {
			s.mu.Lock()
			if s.state == StateRunning {
				s.deadline = d
				s.timer.Reset(time.Until(d))
			}
			s.mu.Unlock()
			return
		}
	}
	m.log.Info("sandbox timed out", "sandbox", s.ID)
	_ = m.destroy(s, reasonTimeout)
}

// destroyTimeout bounds one attempt at destroying a sandbox.
const destroyTimeout = time.Minute

// destroy takes a sandbox down; only the first caller does the work. A
// sandbox still being created is destroyed once the runtime's Create has
// returned (Close aborts it), so a create racing a stop never leaves a
// sandbox running untracked. A failed destroy is retried in the background
// (reap.go).
func (m *Manager) destroy(s *Sandbox, reason string) error {
	s.mu.Lock()
	if order(s.state) >= order(StateStopping) {
		s.mu.Unlock()
		return nil
	}
	s.state = StateStopping
	s.stopReason = reason
	if s.timer != nil {
		s.timer.Stop()
	}
	announced := s.announced
	s.mu.Unlock()
	if announced {
		defer s.emit(events.SandboxStopped, "", map[string]any{"reason": reason})
	}
	// What the coalescer holds goes before sandbox.stopped (defers run
	// last first), once the gateway, which emits, is closed.
	defer s.flushEvents()
	<-s.created
	m.stopping(s)
	// Destroying must finish even if the caller has gone away.
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	err := m.cfg.Runtime.Destroy(ctx, s.ID)
	// Calls still streaming end now, whether or not the runtime's
	// destroy cut their connections.
	s.mu.Lock()
	agent := s.agent // a resume may have replaced it
	s.mu.Unlock()
	agent.conns.closeAll()
	s.closeNet()
	s.transition(StateStopped)
	m.forget(s.ID)
	if err == nil {
		m.removeCheckpoint(s.ID)
		m.releaseRoot(s.ID) // unmounted: its root may go
	}
	if err != nil {
		m.reap(s.ID, err)
		return apierr.Wrap(err, apierr.Internal, "could not clean up sandbox %s; retrying in the background", s.ID)
	}
	m.log.Info("sandbox stopped", "sandbox", s.ID, "reason", reason)
	m.measureWritten(s)
	return nil
}

// announce emits sandbox.created; from then on the sandbox's stop is
// reported too (a warm pool member is announced when handed out).
func (s *Sandbox) announce(fromPool bool) {
	s.mu.Lock()
	s.announced = true
	s.mu.Unlock()
	lim := s.CurrentLimits()
	s.emit(events.SandboxCreated, "", map[string]any{"template": s.Template, "pool": fromPool,
		"memory_mb": lim.MemoryBytes >> 20, "cpus": lim.CPUs, "pids": lim.Pids, "disk_mb": lim.DiskBytes >> 20})
}

// emit sends one of the sandbox's events to Config.Events.
func (s *Sandbox) emit(typ events.Type, executionID string, details map[string]any) {
	s.emitFrom(events.SourceHost, typ, executionID, details)
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.mu.Unlock()
}

// Close stops accepting sandboxes, aborts creates in flight and destroys
// every sandbox. Sandboxes whose destroy fails, or that were still being
// destroyed in the background, are left to the next engine's start.
// Shared sandboxes (Config.Shared) are released instead: they go on for
// the other engines; only the warm pool's members are destroyed.
func (m *Manager) Close(ctx context.Context) error {
	m.cancel()
	poolErr := m.closeSnapPools()
	if m.pool != nil {
		poolErr = errors.Join(poolErr, m.pool.close())
	}
	m.mu.Lock()
	m.closed = true
	all := slices.Collect(maps.Values(m.sandboxes))
	m.mu.Unlock()
	m.stopAttendants(ctx, "")
	var wg sync.WaitGroup
	errs := make([]error, len(all))
	for i, s := range all {
		if m.cfg.Shared {
			m.Release(s.ID, "")
			continue
		}
		if m.cfg.KeepPaused && s.keep() {
			continue // left to the next engine (keep.go)
		}
		wg.Go(func() { errs[i] = m.destroy(s, reasonShutdown) })
	}
	wg.Wait()
	m.reaps.Wait()
	m.releaseRoots()
	if left := m.Leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("%d sandboxes could not be destroyed and are left to the next start: %s",
			len(left), strings.Join(left, ", ")))
	}
	return errors.Join(append(errs, poolErr)...)
}

// reasonOOM is the stop reason of a sandbox whose agent the OOM killer took.
const reasonOOM = "the sandbox ran out of memory"

// gone marks a sandbox whose agent stopped answering and cleans it up. The
// error says truthfully why, in the words the sandbox's record uses: the
// reason it was stopped for (a Kill, the engine's timer), "timed out" when
// its deadline has passed (the agent ends a sandbox at its deadline on its
// own), an OOM kill, or else an unexpected stop. A Pod's OOM kills are
// counted by its agent (usage.go), which is gone by now: a Pod whose
// agent the OOM killer ended stopped "unexpectedly".
func (s *Sandbox) gone(err error) error {
	if !errors.Is(err, errAgentGone) {
		return err
	}
	s.mu.Lock()
	reason, deadline, st := s.stopReason, s.deadline, s.state
	s.mu.Unlock()
	if st == StatePaused {
		// A pause closed the call's connection: the sandbox lives on.
		return s.pausedErr(err)
	}
	switch {
	case reason != "":
	case !deadline.IsZero() && !time.Now().Before(deadline):
		reason = reasonTimeout
	default:
		reason = "the sandbox stopped unexpectedly"
		if u, uerr := s.usage(context.Background()); uerr == nil && u.OOMKills > 0 {
			reason = reasonOOM
			s.mu.Lock()
			s.seen.memoryPeak = u.MemoryPeakBytes
			s.mu.Unlock()
		}
	}
	_ = s.m.destroy(s, reason)
	s.mu.Lock()
	reason = s.stopReason // the first to stop it said why
	s.mu.Unlock()
	if reason == reasonTimeout {
		return apierr.Wrap(err, apierr.SandboxTimeout, "sandbox %s timed out: its lifetime ended", s.ID)
	}
	return apierr.Wrap(err, apierr.SandboxState, "%s", reason)
}

// idleLoop stops sandboxes idle for longer than Config.IdleTimeout.
func (m *Manager) idleLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			m.mu.Lock()
			all := slices.Collect(maps.Values(m.sandboxes))
			m.mu.Unlock()
			// Each check asks the sandbox's usage (and a shared one's
			// agent): a few at once, each bounded, so that an agent that
			// does not answer delays only its own sandbox's check.
			var g errgroup.Group
			g.SetLimit(idleChecks)
			for _, s := range all {
				g.Go(func() error {
					ctx, cancel := context.WithTimeout(m.ctx, idleCheckTimeout)
					defer cancel()
					if s.idleSince(ctx, now, every) > m.cfg.IdleTimeout && !s.AutoPause() { // the auto-pause loop's
						m.log.Info("sandbox idle", "sandbox", s.ID, "idle_timeout", m.cfg.IdleTimeout)
						go m.destroy(s, "idle")
					}
					return nil
				})
			}
			g.Wait()
		}
	}
}

// idleChecks is how many sandboxes the idle loop checks at once, and
// idleCheckTimeout bounds one check's calls (a live agent answers in
// milliseconds; a check that fails leaves the sandbox as active as it
// was).
const (
	idleChecks       = 16
	idleCheckTimeout = 2 * time.Second
)

// idleSince returns how long the sandbox has done nothing. Work counts:
// requests in flight, and CPU its processes used since the last check.
func (s *Sandbox) idleSince(ctx context.Context, now time.Time, interval time.Duration) time.Duration {
	if s.m.cfg.Shared {
		// The agent serves every engine's requests: it knows.
		if idle, ok := s.sharedIdle(ctx); ok {
			s.mu.Lock()
			if active := now.Add(-idle); active.After(s.lastActive) {
				s.lastActive = active
			}
			s.mu.Unlock()
		}
	}
	u, err := s.usage(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning {
		return 0
	}
	if err == nil {
		if used := u.CPUNanos - s.lastCPU; s.lastCPU != 0 && used > uint64(interval.Nanoseconds()/100) {
			s.lastActive = now
		}
		s.lastCPU = u.CPUNanos
	}
	if s.busy > 0 {
		s.lastActive = now
	}
	return now.Sub(s.lastActive)
}

// NetworkMode is the sandbox's network mode: policy.NetworkNone when it
// has no network interface, else the mode its gateway enforces.
func (s *Sandbox) NetworkMode() string {
	if s.net == nil {
		return policy.NetworkNone
	}
	return s.net.Mode()
}

// closeNet stops the sandbox's network gateway, if it has one.
func (s *Sandbox) closeNet() {
	if s.net != nil {
		_ = s.net.Close()
	}
}
