package sandbox

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
)

// Auto-pause (CreateOptions.AutoPause).
//
// A sandbox created with AutoPause is paused (Pause: checkpointed to disk)
// instead of stopped when its lifetime ends, or when Config.IdleTimeout
// passes with nothing done, but only once it is idle: no request in
// flight (an execution, a command, a file call), none made, no preview
// traffic (a connection opened by DialPort, or bytes through one) and
// under autoBusyCPU of a CPU used by its processes, for the last
// Config.AutoPauseNotice (at least one sampling interval). A sandbox
// found active when its time comes runs on for another notice period
// (its lifetime, the agent's backstop included, moves by as much: it is
// metered as running) and is asked again then; so a sandbox serving a
// page or crunching numbers is never paused under its user. Put-offs end
// Config.MaxTimeout after the pause was first due, so that no sandbox
// outlives the longest lifetime by staying busy: it is then paused as it
// is (CPU in use or preview traffic notwithstanding), or stopped as
// without auto-pause if a request of it is still in flight.
//
// sandbox.pausing (pause_at, reason: timeout or idle) is sent
// AutoPauseNotice before the pause is due, and again each time an active
// sandbox puts it off. The pause itself is the one of the API, with its
// refusals: one refused (the account's bound on paused sandboxes or their
// bytes, a checkpoint that failed) stops the sandbox as if it
// had not asked for auto-pause (stop reason "timed out" or "idle", the
// refusal in the log). A
// resume gives an auto-paused sandbox the lifetime it was created with,
// from the resume on (E2B's connect then extends it to its own timeout).
//
// The engine keeps the decision: the samples come from the sandbox's
// cgroup (runtime.Usage) and the engine's own count of requests and
// preview connections, none from code inside the sandbox.

// autoState is a sandbox's auto-pause state; Sandbox.mu guards it but
// traffic (atomic) and handling (atomic).
type autoState struct {
	on   bool
	life time.Duration // the lifetime a resume gives after an auto-pause
	// noticed is the due time sandbox.pausing was last sent for.
	noticed time.Time
	// cpu and cpuAt are the cgroup's CPUNanos at the last sample.
	cpu   uint64
	cpuAt time.Time
	// active is the last activity the samples saw (CPU in use, requests
	// in flight).
	active time.Time
	// putOff is when the pause now put off was first due (zero: none
	// put off): put-offs end Config.MaxTimeout after it.
	putOff time.Time
	// traffic is the last preview read or write, in UnixNano.
	traffic atomic.Int64
	// handling is set while a due pause is decided, so that the timer
	// and the loop never decide it twice at once.
	handling atomic.Bool
}

// autoBusyCPU is the share of one CPU over a sampling interval above
// which a sandbox counts as working (a Python kernel at rest uses far
// less; a loop or a server answering uses far more).
const autoBusyCPU = 0.05

// DefaultAutoPauseNotice is how long before an auto-pause sandbox.pausing
// is sent when Config.AutoPauseNotice is zero.
const DefaultAutoPauseNotice = 30 * time.Second

// autoTick is how often the auto-pause loop samples auto-pause sandboxes.
func (m *Manager) autoTick() time.Duration {
	return min(max(m.cfg.AutoPauseNotice/4, 50*time.Millisecond), time.Second)
}

// autoWindow is how long an auto-pause sandbox must have been idle to be
// paused: the notice, at least two samples.
func (m *Manager) autoWindow() time.Duration {
	return max(m.cfg.AutoPauseNotice, 2*m.autoTick())
}

// Create starts a sandbox and returns once its agent answers.
func (m *Manager) Create(ctx context.Context, opt CreateOptions) (*Sandbox, error) {
	if opt.AutoPause {
		if _, err := m.checkpointer(); err != nil {
			return nil, apierr.Wrap(err, apierr.From(err).Code, "auto_pause: %s", apierr.From(err).Message)
		}
	}
	s, err := m.create(ctx, opt)
	if err != nil || !opt.AutoPause {
		return s, err
	}
	now := time.Now()
	s.mu.Lock()
	s.auto.on = true
	s.auto.life = time.Until(s.deadline)
	if s.auto.life <= 0 {
		s.auto.life = m.cfg.DefaultTimeout
	}
	s.auto.active = now
	s.mu.Unlock()
	m.startAutoLoop()
	return s, nil
}

