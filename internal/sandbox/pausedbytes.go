package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Paused storage: what a paused sandbox holds on the server's disk, its
// checkpoint's images (CheckpointDir/<id>) and its kept disk (the
// writable layer, through runtime.DiskMeter), metered as storage and
// bounded per account by the server (internal/metering, internal/server
// pausedbytes.go). Before a pause, PauseEstimate says what it will hold:
// the memory its cgroup charges (an upper bound of the images: CRIU
// dumps the anonymous memory and the page cache is not dumped) and its
// disk.

// resumeErr is the error of a restore that failed: the sandbox stays
// paused; a host without room for it (runtime.ErrCapacity) says so.
func resumeErr(id string, err error) error {
	if errors.Is(err, runtime.ErrCapacity) {
		return &apierr.Error{Code: apierr.Capacity, Err: err, RetryAfter: time.Second,
			Message: fmt.Sprintf("this host has no room to resume sandbox %s now; it stays paused, try again when another stops", id)}
	}
	return apierr.Wrap(err, apierr.Internal, "could not resume sandbox %s; it stays paused", id)
}

// Frozen reports whether the sandbox is paused by the freezer (Freeze):
// its memory is still held.
func (s *Sandbox) Frozen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == StatePaused && s.frozen
}

// PausedBytes returns what the sandbox holds on the server's disk while
// paused to its checkpoint: its images and its kept disk; 0 for a
// sandbox not paused to disk (a frozen one's memory is metered as
// memory).
func (s *Sandbox) PausedBytes(ctx context.Context) int64 {
	s.mu.Lock()
	paused := s.state == StatePaused && !s.frozen
	s.mu.Unlock()
	if !paused || s.m.cfg.CheckpointDir == "" {
		return 0
	}
	n := dirBytes(s.m.checkpointPath(s.ID))
	if dm, ok := s.m.cfg.Runtime.(runtime.DiskMeter); ok {
		if d, err := dm.DiskUsed(ctx, s.ID); err == nil {
			n += d
		}
	}
	return n
}

// PauseEstimate returns what a pause of the running sandbox would hold
// on the server's disk: the memory its cgroup charges now and its disk.
func (s *Sandbox) PauseEstimate(ctx context.Context) (int64, error) {
	u, err := s.m.cfg.Runtime.Usage(ctx, s.ID)
	if err != nil {
		return 0, err
	}
	return u.MemoryBytes + u.DiskBytes, nil
}

// dirBytes is the bytes the files under dir occupy (their blocks, for
// sparse images), 0 if it does not exist.
func dirBytes(dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fileBytes(fi)
			}
		}
		return nil
	})
	_ = err // what could be read counts
	return n
}
