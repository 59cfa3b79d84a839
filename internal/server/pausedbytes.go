package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Paused storage per account, and resumes the host admits.
//
// MaxPausedBytesPerAccount bounds what an account's sandboxes paused to
// disk hold on the server's disk: their checkpoints' images and their
// kept disks (sandbox.PausedBytes). A pause is admitted (the engine's
// AdmitPause hook, with the sandbox already counted as paused) when what
// the account's other paused sandboxes hold, plus what this one will
// hold, stays within it; what it will hold is estimated from its cgroup
// before the checkpoint (sandbox.PauseEstimate: the memory charged to it,
// an upper bound of its images, and its disk) and reserved until it
// resumes or stops, so that concurrent pauses each count the others. A
// paused sandbox counts as the larger of its reservation and what it
// holds. A pause past the bound is refused with ERR_STORAGE_QUOTA_EXCEEDED
// and the sandbox runs on as it was.
//
// A resume is admitted (AdmitResume, before anything is restored) when
// the account may run work (its credits, when enforced) and the host's
// memory holds the sandbox beside the running ones; refused, the sandbox
// stays paused as it was (ERR_SESSION_QUOTA_EXCEEDED, ERR_CAPACITY).

// pausedHolds is what each paused sandbox (or one being paused) is
// counted for, by id.
type pausedHolds struct {
	// mu guards est and orders admissions, so that two pauses never
	// pass the bound together.
	mu  sync.Mutex
	est map[string]int64
}

// admitPausing is the engine's AdmitPause hook: the count of paused
// sandboxes (paused.go), then their bytes.
func (s *Server) admitPausing(sb *sandbox.Sandbox) error {
	if s.cfg.MaxPausedPerAccount > 0 {
		if err := s.admitPause(sb); err != nil {
			return err
		}
	}
	if s.cfg.MaxPausedBytesPerAccount > 0 {
		return s.admitPausedBytes(sb)
	}
	return nil
}

// pausedReadTimeout bounds reading what a sandbox holds.
const pausedReadTimeout = 5 * time.Second

// admitPausedBytes admits a pause of sb within its account's bound on
// paused bytes, and reserves what it will hold.
func (s *Server) admitPausedBytes(sb *sandbox.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), pausedReadTimeout)
	defer cancel()
	s.mu.Lock()
	owner := ""
	if b, ok := s.boxes[sb.ID]; ok {
		owner = b.owner
	}
	var others []*sandbox.Sandbox
	for id, b := range s.boxes {
		if b.sb != nil && b.owner == owner && id != sb.ID {
			others = append(others, b.sb)
		}
	}
	s.mu.Unlock()
	if owner == "" {
		return nil // not one of ours (the engine used directly)
	}
	est, err := sb.PauseEstimate(ctx)
	if err != nil {
		// Unread: the most it may hold.
		l := sb.CurrentLimits()
		est = l.MemoryBytes + l.DiskBytes
	}
	h := &s.paused
	h.mu.Lock()
	defer h.mu.Unlock()
	var held int64
	for _, o := range others {
		if o.State() != sandbox.StatePaused {
			continue
		}
		held += max(o.PausedBytes(ctx), h.est[o.ID])
	}
	if limit := s.cfg.MaxPausedBytesPerAccount; held+est > limit {
		return &apierr.Error{Code: apierr.StorageQuotaExceeded, Details: map[string]any{"paused_bytes": held, "needed_bytes": est, "max_bytes": limit},
			Message: fmt.Sprintf("pausing sandbox %s would keep about %d MiB of the account's paused sandboxes on the server's disk, past its %d MiB (--max-paused-mb-per-account; %d MiB held now); it runs on: resume or kill a paused one first",
				sb.ID, (held+est)>>20, limit>>20, held>>20)}
	}
	if h.est == nil {
		h.est = map[string]int64{}
	}
	h.est[sb.ID] = est
	s.mu.Lock()
	for id := range h.est {
		if _, ok := s.boxes[id]; !ok {
			delete(h.est, id) // stopped while paused
		}
	}
	s.mu.Unlock()
	return nil
}

// sandboxResumedHolds is the engine's Resumed hook: the record and the
// meter (paused.go), and the sandbox's reservation of paused bytes goes.
func (s *Server) sandboxResumedHolds(sb *sandbox.Sandbox) {
	s.sandboxResumed(sb)
	s.paused.mu.Lock()
	delete(s.paused.est, sb.ID)
	s.paused.mu.Unlock()
}

// admitResume is the engine's AdmitResume hook: the account must be able
// to run work (credits), and the host's memory must hold the sandbox
// beside the running ones.
func (s *Server) admitResume(sb *sandbox.Sandbox) error {
	if v, ok := s.tenants.Load(sb.ID); ok {
		if err := v.(*tenant).acct.CheckCredits(); err != nil {
			return apierr.Wrap(err, apierr.From(err).Code, "sandbox %s stays paused: %s", sb.ID, apierr.From(err).Message)
		}
	}
	if s.cfg.HostMemoryBytes <= 0 {
		return nil
	}
	capacity := int64(float64(s.cfg.HostMemoryBytes) * s.cfg.Overcommit)
	s.mu.Lock()
	used, need := s.pooled.bytes, int64(0)
	for id, b := range s.boxes {
		switch {
		case id == sb.ID:
			need = b.footprint
		case b.sb == nil || b.sb.State() != sandbox.StatePaused || b.sb.Frozen():
			used += b.footprint
		}
	}
	s.mu.Unlock()
	if used+need > capacity {
		return &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("the host cannot hold sandbox %s's %d MiB of memory now (%d of %d MiB are committed to running sandboxes); it stays paused, try again when one stops",
				sb.ID, need>>20, used>>20, capacity>>20)}
	}
	return nil
}
