package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Pause and resume (runtime.Checkpointer).
//
// Pause checkpoints a running sandbox's processes, memory included, into
// Config.CheckpointDir/<id> and ends them: its memory and pids are freed,
// its files (the writable layer) stay as they are. Its lifetime stops
// with it: the time it had left is what it has again at Resume. Resume
// restores the processes, reaches the agent at its new socket, tells it
// the time left and starts the engine's timer again. A request that needs
// the agent (begin, ready) resumes a paused sandbox first, as E2B's
// connect does.
//
// A pause refuses, and leaves the sandbox running as it was, when the
// sandbox has a request in flight (an execution, a foreground command, a
// file call; not a stream that only follows a process's output,
// WithFollower: ERR_SANDBOX_STATE), when the runtime cannot checkpoint
// (ERR_NOT_SUPPORTED: the fake runtime, Kubernetes), or when the engine
// keeps no checkpoints (Config.CheckpointDir empty). What a pause closes:
// every connection to the agent (open port forwards, directory watches,
// process streams end; the processes themselves run on after the
// resume).
//
// A sandbox with a network (network.go): its gateway is detached before
// the dump (the TUN, a host descriptor CRIU cannot dump, goes; every
// connection the sandbox had open through it is closed), and attached
// again to the restored processes' namespace after the restore, before
// the agent is reached. The gateway is the same object: the policy, the
// names resolved, the request count (network_requests) and the bytes
// carried go on as they were. A pause whose dump fails attaches it
// again to the sandbox that runs on.
//
// Freeze is the quick variant: the runtime's Freezer (the cgroup
// freezer) stops the processes where they are, memory kept; the same
// state, lifetime and resume, but the Pausing and Resumed hooks are not
// called (its memory is still held, and metered).

// followerKey marks a context whose request follows a process's output
// (WithFollower).
type followerKey struct{}

// WithFollower marks ctx's request as one that follows a process (its
// output stream): a pause does not wait for it, but cuts its stream; the
// process runs on and can be followed again after the resume (Connect).
// E2B's process streams are such (its background commands keep one
// open); Connect's always are.
func WithFollower(ctx context.Context) context.Context {
	return context.WithValue(ctx, followerKey{}, true)
}

func isFollower(ctx context.Context) bool {
	f, _ := ctx.Value(followerKey{}).(bool)
	return f
}

// ErrPaused is the cause of a call that reached a sandbox while it was
// being paused.
var ErrPaused = errors.New("the sandbox is paused")

// checkpointer returns the runtime's Checkpointer, or why there is none.
func (m *Manager) checkpointer() (runtime.Checkpointer, error) {
	cp, ok := m.cfg.Runtime.(runtime.Checkpointer)
	if !ok || m.cfg.Shared {
		return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) cannot pause sandboxes", m.cfg.Runtime.Name())
	}
	if m.cfg.CheckpointDir == "" {
		return nil, apierr.New(apierr.NotSupported, "this server keeps no checkpoints, so it cannot pause sandboxes")
	}
	return cp, nil
}

// CanPause reports whether the engine can pause sandboxes at all.
func (m *Manager) CanPause() bool {
	_, err := m.checkpointer()
	return err == nil
}

// checkpointPath is where sandbox id's checkpoint is kept.
func (m *Manager) checkpointPath(id string) string {
	return filepath.Join(m.cfg.CheckpointDir, id)
}

