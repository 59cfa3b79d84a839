package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Snapshot pools: clones of a snapshot (snapshot.go) restored ahead of
// need, so that a create from the snapshot takes one instead of waiting
// for the restore.
//
// SetSnapshotPool(key, opt, n) keeps n clones of the snapshot opt.Snapshot
// ready under key (the caller's name for one owner's snapshot: the engine
// knows neither). A filler restores them one at a time in the background.
// A member is as a warm pool member (pool.go): invisible until handed out
// (not in the Manager's table, not counted by MaxSandboxes: the caller
// bounds n), its agent given a lease it renews; a create with
// CreateOptions.SnapshotPool set to key takes the oldest, which becomes
// the caller's sandbox from then on (its Created time, lifetime timer,
// metadata, owner and announcement start at the hand-out) and is never
// returned. Each member is a clone of its own (its id, host id range,
// cgroups, writable layer): no two creates share one. A create that
// finds the pool empty restores on its path as without a pool.
//
// SetSnapshotPool(key, _, 0) destroys the members and forgets the pool;
// Close destroys every member.

// snapPool is one snapshot's pool.
type snapPool struct {
	opt    CreateOptions // what a member is made with (Snapshot set)
	pol    policyState
	limits runtime.Limits
	size   int

	ready []*Sandbox // oldest first
	wake  chan struct{}
	stop  context.CancelFunc
	done  chan struct{}
}

// snapPools are the engine's snapshot pools.
type snapPools struct {
	mu    sync.Mutex
	pools map[string]*snapPool
}

