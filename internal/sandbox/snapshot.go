package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Snapshots and clones (runtime.Snapshotter).
//
// Snapshot saves a running sandbox's processes (memory included) and
// files into a directory while the sandbox runs on: for the moment of it
// the sandbox is as during a pause (state paused, lifetime standing
// still, every connection to its agent closed, requests waiting for it
// to end as they wait for a resume), then it runs again with the time it
// had left. It refuses, leaving the sandbox as it was, what a pause
// refuses: a request in flight (ERR_SANDBOX_STATE), a runtime that
// cannot (ERR_NOT_SUPPORTED). A paused sandbox is not snapshotted
// (ERR_SANDBOX_STATE): resume it first. A sandbox with a network has its
// gateway detached for the dump and attached again after it, as a pause
// does (network.go): the connections it had open through the gateway
// are closed by a snapshot (and a fork), its policy, names and counts
// stay.
//
// Create with CreateOptions.Snapshot starts a new sandbox from such a
// directory (the runtime's Clone): a new id, host id range, cgroups and
// agent, the snapshot's processes and files. The caller gives the options
// the snapshotted sandbox was made with (its template, limits, policy,
// environment): the engine records none of them in the directory. The
// sandbox never comes from the warm pool. A clone whose policy has a
// network (the snapshotted sandbox's) gets a gateway of its own, new
// (no request counted, no name resolved), with that policy, attached by
// the runtime's Clone to the restored processes' namespace; its secret
// rules resolve as the clone's (the account's secrets, by its own id).
// Neither the snapshot nor the clone ever held a secret's value: the
// gateway, a host object, puts them into requests.

// snapshotter returns the runtime's Snapshotter, or why there is none.
func (m *Manager) snapshotter() (runtime.Snapshotter, error) {
	sn, ok := m.cfg.Runtime.(runtime.Snapshotter)
	if !ok || m.cfg.Shared {
		return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) cannot snapshot sandboxes", m.cfg.Runtime.Name())
	}
	return sn, nil
}

// SnapshotDir is where the engine's snapshots are kept ("": none).
func (m *Manager) SnapshotDir() string { return m.cfg.SnapshotDir }

// CanSnapshot reports whether the engine can snapshot sandboxes at all.
func (m *Manager) CanSnapshot() bool {
	_, err := m.snapshotter()
	return err == nil
}

// Snapshot saves the sandbox's processes, memory and files to dir (which
// must not exist) while it runs on.
func (s *Sandbox) Snapshot(ctx context.Context, dir string) error {
	sn, err := s.m.snapshotter()
	if err != nil {
		return err
	}
	if err := s.dumpableNet(); err != nil {
		return err
	}
	if err := s.noDevices("snapshotted or forked"); err != nil {
		return err
	}
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	left, err := s.stopLife()
	if err != nil {
		return err
	}
	if left == 0 {
		return apierr.New(apierr.SandboxState, "sandbox %s is paused: resume it before a snapshot", s.ID)
	}
	s.mu.Lock()
	agent := s.agent
	s.mu.Unlock()
	agent.conns.closeAll() // an open connection fails the dump
	s.detachNet()          // and so does the network's TUN
	began := time.Now()
	err = sn.Snapshot(context.WithoutCancel(ctx), s.ID, dir)
	if err != nil && !errors.Is(err, runtime.ErrUnsupported) {
		// As a pause's dump (pause.go): CRIU sometimes cannot seize a
		// task caught by the freezer as it forks or exits; a failed
		// snapshot left the sandbox running and removed its directory,
		// and a second attempt finds it past that.
		s.m.log.Warn("snapshot failed; trying once more", "sandbox", s.ID, "err", err)
		err = sn.Snapshot(context.WithoutCancel(ctx), s.ID, dir)
	}
	s.runAgain(left)
	s.mu.Lock()
	inst := s.inst
	s.mu.Unlock()
	s.reattachNet(inst)
	if errors.Is(err, runtime.ErrUnsupported) {
		return apierr.Wrap(err, apierr.NotSupported, "sandbox %s cannot be snapshotted: %v", s.ID, err)
	}
	if err != nil {
		return apierr.Wrap(err, apierr.Internal, "could not snapshot sandbox %s; it runs on", s.ID)
	}
	s.m.log.Info("sandbox snapshotted", "sandbox", s.ID, "took", time.Since(began).Round(10*time.Microsecond))
	return nil
}

// runAgain makes a sandbox that stopLife stopped for a snapshot run
// again, with the lifetime it had left and a new agent client (the old
// one's connections were closed); lifeMu is held.
func (s *Sandbox) runAgain(left time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StatePaused {
		return // stopped meanwhile
	}
	now := time.Now()
	s.agent = newAgentClient(s.inst, s.m.agentCall, s.m.log.With("sandbox", s.ID))
	s.state = StateRunning
	s.deadline = now.Add(left)
	s.timer.Reset(left)
	s.lastActive = now
}

// startFrom starts sandbox spec.ID from the snapshot in dir (Create
// with CreateOptions.Snapshot).
func (m *Manager) startFrom(ctx context.Context, spec runtime.Spec, dir string) (*runtime.Instance, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return nil, err
	}
	return sn.Clone(ctx, spec, dir)
}

// Changes lists the files the sandbox added, changed and deleted since
// the snapshot in dir it was started from (runtime.Differ): its writable
// layer against the snapshot's.
func (s *Sandbox) Changes(ctx context.Context, dir string) (runtime.Changes, error) {
	d, ok := s.m.cfg.Runtime.(runtime.Differ)
	if !ok || s.m.cfg.Shared {
		return runtime.Changes{}, apierr.New(apierr.NotSupported, "this server's runtime (%s) cannot compare sandboxes' files", s.m.cfg.Runtime.Name())
	}
	if err := s.running(); err != nil && s.State() != StatePaused {
		return runtime.Changes{}, err
	}
	lower, err := s.root, error(nil) // the root it runs on, not the template's newest
	if lower == "" {
		lower, err = s.m.cfg.Templates.RootFS(s.Template)
	}
	if err != nil {
		return runtime.Changes{}, apierr.Wrap(err, apierr.TemplateNotFound, "template %q is not available: %v", s.Template, err)
	}
	ch, err := d.Changes(ctx, s.ID, dir, lower)
	if err != nil {
		return ch, apierr.Wrap(err, apierr.Internal, "could not compare sandbox %s's files", s.ID)
	}
	return ch, nil
}
