package server

import (
	"context"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Paused sandboxes across a restart.
//
// The store records a sandbox paused (store.SandboxPaused, with the
// deadline its lifetime left gives it now) as the engine begins its pause
// (the Pausing hook), and running again once it runs (Resumed: a resume,
// or a pause that failed). StopAllRunning, at a server's start and
// shutdown, leaves paused records. The engine of a server keeps paused
// sandboxes across its own end (sandbox.Config.KeepPaused, on the same
// data dir) and takes them back at its start; New then holds each again
// for its recorded owner (takeBackPaused), and records stopped, with why,
// those recorded paused that the engine could not take back (a crash in
// the middle of a pause, a checkpoint lost or broken). The freezer's
// quick pause keeps the memory in the server's process tree: it is not
// recorded paused and does not survive a restart.

// admitPause is the engine's AdmitPause hook (Config.MaxPausedPerAccount):
// the sandbox being paused counts itself, and every other of its
// account's sandboxes paused or being paused counts too, so that
// concurrent pauses never pass the bound together.
func (s *Server) admitPause(sb *sandbox.Sandbox) error {
	s.mu.Lock()
	owner := ""
	if b, ok := s.boxes[sb.ID]; ok {
		owner = b.owner
	}
	var mine []*sandbox.Sandbox
	for _, b := range s.boxes {
		if b.sb != nil && b.owner == owner {
			mine = append(mine, b.sb)
		}
	}
	s.mu.Unlock()
	paused := 0
	for _, m := range mine {
		if m.State() == sandbox.StatePaused { // frozen ones too
			paused++
		}
	}
	if owner != "" && paused > s.cfg.MaxPausedPerAccount {
		return apierr.New(apierr.SessionQuotaExceeded, "the account has %d sandboxes paused, its most (--max-paused-per-account); resume or kill one first",
			s.cfg.MaxPausedPerAccount)
	}
	return nil
}

// pauseRecordTimeout bounds recording a pause or a resume.
const pauseRecordTimeout = 10 * time.Second

// sandboxPausing is the engine's Pausing hook.
func (s *Server) sandboxPausing(sb *sandbox.Sandbox) {
	if !s.cfg.NoAccounting {
		s.meter.Pause(sb)
	}
	s.recordPaused(sb, true)
}

// sandboxResumed is the engine's Resumed hook.
func (s *Server) sandboxResumed(sb *sandbox.Sandbox) {
	if !s.cfg.NoAccounting {
		s.meter.Resume(sb)
	}
	s.recordPaused(sb, false)
}

// recordPaused records sb paused or running again.
func (s *Server) recordPaused(sb *sandbox.Sandbox, paused bool) {
	if s.store == nil || s.shared() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), pauseRecordTimeout)
	defer cancel()
	err := s.store.SetSandboxPaused(ctx, sb.ID, paused, sb.Deadline())
	if err != nil && !errors.Is(err, store.ErrNotFound) { // not one of ours: the engine used directly
		s.log.Error("record a sandbox paused or resumed", "sandbox", sb.ID, "paused", paused, "err", err)
	}
}

// lostPaused is the stop reason of a sandbox recorded paused that the
// engine did not take back at the server's start.
const lostPaused = "its checkpoint did not survive the server's restart"

// takeBackPaused holds again, for their owners, the paused sandboxes the
// engine took back at its start, and records stopped those recorded
// paused that it did not. An engine's sandbox with no live record of its
// own is destroyed.
func (s *Server) takeBackPaused(ctx context.Context) {
	if s.store == nil || s.shared() {
		return
	}
	recs, err := s.store.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true, State: store.SandboxPaused})
	if err != nil {
		s.log.Error("list paused sandboxes", "err", err)
		return
	}
	lost := s.engine.Lost()
	for _, rec := range recs {
		sb, err := s.engine.Get(rec.ID)
		if err != nil || sb.State() != sandbox.StatePaused {
			reason := lostPaused
			if why := lost[rec.ID]; why != "" {
				reason += " (" + why + ")"
			}
			s.log.Warn("a sandbox recorded paused was not kept; recording it stopped", "sandbox", rec.ID, "reason", reason)
			if err := s.store.StopSandbox(ctx, rec.ID, reason, time.Now()); err != nil {
				s.log.Error("record a lost paused sandbox stopped", "sandbox", rec.ID, "err", err)
			}
			continue
		}
		if err := s.holdPaused(ctx, sb, rec); err != nil {
			s.log.Error("take back a paused sandbox; destroying it", "sandbox", rec.ID, "err", err)
			_ = s.engine.Kill(ctx, rec.ID)
			_ = s.store.StopSandbox(ctx, rec.ID, lostPaused+" ("+err.Error()+")", time.Now())
		}
	}
	for _, info := range s.engine.List() {
		s.mu.Lock()
		_, held := s.boxes[info.ID]
		s.mu.Unlock()
		if !held {
			s.log.Warn("the engine kept a paused sandbox this server has no paused record of; destroying it", "sandbox", info.ID)
			_ = s.engine.Kill(ctx, info.ID)
		}
	}
}

// holdPaused holds a paused sandbox the engine took back for the owner
// its record names, as a create does: its box, its account's slot, its
// metering (standing still until it resumes).
func (s *Server) holdPaused(ctx context.Context, sb *sandbox.Sandbox, rec store.Sandbox) error {
	var res recordResources
	if err := unmarshalObject(rec.Resources, &res); err != nil {
		return err
	}
	limits := runtime.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20, Pids: res.Pids}
	b := &box{sb: sb, owner: rec.Owner, execTimeout: time.Duration(res.MaxExecutionMS) * time.Millisecond, footprint: s.engine.Footprint(limits)}
	if !s.cfg.NoAccounting {
		a, err := s.accounts.Get(ctx, rec.Owner)
		if err != nil {
			return err
		}
		a.HoldSandbox()
		s.started(sb, a)
		s.meter.Pause(sb)
	}
	s.mu.Lock()
	s.boxes[rec.ID] = b
	s.mu.Unlock()
	if res.E2B != nil {
		s.e2b.Adopted(rec.ID, *res.E2B)
	}
	s.log.Info("paused sandbox held again after the restart", "sandbox", rec.ID, "owner", rec.Owner)
	return nil
}
