package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// State is where a sandbox is in its life.
type State string

// The states, in the only order a sandbox passes through them, but for
// paused: a running sandbox may be paused and resumed (pause.go), and
// either goes on to stopping.
const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
)

// Sandbox is one running sandbox. Its methods are safe for concurrent use.
type Sandbox struct {
	ID       string
	Template string
	// Limits are the sandbox's limits; memory and disk change while it
	// runs (SetPolicy), under mu: read them with CurrentLimits.
	Limits   runtime.Limits
	ReadOnly bool
	Env      map[string]string
	Metadata map[string]string
	Created  time.Time

	m      *Manager
	owner  string      // CreateOptions.Owner, copied into events
	agent  agentClient // replaced, under mu, by a resume (pause.go)
	inst   *runtime.Instance
	pooled bool   // started ahead by the warm pool and handed out by it
	node   string // where it runs, for a runtime.Placer (runtime.Instance.Node); set before its create returns, under m.mu once in the table
	// volumes are CreateOptions.Volumes (volumes.go); they never change.
	volumes []VolumeMount
	// startUser is its template's USER its agent started with
	// (DefaultUser), when startUserKnown; set before the sandbox is
	// handed to anyone; never changes.
	startUser      string
	startUserKnown bool
	// root is the template root it runs on (RootFS's answer at its
	// create), held until its destroy (holds.go); set before the
	// sandbox is handed to anyone; never changes.
	root string
	// project maps the file API's paths (TemplateStart.Root); nil: none.
	// Set before the sandbox is handed to anyone; never changes.
	project *project
	// devices are the CDI names of its devices (devices.go), fixed at
	// create; guarded by Manager.mu while it is created.
	devices []string
	gpus    int // the number of GPUs asked for (devices.go)
	// net is the sandbox's egress gateway; nil without a network.
	net *egress.Gateway
	// ctxLangs maps the ids of the sandbox's code contexts to their
	// languages (TypeScript cells are transpiled before they are sent).
	ctxLangs sync.Map
	// procEnv maps the pids of background commands started with an env
	// to it: the output filter of Connect redacts its secrets.
	procEnv sync.Map
	// created is closed once the runtime's Create has returned: destroy
	// waits for it, so that it never runs under a create in flight.
	created chan struct{}
	// lifeMu orders SetTimeout calls: the agent's deadline and the
	// engine's move together.
	lifeMu sync.Mutex
	// policyMu orders SetPolicy calls: each merges over the policy the
	// one before it left, and resizes the sandbox outside mu.
	policyMu sync.Mutex

	resultsOnce  sync.Once
	results      *budget // the sandbox's results held at once (budget.go)
	outputOnce   sync.Once
	output       *rate.Limiter // the sandbox's output rate (budget.go)
	reportsOnce  sync.Once
	reports      *rate.Limiter // the sandbox's reports per minute (reports.go)
	coalesceOnce sync.Once
	coalesce     *coalescer // the events its code can cause, coalesced (coalesce.go)

	// mu guards the fields below.
	mu         sync.Mutex
	pol        policyState
	state      State
	deadline   time.Time
	timer      *time.Timer
	stopReason string
	lastActive time.Time     // the last request, or the last CPU seen in use
	lastCPU    uint64        // CPUNanos at the last idle check
	busy       int           // requests in flight
	followers  int           // of busy, streams a pause may cut (WithFollower)
	announced  bool          // sandbox.created was emitted, so sandbox.stopped will be
	released   bool          // dropped by Release, not stopped here (shared.go)
	seen       limitCounts   // the cgroup's limit counters already reported (limits.go)
	left       time.Duration // the lifetime a paused sandbox has left (pause.go)
	frozen     bool          // paused by the freezer, memory kept (pause.go)
	kept       bool          // paused, and left by Close to the next engine (keep.go)
	auto       autoState     // auto-pause (autopause.go)
}