// Pause checkpoints the sandbox and frees its memory and processes. A
// paused sandbox is paused again without error.
func (s *Sandbox) Pause(ctx context.Context) error {
	cp, err := s.m.checkpointer()
	if err != nil {
		return err
	}
	if err := s.dumpableNet(); err != nil {
		return err
	}
	if err := s.noDevices("paused"); err != nil {
		return err
	}
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	left, err := s.stopLife()
	if err != nil || left == 0 {
		return err
	}
	if err := s.m.admitPause(s); err != nil {
		s.restartLife(left)
		return err
	}
	s.mu.Lock()
	agent := s.agent
	s.mu.Unlock()

	// The last metering sample of this run: its cgroup still exists.
	s.m.pausing(s)
	// The agent's own deadline keeps running while the sandbox is frozen
	// for the dump and from the restore until the resume's ping (CRIU
	// restores it in a time namespace that hides only the time it was
	// paused): it is given the longest lifetime for the pause, and the
	// time left again at the resume (waitAgent) or when the dump fails.
	if err := s.tellLifetime(ctx, left+s.m.cfg.MaxTimeout); err != nil {
		return s.unpause(err)
	}
	// Every connection to the agent goes first: an open one fails the
	// checkpoint; so does the network's TUN (network.go).
	agent.conns.closeAll()
	s.detachNet()
	unpause := func(err error) error {
		err = s.unpause(err)
		if s.State() == StateRunning {
			_ = s.tellLifetime(context.WithoutCancel(ctx), left) // its own deadline back
		}
		return err
	}
	began := time.Now()
	dir := s.m.checkpointPath(s.ID)
	if err := os.MkdirAll(s.m.cfg.CheckpointDir, 0o711); err != nil {
		return unpause(err)
	}
	err = cp.Checkpoint(context.WithoutCancel(ctx), s.ID, dir)
	if err != nil && !errors.Is(err, runtime.ErrUnsupported) && s.State() == StatePaused {
		// A dump that failed left the sandbox running as it was; a
		// second attempt may find it past what failed it (the runtime
		// freezes a sandbox with no task in a vfork, whose parent CRIU
		// could not seize, "unseizable ... state D" after its 10 s
		// timeout, but gives up on one that vforks all the time).
		s.m.log.Warn("checkpoint failed; trying once more", "sandbox", s.ID, "err", err)
		err = cp.Checkpoint(context.WithoutCancel(ctx), s.ID, dir)
	}
	if err != nil {
		return unpause(err)
	}
	if err := s.writeKept(dir, left); err != nil {
		// Without it no later engine can take the sandbox back; this
		// one resumes it as ever.
		s.m.log.Warn("record a paused sandbox for a restart", "sandbox", s.ID, "err", err)
	}
	if st := s.State(); st != StatePaused {
		// Killed (or the engine closed) during the dump: the destroy
		// waited for it and removes the checkpointed sandbox, and its
		// checkpoint once its runtime's destroy is done; the record
		// just written may have come after that.
		s.m.removeCheckpoint(s.ID)
		return s.running()
	}
	took := time.Since(began)
	s.m.log.Info("sandbox paused", "sandbox", s.ID, "took", took.Round(10*time.Microsecond), "left", left.Round(time.Second))
	s.emit(events.SandboxPaused, "", map[string]any{"took_ms": took.Milliseconds(), "timeout_left_s": int64(left.Seconds())})
	return nil
}

// stopLife moves a running sandbox with no request in flight to paused
// and stops its timer, returning the lifetime it had left; 0 and no
// error: it is paused already. lifeMu is held.
func (s *Sandbox) stopLife() (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == StatePaused:
		return 0, nil
	case s.state != StateRunning:
		return 0, s.runningLocked()
	case s.busy > s.followers:
		return 0, apierr.New(apierr.SandboxState, "sandbox %s is busy (%d requests in flight: an execution, a command or a file call); pause it when they end",
			s.ID, s.busy-s.followers)
	}
	left := time.Until(s.deadline)
	if left <= 0 {
		return 0, apierr.New(apierr.SandboxTimeout, "sandbox %s timed out: its lifetime ended", s.ID)
	}
	s.state = StatePaused
	s.left = left
	s.timer.Stop()
	return left, nil
}

// restartLife undoes stopLife before anything else of a pause was done
// (AdmitPause refused it): running again, with the lifetime it had left.
func (s *Sandbox) restartLife(left time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StatePaused {
		return // stopped meanwhile
	}
	s.state = StateRunning
	s.deadline = time.Now().Add(left)
	s.timer.Reset(left)
}

// unpause undoes a pause whose checkpoint failed (the runtime left the
// sandbox running as it was): a new agent client, the timer again.
func (s *Sandbox) unpause(cause error) error {
	s.mu.Lock()
	if s.state != StatePaused {
		st := s.state
		s.mu.Unlock()
		return apierr.Wrap(cause, apierr.SandboxState, "sandbox %s is %s", s.ID, st)
	}
	s.agent = newAgentClient(s.inst, s.m.agentCall, s.m.log.With("sandbox", s.ID))
	s.state = StateRunning
	s.deadline = time.Now().Add(s.left)
	s.timer.Reset(s.left)
	s.lastActive = time.Now()
	inst := s.inst
	s.mu.Unlock()
	s.reattachNet(inst)
	s.m.resumed(s)
	if errors.Is(cause, runtime.ErrUnsupported) {
		return apierr.Wrap(cause, apierr.NotSupported, "sandbox %s cannot be paused: %v", s.ID, cause)
	}
	return apierr.Wrap(cause, apierr.Internal, "could not pause sandbox %s; it runs on", s.ID)
}

