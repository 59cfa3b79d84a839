package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Shared sandboxes (Config.Shared): several engines, one per replica of
// a server, serve the same sandboxes, which outlive each of them (Pods of
// a cluster). What decides a sandbox's life must then hold for all:
//
//   - Its agent keeps the deadline (every SetTimeout tells it), so an
//     engine whose timer fires asks the agent first: another engine may
//     have moved the deadline (expire).
//   - Its agent sees every engine's requests, so the idle stop asks it
//     how long it has been idle (idleSince).
//   - An engine reaches a sandbox another created through Adopt; it
//     drops one it holds without destroying it through Release (another
//     engine stopped it, or this one is closing).
//   - Nothing is destroyed at start or at Close: the server's collector
//     destroys what no record claims (runtime.Inventory).

// AdoptOptions describe a running sandbox another engine created, as its
// record has it.
type AdoptOptions struct {
	ID       string
	Template string
	Limits   runtime.Limits
	Metadata map[string]string
	Created  time.Time
	// Deadline is the recorded one; the agent's, if it has one, wins.
	Deadline time.Time
	Policy   *policy.Policy
	Owner    string
}

// Adopt takes a running sandbox another engine created into this one:
// from then on it is served here as if created here. It fails with
// ERR_SANDBOX_NOT_FOUND when the runtime holds no running sandbox of
// that id. Adopting a sandbox this engine holds returns it.
func (m *Manager) Adopt(ctx context.Context, opt AdoptOptions) (*Sandbox, error) {
	at, ok := m.cfg.Runtime.(runtime.Attacher)
	if !ok || !m.cfg.Shared {
		return nil, errors.New("sandbox: this engine does not share its sandboxes")
	}
	if s, err := m.Get(opt.ID); err == nil {
		return s, nil
	}
	copt := CreateOptions{Policy: opt.Policy, Limits: opt.Limits}
	kpol, err := applyCreatePolicy(&copt)
	if err != nil {
		return nil, err
	}
	inst, err := at.Attach(ctx, opt.ID)
	if errors.Is(err, runtime.ErrNotFound) {
		return nil, apierr.Wrap(err, apierr.SandboxNotFound, "sandbox %q is not running", opt.ID)
	}
	if err != nil {
		return nil, apierr.Wrap(err, apierr.Internal, "could not reach sandbox %s", opt.ID)
	}
	s := &Sandbox{
		ID: opt.ID, Template: opt.Template, Limits: copt.Limits, ReadOnly: copt.ReadOnly, Metadata: opt.Metadata,
		Created: opt.Created, m: m, state: StateStarting, owner: opt.Owner,
		pol: policyState{pol: opt.Policy, kernel: kpol, gen: 1}, created: make(chan struct{}),
	}
	s.agent, s.node, s.inst = newAgentClient(inst, m.agentCall, m.log.With("sandbox", inst.ID)), inst.Node, inst
	close(s.created)
	info, err := s.agentInfo(ctx)
	if err != nil {
		s.agent.conns.closeAll()
		return nil, apierr.Wrap(err, apierr.Internal, "sandbox %s's agent does not answer", opt.ID)
	}
	deadline := opt.Deadline
	if info.LifetimeLeftMS > 0 {
		deadline = time.Now().Add(time.Duration(info.LifetimeLeftMS)*time.Millisecond - lifetimeGrace)
	}
	m.mu.Lock()
	if other, ok := m.sandboxes[opt.ID]; ok {
		// A concurrent Adopt won.
		m.mu.Unlock()
		s.agent.conns.closeAll()
		return other, nil
	}
	if m.closed {
		m.mu.Unlock()
		s.agent.conns.closeAll()
		return nil, apierr.New(apierr.Capacity, "the engine is shutting down")
	}
	// An adopted sandbox counts as one of this engine's, but is never
	// refused for MaxSandboxes: it runs already, and refusing it would
	// leave it unreachable through this engine.
	m.sandboxes[s.ID] = s
	m.mu.Unlock()
	if !s.startLife(max(time.Until(deadline), time.Millisecond)) {
		return nil, s.running()
	}
	s.mu.Lock()
	s.announced = true // its creator announced it
	s.mu.Unlock()
	if opt.Policy != nil {
		if err := s.adoptEgress(inst, opt.Policy); err != nil {
			m.log.Warn("adopted sandbox: its network", "sandbox", s.ID, "err", err)
		}
	}
	m.log.Info("sandbox adopted", "sandbox", s.ID, "deadline", deadline.Round(time.Second))
	return s, nil
}

