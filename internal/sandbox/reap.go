package sandbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/backoff"
)

// A crash must never keep the engine from starting, and a destroy that
// fails must not be forgotten. Both hand the sandbox's id to reap, which
// destroys it in the background, retrying with a doubling, jittered
// backoff (internal/backoff: Config.RetryInterval up to maxRetryInterval)
// until the runtime reports it gone or the Manager closes; Leftovers lists what is still pending.
// Whatever is left at Close stays in the runtime, which lists it to the
// next engine's reconcile.

// reconcileWait bounds how long New waits for leftovers to be destroyed.
const reconcileWait = 5 * time.Second

// maxRetryInterval caps the backoff between retries of a failed destroy.
const maxRetryInterval = time.Minute

// reconcileParallel bounds concurrent destroys of leftovers at start.
const reconcileParallel = 4

// reconcile destroys every sandbox the runtime holds (left over from an
// earlier engine that crashed) but the paused ones taken back (kept). It waits at most reconcileWait; failures
// and destroys still running then go on in the background.
func (m *Manager) reconcile(ctx context.Context, kept map[string]bool) {
	all, err := m.cfg.Runtime.List(ctx)
	if err != nil {
		m.log.Error("cannot list sandboxes left over from an earlier run", "err", err)
		return
	}
	var ids []string
	for _, id := range all {
		if !kept[id] {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	m.log.Warn("destroying sandboxes left over from an earlier run", "count", len(ids), "sandboxes", ids)
	var first sync.WaitGroup
	sem := make(chan struct{}, reconcileParallel)
	m.mu.Lock()
	for _, id := range ids {
		m.leftovers[id] = nil
	}
	m.mu.Unlock()
	for _, id := range ids {
		first.Add(1)
		m.reaps.Go(func() {
			sem <- struct{}{}
			m.leftover(id)
			err := m.destroyID(id)
			<-sem
			first.Done()
			if err == nil {
				m.reaped(id)
				return
			}
			m.log.Error("could not destroy a leftover sandbox; retrying in the background", "sandbox", id, "err", err)
			m.retry(id, err)
		})
	}
	done := make(chan struct{})
	go func() { first.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(reconcileWait):
		m.log.Warn("leftover sandboxes are still being destroyed; starting meanwhile", "pending", m.Leftovers())
	}
}

// leftoverTimeout bounds reading a leftover's usage and Config.Leftover.
const leftoverTimeout = 10 * time.Second

// leftover reads a leftover's usage and tells Config.Leftover, once,
// before its first destroy: the retries find nothing more to tell.
func (m *Manager) leftover(id string) {
	if m.cfg.Leftover == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), leftoverTimeout)
	defer cancel()
	u, err := m.cfg.Runtime.Usage(ctx, id)
	m.cfg.Leftover(ctx, id, u, err)
}

// reap destroys id in the background after a failed destroy (err).
func (m *Manager) reap(id string, err error) {
	m.mu.Lock()
	if _, ok := m.leftovers[id]; ok {
		m.mu.Unlock()
		return // already being retried
	}
	m.leftovers[id] = err
	m.mu.Unlock()
	m.log.Error("could not destroy sandbox; retrying in the background", "sandbox", id, "err", err)
	m.reaps.Go(func() { m.retry(id, err) })
}

// retry destroys id until it succeeds or the Manager closes.
func (m *Manager) retry(id string, err error) {
	retry := backoff.Backoff{Base: m.cfg.RetryInterval, Max: maxRetryInterval}
	wait := retry.Next()
	for attempt := 2; ; attempt++ {
		select {
		case <-m.ctx.Done():
			m.log.Warn("sandbox not destroyed; left to the next start", "sandbox", id, "err", err)
			return
		case <-time.After(wait):
		}
		if err = m.destroyID(id); err == nil {
			m.log.Info("sandbox destroyed after retrying", "sandbox", id, "attempts", attempt)
			m.reaped(id)
			return
		}
		m.mu.Lock()
		m.leftovers[id] = err
		m.mu.Unlock()
		wait = retry.Next()
		m.log.Warn("destroy failed again", "sandbox", id, "err", err, "retry_in", wait)
	}
}

func (m *Manager) destroyID(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	return m.cfg.Runtime.Destroy(ctx, id)
}

func (m *Manager) reaped(id string) {
	m.mu.Lock()
	delete(m.leftovers, id)
	m.mu.Unlock()
	m.releaseRoot(id)
}

// Leftovers lists the sandboxes the Manager is still trying to destroy in
// the background (left over from a crash, or whose destroy failed), sorted.
func (m *Manager) Leftovers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.leftovers))
	for id := range m.leftovers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