// Resume restores a paused sandbox. A running sandbox is resumed
// without error.
func (s *Sandbox) Resume(ctx context.Context) error {
	if s.State() != StatePaused {
		return s.running()
	}
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	s.mu.Lock()
	st, left, frozen, kept := s.state, s.left, s.frozen, s.kept
	s.mu.Unlock()
	if st != StatePaused {
		return s.running()
	}
	if kept {
		return s.errKept()
	}
	if frozen {
		return s.thaw(ctx, s.m.cfg.Runtime.(runtime.Freezer), left)
	}
	cp, err := s.m.checkpointer()
	if err != nil {
		return err
	}
	if err := s.m.admitResume(s); err != nil {
		return err // it stays paused (pausedbytes.go)
	}
	began := time.Now()
	dir := s.m.checkpointPath(s.ID)
	inst, err := cp.Restore(context.WithoutCancel(ctx), s.ID, dir)
	if err != nil {
		return resumeErr(s.ID, err)
	}
	if err := s.attachNet(context.WithoutCancel(ctx), inst); err != nil {
		// Its policy's network cannot be given back: it is not let
		// run on without it, nor with another.
		_ = s.m.destroy(s, "could not be resumed")
		return apierr.Wrap(err, apierr.Internal, "sandbox %s's network could not be attached after the resume; the sandbox is stopped", s.ID)
	}
	agent := newAgentClient(inst, s.m.agentCall, s.m.log.With("sandbox", s.ID))
	// The caller going away does not undo the restore.
	if err := (&Sandbox{agent: agent}).waitAgent(context.WithoutCancel(ctx), s.m.cfg.AgentTimeout, left); err != nil {
		// The restored processes do not answer: nothing of the
		// sandbox can be trusted to come back.
		agent.conns.closeAll()
		_ = s.m.destroy(s, "could not be resumed")
		return apierr.Wrap(err, apierr.Internal, "sandbox %s's agent did not answer after the resume; the sandbox is stopped", s.ID)
	}
	now := time.Now()
	s.mu.Lock()
	if s.state != StatePaused {
		// Killed while it was being restored: destroy has run (or
		// runs) and removes what the restore started.
		s.mu.Unlock()
		agent.conns.closeAll()
		return s.running()
	}
	s.inst, s.agent = inst, agent
	s.state = StateRunning
	s.deadline = now.Add(left)
	s.timer.Reset(left)
	s.lastActive, s.lastCPU = now, 0
	s.mu.Unlock()
	s.m.resumed(s)
	if err := os.RemoveAll(dir); err != nil {
		s.m.log.Warn("remove a resumed sandbox's checkpoint", "sandbox", s.ID, "err", err)
	}
	took := time.Since(began)
	s.m.log.Info("sandbox resumed", "sandbox", s.ID, "took", took.Round(10*time.Microsecond))
	s.emit(events.SandboxResumed, "", map[string]any{"took_ms": took.Milliseconds()})
	return nil
}