// AutoPause reports whether the sandbox pauses instead of stopping at
// the end of its lifetime or on idle.
func (s *Sandbox) AutoPause() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auto.on
}

// startAutoLoop starts the auto-pause loop once.
func (m *Manager) startAutoLoop() {
	m.autoOnce.Do(func() { go m.autoLoop() })
}

// autoLoop samples every running auto-pause sandbox each autoTick: its
// CPU, its requests; it sends sandbox.pausing when a pause comes within
// the notice, and pauses those idle past Config.IdleTimeout (the
// lifetime's end is the timer's: expire).
func (m *Manager) autoLoop() {
	t := time.NewTicker(m.autoTick())
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		all := slices.Collect(maps.Values(m.sandboxes))
		m.mu.Unlock()
		for _, s := range all {
			if !s.AutoPause() {
				continue
			}
			ctx, cancel := context.WithTimeout(m.ctx, idleCheckTimeout)
			due, why, ok := s.autoSample(ctx, time.Now())
			cancel()
			if ok && why == reasonIdle && !time.Now().Before(due) {
				go m.autoPauseDue(s, reasonIdle)
			}
		}
	}
}

// reasonIdle is the stop reason of a sandbox the idle timeout ended.
const reasonIdle = "idle"

// autoSample samples s's activity at now and sends sandbox.pausing when
// its pause is due within the notice. It returns when the pause is due
// and why (reasonTimeout or reasonIdle); ok is false for a sandbox not
// running.
func (s *Sandbox) autoSample(ctx context.Context, now time.Time) (due time.Time, why string, ok bool) {
	u, err := s.usage(ctx)
	s.mu.Lock()
	if s.state != StateRunning {
		s.mu.Unlock()
		return time.Time{}, "", false
	}
	a := &s.auto
	if err == nil {
		if !a.cpuAt.IsZero() && u.CPUNanos >= a.cpu {
			if el := now.Sub(a.cpuAt); el > 0 && float64(u.CPUNanos-a.cpu) > autoBusyCPU*float64(el.Nanoseconds()) {
				a.active = now
			}
		}
		a.cpu, a.cpuAt = u.CPUNanos, now
	}
	if s.busy > 0 {
		a.active = now
	}
	last := s.lastSeenLocked()
	due, why = s.deadline, reasonTimeout
	if it := s.m.cfg.IdleTimeout; it > 0 && last.Add(it).Before(due) {
		due, why = last.Add(it), reasonIdle
	}
	send := !now.Before(due.Add(-s.m.cfg.AutoPauseNotice)) && !a.noticed.Equal(due)
	if send {
		a.noticed = due
	}
	s.mu.Unlock()
	if send {
		s.emit(events.SandboxPausing, "", map[string]any{"pause_at": due.UTC().Format(time.RFC3339Nano), "reason": why,
			"notice_ms": max(due.Sub(now), 0).Milliseconds()})
	}
	return due, why, true
}

// lastSeenLocked is the last activity of s: a request, a preview
// connection or its bytes, CPU in use. s.mu is held.
func (s *Sandbox) lastSeenLocked() time.Time {
	last := s.lastActive
	if s.auto.active.After(last) {
		last = s.auto.active
	}
	if t := s.auto.traffic.Load(); t > 0 && time.Unix(0, t).After(last) {
		last = time.Unix(0, t)
	}
	return last
}

// expireAuto is expire's part for an auto-pause sandbox: it reports
// whether it took the sandbox's lifetime end over.
func (m *Manager) expireAuto(s *Sandbox) bool {
	if !s.AutoPause() {
		return false
	}
	m.autoPauseDue(s, reasonTimeout)
	return true
}