// Info is a snapshot of a sandbox for listings.
type Info struct {
	ID         string            `json:"id"`
	Template   string            `json:"template"`
	State      State             `json:"state"`
	Created    time.Time         `json:"created_at"`
	Deadline   time.Time         `json:"expires_at"`
	Limits     runtime.Limits    `json:"limits"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	StopReason string            `json:"stop_reason,omitempty"`
	AutoPause  bool              `json:"auto_pause,omitempty"` // autopause.go
	// Volumes are the volumes mounted at create (volumes.go).
	Volumes []VolumeMount `json:"-"`
	// Devices are the CDI names of its devices, and GPUs the number of
	// GPUs it asked for (devices.go).
	Devices []string `json:"-"`
	GPUs    int      `json:"-"`
}

// Info returns a snapshot of the sandbox.
func (s *Sandbox) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	deadline := s.deadline
	if s.state == StatePaused {
		deadline = time.Now().Add(s.left) // its lifetime stands still
	}
	return Info{
		ID: s.ID, Template: s.Template, State: s.state, Created: s.Created,
		Deadline: deadline, Limits: s.Limits, Metadata: s.Metadata, StopReason: s.stopReason, AutoPause: s.auto.on,
		Volumes: s.volumes, Devices: s.devices, GPUs: s.gpus,
	}
}

// CurrentLimits returns the limits in force (memory and disk may have
// changed since create: SetPolicy).
func (s *Sandbox) CurrentLimits() runtime.Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Limits
}

// State returns the sandbox's state.
func (s *Sandbox) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Deadline is when the sandbox will be stopped unless extended (a
// paused one's moves with the clock: its lifetime stands still).
func (s *Sandbox) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StatePaused {
		return time.Now().Add(s.left)
	}
	return s.deadline
}

// begin marks a request in flight (it ends with the returned func) and
// fails unless the sandbox can take work; a paused sandbox is resumed
// first (pause.go).
func (s *Sandbox) begin(ctx context.Context) (end func(), err error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	follower := isFollower(ctx)
	s.mu.Lock()
	if s.state != StateRunning {
		s.mu.Unlock()
		return nil, s.running()
	}
	s.busy++
	if follower {
		s.followers++
	}
	s.lastActive = time.Now()
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.busy--
		if follower {
			s.followers--
		}
		s.lastActive = time.Now()
		s.mu.Unlock()
	}, nil
}

// running fails unless the sandbox can take work.
func (s *Sandbox) running() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

// runningLocked is running with s.mu held.
func (s *Sandbox) runningLocked() error {
	if s.state != StateRunning {
		msg := fmt.Sprintf("sandbox %s is %s", s.ID, s.state)
		if s.stopReason != "" {
			msg += " (" + s.stopReason + ")"
		}
		return apierr.New(apierr.SandboxState, "%s", msg)
	}
	return nil
}

// transition moves the sandbox forward; it refuses to go back.
func (s *Sandbox) transition(to State) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if order(to) <= order(s.state) {
		return false
	}
	s.state = to
	return true
}

func order(st State) int {
	switch st {
	case StateStarting:
		return 0
	case StateRunning, StatePaused:
		return 1
	case StateStopping:
		return 2
	default:
		return 3
	}
}

// SetTimeout moves the sandbox's deadline to d from now. The agent is told
// first (it ends the sandbox at its deadline even when no engine runs), so
// a failed call leaves both deadlines as they were.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return apierr.New(apierr.BadRequest, "timeout must be positive")
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if err := s.tellLifetime(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning {
		return apierr.New(apierr.SandboxState, "sandbox %s is %s (%s)", s.ID, s.state, s.stopReason)
	}
	s.lastActive = time.Now()
	s.deadline = time.Now().Add(d)
	if s.timer != nil {
		s.timer.Reset(d)
	}
	return nil
}

// tellLifetime tells the agent to end the sandbox d (plus lifetimeGrace)
// from now.
func (s *Sandbox) tellLifetime(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, lifetimeCallTimeout)
	defer cancel()
	_, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpPing, LifetimeMS: (d + lifetimeGrace).Milliseconds()}, nil, agentproto.Handlers{}, callOptions{})
	if err != nil {
		return s.gone(fmt.Errorf("set the agent's deadline: %w", err))
	}
	return nil
}