// Release drops a sandbox from this engine without destroying it: it
// goes on running for the other engines sharing it, or it was stopped by
// one of them (reason says why, as its record does). Calls streaming
// through this engine end. Releasing a sandbox not held is a no-op.
func (m *Manager) Release(id, reason string) {
	s, err := m.Get(id)
	if err != nil {
		return
	}
	s.mu.Lock()
	if order(s.state) >= order(StateStopping) {
		s.mu.Unlock()
		return
	}
	s.state = StateStopping
	s.stopReason = reason
	s.released = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	<-s.created
	m.stopping(s)
	s.closeNet()
	s.agent.conns.closeAll()
	s.transition(StateStopped)
	m.forget(id)
}

// Collect destroys a sandbox whether or not this engine holds it: the
// server's collector uses it for sandboxes no record claims, and for
// records whose sandbox ended.
func (m *Manager) Collect(ctx context.Context, id, reason string) error {
	if s, err := m.Get(id); err == nil {
		return m.destroy(s, reason)
	}
	return m.cfg.Runtime.Destroy(ctx, id)
}

// Follow moves the sandbox's deadline to d, the one its record has:
// another engine set it (the agent, which that engine told, keeps d
// already). Differences under a second are this engine's own rounding.
func (s *Sandbox) Follow(d time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning || d.IsZero() || d.Sub(s.deadline).Abs() < time.Second {
		return
	}
	s.deadline = d
	if s.timer != nil {
		s.timer.Reset(max(time.Until(d), time.Millisecond))
	}
}

// Released reports whether the sandbox was released (Release), not
// stopped by this engine: its record is not this engine's to write.
func (s *Sandbox) Released() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// Inventory lists what the runtime holds (runtime.Inventory), for the
// server's collector.
func (m *Manager) Inventory(ctx context.Context) ([]runtime.Held, error) {
	inv, ok := m.cfg.Runtime.(runtime.Inventory)
	if !ok {
		return nil, fmt.Errorf("sandbox: the %s runtime keeps no inventory", m.cfg.Runtime.Name())
	}
	return inv.Inventory(ctx)
}

// Shared reports whether the engine's sandboxes are shared with other
// engines (Config.Shared).
func (m *Manager) Shared() bool { return m.cfg.Shared }

// agentInfo pings the agent without changing its deadline.
func (s *Sandbox) agentInfo(ctx context.Context) (*agentproto.AgentInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, s.m.cfg.AgentTimeout)
	defer cancel()
	ev, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{}, callOptions{})
	if err != nil {
		return nil, err
	}
	if ev.Agent == nil || ev.Agent.ProtocolVersion != agentproto.ProtocolVersion {
		return nil, fmt.Errorf("agent speaks another protocol version: %+v", ev.Agent)
	}
	return ev.Agent, nil
}

// sharedDeadline asks the agent of a shared sandbox whose timer fired
// whether another engine moved its deadline; it returns the later one
// (ok), or false when the lifetime has ended or the agent cannot say.
func (s *Sandbox) sharedDeadline() (time.Time, bool) {
	info, err := s.agentInfo(s.m.ctx)
	if err != nil || info.LifetimeLeftMS <= 0 {
		return time.Time{}, false
	}
	d := time.Now().Add(time.Duration(info.LifetimeLeftMS)*time.Millisecond - lifetimeGrace)
	if time.Until(d) < time.Second {
		return time.Time{}, false
	}
	return d, true
}

// sharedIdle is how long the agent of a shared sandbox has served no
// engine's request; 0 while one is in flight.
func (s *Sandbox) sharedIdle(ctx context.Context) (time.Duration, bool) {
	select {
	case <-s.created: // s.agent is set (or the create failed)
	default:
		return 0, false // still starting (the idle loop sees such sandboxes)
	}
	if s.agent.dial == nil {
		return 0, false
	}
	info, err := s.agentInfo(ctx)
	if err != nil {
		return 0, false
	}
	if info.Busy > 0 {
		return 0, true
	}
	return time.Duration(info.IdleMS) * time.Millisecond, true
}