// Freeze pauses the sandbox with the cgroup freezer (runtime.Freezer):
// its processes stop where they are and keep their memory, which stays
// charged to it, so that Resume is quick. Requests resume it as after
// Pause; a paused sandbox (either way) is paused again without error.
// Its lifetime stands still too; its metering does not stop (its memory
// is still held).
func (s *Sandbox) Freeze(ctx context.Context) error {
	fr, ok := s.m.cfg.Runtime.(runtime.Freezer)
	if !ok || s.m.cfg.Shared {
		return apierr.New(apierr.NotSupported, "this server's runtime (%s) cannot freeze sandboxes", s.m.cfg.Runtime.Name())
	}
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	left, err := s.stopLife()
	if err != nil || left == 0 {
		return err
	}
	// While frozen the agent's own deadline must not pass (its timer
	// would fire at the thaw, before it is told the time left): it is
	// given the longest lifetime for the freeze, and the time left again
	// at the thaw.
	if err := s.tellLifetime(ctx, left+s.m.cfg.MaxTimeout); err != nil {
		return s.unpause(err)
	}
	s.mu.Lock()
	agent := s.agent
	s.mu.Unlock()
	agent.conns.closeAll()
	began := time.Now()
	if err := fr.Freeze(context.WithoutCancel(ctx), s.ID); err != nil {
		err = s.unpause(err)
		_ = s.tellLifetime(context.WithoutCancel(ctx), left) // its own deadline back
		return err
	}
	s.mu.Lock()
	s.frozen = true
	s.mu.Unlock()
	took := time.Since(began)
	s.m.log.Info("sandbox frozen", "sandbox", s.ID, "took", took.Round(10*time.Microsecond), "left", left.Round(time.Second))
	s.emit(events.SandboxPaused, "", map[string]any{"took_ms": took.Milliseconds(), "timeout_left_s": int64(left.Seconds()), "memory": "kept"})
	return nil
}

// thaw resumes a frozen sandbox; lifeMu is held.
func (s *Sandbox) thaw(ctx context.Context, fr runtime.Freezer, left time.Duration) error {
	began := time.Now()
	if err := fr.Thaw(context.WithoutCancel(ctx), s.ID); err != nil {
		return apierr.Wrap(err, apierr.Internal, "could not resume sandbox %s; it stays paused", s.ID)
	}
	s.mu.Lock()
	if s.state != StatePaused {
		s.mu.Unlock()
		return s.running()
	}
	s.agent = newAgentClient(s.inst, s.m.agentCall, s.m.log.With("sandbox", s.ID))
	s.frozen = false
	s.mu.Unlock()
	if err := s.tellLifetime(context.WithoutCancel(ctx), left); err != nil {
		return err // the agent is gone: tellLifetime's gone stopped it
	}
	now := time.Now()
	s.mu.Lock()
	if s.state != StatePaused {
		s.mu.Unlock()
		return s.running()
	}
	s.state = StateRunning
	s.deadline = now.Add(left)
	s.timer.Reset(left)
	s.lastActive = now
	s.mu.Unlock()
	took := time.Since(began)
	s.m.log.Info("sandbox thawed", "sandbox", s.ID, "took", took.Round(10*time.Microsecond))
	s.emit(events.SandboxResumed, "", map[string]any{"took_ms": took.Milliseconds(), "memory": "kept"})
	return nil
}

// ready fails unless the sandbox can take work; a paused sandbox is
// resumed first.
func (s *Sandbox) ready(ctx context.Context) error {
	if s.State() == StatePaused {
		if err := s.Resume(ctx); err != nil {
			return err
		}
	}
	return s.running()
}

// removeCheckpoint removes a stopped sandbox's checkpoint, if it had one.
func (m *Manager) removeCheckpoint(id string) {
	if m.cfg.CheckpointDir == "" {
		return
	}
	if err := os.RemoveAll(m.checkpointPath(id)); err != nil {
		m.log.Warn("remove a stopped sandbox's checkpoint", "sandbox", id, "err", err)
	}
}

// removeCheckpoints removes every checkpoint left by an earlier engine
// but those of the paused sandboxes taken back (kept): the others'
// sandboxes are destroyed at start (reconcile), and their checkpoints
// hold their memory.
func (m *Manager) removeCheckpoints(kept map[string]bool) {
	if m.cfg.CheckpointDir == "" {
		return
	}
	left, err := os.ReadDir(m.cfg.CheckpointDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Error("list checkpoints left over from an earlier run", "err", err)
	}
	left = slices.DeleteFunc(left, func(e os.DirEntry) bool { return kept[e.Name()] })
	for _, e := range left {
		if err := os.RemoveAll(filepath.Join(m.cfg.CheckpointDir, e.Name())); err != nil {
			m.log.Error("remove a checkpoint left over from an earlier run", "checkpoint", e.Name(), "err", err)
		}
	}
	if len(left) > 0 {
		m.log.Warn("removed checkpoints left over from an earlier run", "count", len(left))
	}
}

// pausedErr is the error of a call that a pause cut off.
func (s *Sandbox) pausedErr(err error) error {
	return apierr.Wrap(fmt.Errorf("%w: %w", ErrPaused, err), apierr.SandboxState, "sandbox %s was paused", s.ID)
}