// SetSnapshotPool keeps size clones of the snapshot opt.Snapshot restored
// ahead under key (size 0: none, and the pool is gone). opt are the
// options a create from the snapshot would give (snapshot.go).
func (m *Manager) SetSnapshotPool(key string, opt CreateOptions, size int) error {
	if size < 0 {
		return apierr.New(apierr.BadRequest, "size must be 0 or more; got %d", size)
	}
	var old *snapPool
	var members []*Sandbox
	m.snaps.mu.Lock()
	if p := m.snaps.pools[key]; p != nil && (size == 0 || p.opt.Snapshot != opt.Snapshot) {
		old, members = p, p.ready
		delete(m.snaps.pools, key)
	}
	if size == 0 {
		m.snaps.mu.Unlock()
		return m.dropSnapPool(old, members)
	}
	if p := m.snaps.pools[key]; p != nil {
		p.size = size
		extra := max(0, len(p.ready)-size)
		members = append(members, p.ready[:extra]...)
		p.ready = p.ready[extra:]
		m.snaps.mu.Unlock()
		signalChan(p.wake)
		return m.dropSnapPool(old, members)
	}
	m.snaps.mu.Unlock()
	if err := m.dropSnapPool(old, members); err != nil {
		return err
	}
	if _, err := m.snapshotter(); err != nil {
		return err
	}
	kpol, err := applyCreatePolicy(&opt)
	if err != nil {
		return err
	}
	if eg, err := policy.CompileEgress(opt.Policy.NetworkPolicy()); err != nil || eg.Enabled() {
		return apierr.New(apierr.NotSupported, "a sandbox with a network cannot start from a snapshot")
	}
	g, err := m.Grant(opt, Ceiling{})
	if err != nil {
		return err
	}
	opt.Timeout = g.Timeout
	ctx, cancel := context.WithCancel(m.ctx)
	p := &snapPool{opt: opt, pol: policyState{pol: opt.Policy, kernel: kpol, gen: 1}, limits: g.Limits, size: size,
		wake: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	m.snaps.mu.Lock()
	if m.snaps.pools == nil {
		m.snaps.pools = map[string]*snapPool{}
	}
	if q := m.snaps.pools[key]; q != nil { // set meanwhile: ours wins
		old, members = q, q.ready
	} else {
		old, members = nil, nil
	}
	m.snaps.pools[key] = p
	m.snaps.mu.Unlock()
	go m.fillSnapPool(ctx, key, p)
	return m.dropSnapPool(old, members)
}

// SnapshotPoolReady is how many members of key's pool are ready.
func (m *Manager) SnapshotPoolReady(key string) int {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	if p := m.snaps.pools[key]; p != nil {
		return len(p.ready)
	}
	return 0
}

// dropSnapPool stops p's filler (nil: none) and destroys members.
func (m *Manager) dropSnapPool(p *snapPool, members []*Sandbox) error {
	if p != nil {
		p.stop()
		<-p.done
		// The filler may have added one as it stopped (members may
		// share p.ready's array: copied first).
		members = slices.Clone(members)
		m.snaps.mu.Lock()
		for _, s := range p.ready {
			if !slices.Contains(members, s) {
				members = append(members, s)
			}
		}
		p.ready = nil
		m.snaps.mu.Unlock()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(members))
	for i, s := range members {
		wg.Go(func() { errs[i] = m.destroy(s, reasonShutdown) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeSnapPools destroys every snapshot pool's members (Close).
func (m *Manager) closeSnapPools() error {
	m.snaps.mu.Lock()
	pools := m.snaps.pools
	m.snaps.pools = nil
	m.snaps.mu.Unlock()
	var errs []error
	for _, p := range pools {
		m.snaps.mu.Lock()
		members := p.ready
		m.snaps.mu.Unlock()
		errs = append(errs, m.dropSnapPool(p, members))
	}
	return errors.Join(errs...)
}

// fillSnapPool keeps p at its size until ctx ends, renewing its members'
// leases.
func (m *Manager) fillSnapPool(ctx context.Context, key string, p *snapPool) {
	defer close(p.done)
	renew := time.NewTicker(poolLease / 4)
	defer renew.Stop()
	fails := 0
	for ctx.Err() == nil {
		m.snaps.mu.Lock()
		want := len(p.ready) < p.size
		m.snaps.mu.Unlock()
		if want {
			s, err := m.startSnapMember(ctx, p)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				fails++
				wait := min(time.Duration(fails)*time.Second, time.Minute)
				m.log.Warn("snapshot pool: could not restore a member", "pool", key, "err", err, "retry", wait)
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
				continue
			}
			fails = 0
			m.snaps.mu.Lock()
			p.ready = append(p.ready, s)
			m.snaps.mu.Unlock()
			continue
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		case <-renew.C:
			m.renewSnapPool(ctx, p)
		}
	}
}

// renewSnapPool renews p's members' leases, dropping those whose agent
// no longer answers.
func (m *Manager) renewSnapPool(ctx context.Context, p *snapPool) {
	m.snaps.mu.Lock()
	all := append([]*Sandbox(nil), p.ready...)
	m.snaps.mu.Unlock()
	for _, s := range all {
		s.lifeMu.Lock()
		var err error
		if s.State() == StateStarting {
			err = s.tellLifetime(ctx, poolLease)
		}
		s.lifeMu.Unlock()
		if err != nil && ctx.Err() == nil {
			m.log.Warn("snapshot pool: member lost", "sandbox", s.ID, "err", err)
			_ = m.destroy(s, reasonFailed)
		}
	}
	m.snaps.mu.Lock()
	p.ready = slices.DeleteFunc(p.ready, func(s *Sandbox) bool { return s.State() != StateStarting })
	m.snaps.mu.Unlock()
}

// startSnapMember restores one member of p.
func (m *Manager) startSnapMember(ctx context.Context, p *snapPool) (*Sandbox, error) {
	opt := p.opt
	rootfs, err := m.cfg.Templates.RootFS(opt.Template)
	if err != nil {
		return nil, err
	}
	env, err := envList(opt.Env)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{ID: newID(), Template: opt.Template, Limits: p.limits, ReadOnly: opt.ReadOnly, Env: opt.Env, m: m,
		state: StateStarting, pooled: true, created: make(chan struct{})}
	s.project = m.projectOf(opt.Template, rootfs, nil)
	m.log.Info("snapshot pool: restoring a member", "sandbox", s.ID, "template", opt.Template)
	spec := runtime.Spec{ID: s.ID, Template: opt.Template, RootFS: rootfs, Limits: p.limits, ReadOnly: opt.ReadOnly,
		Env: append(threadEnv(p.limits, opt.Env), env...), WritablePaths: opt.Policy.WritablePaths(),
		Lifetime: poolLease + lifetimeGrace}
	s.root = rootfs
	if err := m.holdRoot(s.ID, rootfs); err != nil {
		close(s.created)
		return nil, err
	}
	inst, err := m.startFrom(ctx, spec, opt.Snapshot)
	close(s.created)
	if err != nil {
		_ = m.destroy(s, reasonFailed)
		return nil, fmt.Errorf("restore: %w", err)
	}
	s.agent, s.inst = newAgentClient(inst, m.agentCall, m.log.With("sandbox", inst.ID)), inst
	if err := s.waitAgent(ctx, m.cfg.AgentTimeout, poolLease); err != nil {
		_ = m.destroy(s, reasonFailed)
		return nil, fmt.Errorf("agent: %w", err)
	}
	return s, nil
}

// fromSnapPool hands out a member of opt.SnapshotPool's pool, or reports
// a miss (ok false).
func (m *Manager) fromSnapPool(ctx context.Context, opt CreateOptions) (*Sandbox, bool, error) {
	m.snaps.mu.Lock()
	p := m.snaps.pools[opt.SnapshotPool]
	var s *Sandbox
	if p != nil && p.opt.Snapshot == opt.Snapshot {
		for len(p.ready) > 0 && s == nil {
			if p.ready[0].State() == StateStarting {
				s = p.ready[0]
			}
			p.ready = p.ready[1:]
		}
	}
	m.snaps.mu.Unlock()
	if s == nil {
		return nil, false, nil
	}
	signalChan(p.wake)
	if opt.Timeout == 0 {
		opt.Timeout = p.opt.Timeout
	}
	if opt.Env == nil {
		opt.Env = p.opt.Env
	}
	return m.handOut(ctx, s, opt, p.pol, func(s *Sandbox) { _ = m.destroy(s, reasonShutdown) })
}

func signalChan(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