// autoPauseDue pauses s if it has been idle for the auto-pause window,
// else puts the pause off by the notice; a pause refused for any reason
// but a request that just began stops s (why: its stop reason).
func (m *Manager) autoPauseDue(s *Sandbox, why string) {
	if !s.auto.handling.CompareAndSwap(false, true) {
		return
	}
	defer s.auto.handling.Store(false)
	ctx, cancel := context.WithTimeout(m.ctx, destroyTimeout)
	defer cancel()
	now := time.Now()
	sctx, scancel := context.WithTimeout(ctx, idleCheckTimeout)
	s.autoSample(sctx, now)
	scancel()
	s.mu.Lock()
	st, busy, last, life := s.state, s.busy, s.lastSeenLocked(), s.auto.life
	overdue := !s.auto.putOff.IsZero() && now.Sub(s.auto.putOff) >= m.cfg.MaxTimeout
	early := why == reasonTimeout && now.Before(s.deadline) // moved as the timer fired
	idleGone := why == reasonIdle && now.Sub(last) < m.cfg.IdleTimeout
	s.mu.Unlock()
	if st != StateRunning || early || idleGone {
		return
	}
	window := m.autoWindow()
	if (busy > 0 || now.Sub(last) < window) && !overdue {
		m.putOff(ctx, s, why, window)
		return
	}
	// The lifetime a resume gives, told to the agent too (its backstop
	// must not end the sandbox while it is being paused).
	if err := s.extendLife(ctx, life); err != nil {
		m.log.Warn("auto-pause: set the lifetime a resume gives", "sandbox", s.ID, "err", err)
		_ = m.destroy(s, why)
		return
	}
	err := s.Pause(ctx)
	switch {
	case err == nil:
		s.mu.Lock()
		s.auto.putOff = time.Time{}
		s.mu.Unlock()
		m.log.Info("sandbox auto-paused", "sandbox", s.ID, "reason", why, "overdue", overdue)
		return
	case apierr.From(err).Code == apierr.SandboxState && s.State() == StateRunning && !overdue:
		// A request began as the pause did: it is active after all.
		m.putOff(ctx, s, why, window)
		return
	}
	m.log.Warn("auto-pause refused; stopping the sandbox as without auto-pause", "sandbox", s.ID, "reason", why, "err", err)
	_ = m.destroy(s, why)
}

// putOff gives an active auto-pause sandbox whose pause was due another
// window of life; the next sample sends sandbox.pausing again.
func (m *Manager) putOff(ctx context.Context, s *Sandbox, why string, window time.Duration) {
	if why != reasonTimeout {
		return // the idle timeout's: the next sample decides again; the lifetime stands
	}
	s.mu.Lock()
	if s.auto.putOff.IsZero() {
		s.auto.putOff = time.Now()
	}
	s.mu.Unlock()
	if err := s.extendLife(ctx, window); err != nil {
		m.log.Warn("auto-pause: put off", "sandbox", s.ID, "err", err)
		_ = m.destroy(s, why)
		return
	}
	m.log.Info("auto-pause put off: the sandbox is active", "sandbox", s.ID, "reason", why, "for", window)
}

// extendLife moves a running sandbox's deadline (the agent's first) to
// d from now, without counting as activity (SetTimeout does).
func (s *Sandbox) extendLife(ctx context.Context, d time.Duration) error {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if err := s.running(); err != nil {
		return err
	}
	if err := s.tellLifetime(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning {
		return errors.New("the sandbox stopped")
	}
	s.deadline = time.Now().Add(d)
	s.timer.Reset(d)
	return nil
}

// activeConn is a preview connection (DialPort) whose bytes count as the
// sandbox's activity.
type activeConn struct {
	net.Conn
	s *Sandbox
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.s.auto.traffic.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.s.auto.traffic.Store(time.Now().UnixNano())
	}
	return n, err
}

// CloseWrite passes a half-close on, as the connection under it does.
func (c *activeConn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return errors.ErrUnsupported
}
