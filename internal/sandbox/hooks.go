package sandbox

import (
	"context"
	"time"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Work is a kind of request a Hooks.Admit call is asked about.
type Work int

// The kinds of work admitted one by one.
const (
	WorkExecution Work = iota // code run in a context
	WorkCommand               // a process started (foreground or background)
)

// Hooks let the service layer (accounts, quotas, metering) see a sandbox's
// work and its end without the engine knowing about accounts. Each hook
// must be cheap and must not call back into the Manager.
type Hooks struct {
	// Admit is asked before an execution or a command starts; an error
	// refuses it and is returned to the caller as is.
	Admit func(s *Sandbox, w Work) error
	// Stopping is called once per sandbox that was running, after it has
	// left the running state and before the runtime destroys it: its
	// cgroup can still be read (the last metering sample).
	Stopping func(s *Sandbox)
	// Pausing is called when a sandbox is about to be checkpointed, its
	// cgroup still readable (the last metering sample before the pause),
	// and Resumed once it runs again, in new cgroups whose counters
	// start afresh (pause.go). A pause that fails calls Resumed too.
	Pausing, Resumed func(s *Sandbox)
	// AdmitPause is asked once a pause to disk has begun, the sandbox
	// already counted as paused (State), before anything of it changes:
	// an error refuses the pause, returned to the caller as is, and the
	// sandbox runs on. Concurrent pauses each see the others as paused,
	// so that a bound counted here is never passed.
	AdmitPause func(s *Sandbox) error
	// AdmitResume is asked before a sandbox paused to its checkpoint is
	// restored (not a frozen one: its memory is still held): an error
	// refuses the resume, returned to the caller as is, and the sandbox
	// stays paused as it was, nothing of it restored (pausedbytes.go).
	AdmitResume func(s *Sandbox) error
	// AgentCall observes each host→agent call: its operation and the time
	// from request to Done (metrics). It must be cheap: it runs on every
	// call's path.
	AgentCall func(op string, d time.Duration)
}

// SetHooks installs hooks; later calls replace earlier ones. Safe to call
// while sandboxes run.
func (m *Manager) SetHooks(h Hooks) { m.hooks.Store(&h) }

func (m *Manager) admit(s *Sandbox, w Work) error {
	if h := m.hooks.Load(); h != nil && h.Admit != nil {
		return h.Admit(s, w)
	}
	return nil
}

// agentCall reports a finished agent call to the AgentCall hook.
func (m *Manager) agentCall(op string, d time.Duration) {
	if h := m.hooks.Load(); h != nil && h.AgentCall != nil {
		h.AgentCall(op, d)
	}
}

func (m *Manager) admitPause(s *Sandbox) error {
	if h := m.hooks.Load(); h != nil && h.AdmitPause != nil {
		return h.AdmitPause(s)
	}
	return nil
}

func (m *Manager) admitResume(s *Sandbox) error {
	if h := m.hooks.Load(); h != nil && h.AdmitResume != nil {
		return h.AdmitResume(s)
	}
	return nil
}

func (m *Manager) pausing(s *Sandbox) {
	if h := m.hooks.Load(); h != nil && h.Pausing != nil {
		h.Pausing(s)
	}
}

func (m *Manager) resumed(s *Sandbox) {
	if h := m.hooks.Load(); h != nil && h.Resumed != nil {
		h.Resumed(s)
	}
}

func (m *Manager) stopping(s *Sandbox) {
	if h := m.hooks.Load(); h != nil && h.Stopping != nil {
		h.Stopping(s)
	}
}

// DefaultLimits are the limits a sandbox gets for what its creator does
// not set.
func (m *Manager) DefaultLimits() runtime.Limits { return m.cfg.DefaultLimits }

// DefaultTimeout is the lifetime a sandbox gets unless its creator sets one.
func (m *Manager) DefaultTimeout() time.Duration { return m.cfg.DefaultTimeout }

// KillReason stops a sandbox like Kill, recording why (Info.StopReason).
func (m *Manager) KillReason(ctx context.Context, id, reason string) error {
	s, err := m.Get(id)
	if err != nil {
		return err
	}
	return m.destroy(s, reason)
}
