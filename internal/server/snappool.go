package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Snapshot pools: POST /v1/snapshots/{name}/pool {"size": N} keeps N
// sandboxes restored from the account's snapshot ahead of need
// (sandbox.Manager.SetSnapshotPool), so that a create from it (POST
// /v1/sandboxes with snapshot, E2B's create from a snapshot) takes one
// instead of waiting for the restore; GET reports the pool. A size of 0,
// the snapshot's delete and the server's shutdown destroy the members.
//
// The pool is an explicit request of the account's, not a create option:
// restored members hold memory while nobody uses them, so keeping them is
// something an account asks for and sizes once, and creates stay as they
// were (a create from a pooled snapshot is the same request, only
// faster). Each account keeps at most Config.MaxSnapshotPoolPerAccount
// members over all its snapshots (ERR_SESSION_QUOTA_EXCEEDED); the
// server's default of 0 turns the pools off (ERR_NOT_SUPPORTED).
//
// A member taken by a create is a sandbox of its own like any other from
// the snapshot: a new id and tokens (the server's record is made at the
// hand-out), its lifetime and metering starting then; no two creates get
// the same member. A pool's size is kept across restarts: it is written
// beside its snapshot (<account>/<name>/pool.json, writePoolSize), which
// it cannot outlive (the snapshot's delete takes the file with it), and
// the next start sizes the pools again (restoreSnapshotPools) after it
// took back its paused sandboxes, under that server's bounds; the
// members are restored anew (the engine's members end with it).
//
// Members count against the caps as the sandboxes they stand for: each
// holds a slot of its account's concurrent sandboxes (max_sandboxes;
// a pool the account has no slots left for is refused,
// ERR_SESSION_QUOTA_EXCEEDED, and a create when running sandboxes and
// pooled members fill the cap is refused as any create is), and one of
// the server's slots and its footprint of the host's memory, as admit
// reckons them (--max-sandboxes, --host-memory-mb; a pool that does not
// fit is refused, ERR_CAPACITY). A member handed out becomes a sandbox
// with a slot of its own (its create's), and the pool's slot stays for
// the member that refills it: an account with a pool of n and r
// sandboxes from it holds r + n slots. Across servers sharing a store,
// members are counted by their own server's count of its accounts (no
// reservation in the store, which would lapse). A pool of a snapshot
// with a network is refused (ERR_NOT_SUPPORTED): its clones get their
// gateways as they are made.

func (s *Server) snapPoolRoutes(add addFunc) {
	add("POST /v1/snapshots/{name}/pool", true, s.setSnapshotPool)
	add("GET /v1/snapshots/{name}/pool", true, s.getSnapshotPool)
}

func (s *Server) setSnapshotPool(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotPoolRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	own, name := owner(r), r.PathValue("name")
	ready, err := s.sizeSnapshotPool(r.Context(), own, name, req.Size, true)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.SnapshotPool{Snapshot: name, Size: req.Size, Ready: ready})
	return nil
}

// sizeSnapshotPool keeps size members of own's snapshot name restored
// ahead (0: none) and returns how many are ready; with persist the size
// is written beside the snapshot (snapshotPoolFile) for the next start.
func (s *Server) sizeSnapshotPool(ctx context.Context, own, name string, size int, persist bool) (int, error) {
	if !snapshotName.MatchString(name) {
		return 0, apierr.New(apierr.NotFound, "no snapshot %q", name)
	}
	if size < 0 {
		return 0, &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "size"},
			Message: "size must be 0 or more"}
	}
	if size > 0 && s.cfg.MaxSnapshotPoolPerAccount <= 0 {
		return 0, apierr.New(apierr.NotSupported, "this server keeps no snapshot pools (--max-snapshot-pool-per-account is 0)")
	}
	rec, dir, err := s.findSnapshot(own, name)
	if err != nil {
		return 0, err
	}
	opt, _, err := s.recordOptions(rec, filepath.Join(dir, snapshotStateDir))
	if err != nil {
		return 0, err
	}
	opt.Owner = own
	var acct *account.Account
	if size > 0 {
		if acct, err = s.grant(ctx, own, &opt); err != nil {
			return 0, err
		}
	}
	k := snapshotKey(own, name)
	// snapMu orders this against the snapshot's delete (which empties the
	// pool under it) and against the account's other pools' sizes.
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if _, _, err := s.findSnapshot(own, name); err != nil {
		return 0, err // deleted meanwhile
	}
	others := 0
	for pk, h := range s.snapPools {
		if pk != k && strings.HasPrefix(pk, own+"\x00") {
			others += h.size
		}
	}
	if size > 0 && others+size > s.cfg.MaxSnapshotPoolPerAccount {
		return 0, apierr.New(apierr.SessionQuotaExceeded, "the account's snapshot pools would hold %d sandboxes, more than its %d (--max-snapshot-pool-per-account)",
			others+size, s.cfg.MaxSnapshotPoolPerAccount)
	}
	old := s.snapPools[k]
	if size == 0 {
		if err := s.engine.SetSnapshotPool(k, opt, 0); err != nil {
			return 0, err
		}
		delete(s.snapPools, k)
		s.releasePool(old)
		if persist {
			if err := writePoolSize(dir, 0); err != nil {
				return 0, err
			}
		}
		return s.engine.SnapshotPoolReady(k), nil
	}
	hold, err := s.holdPool(ctx, old, acct, size, s.engine.Footprint(opt.Limits))
	if err != nil {
		return 0, err // old holds what it held
	}
	opt.SnapshotPool = k
	if err := s.engine.SetSnapshotPool(k, opt, size); err != nil {
		// Its members may be gone with the failed change: the pool is
		// no more, nor what it held.
		delete(s.snapPools, k)
		s.releasePool(hold)
		if derr := s.engine.SetSnapshotPool(k, sandbox.CreateOptions{}, 0); derr != nil {
			s.log.Error("empty a snapshot pool whose change failed", "snapshot", name, "err", derr)
		}
		if persist {
			_ = writePoolSize(dir, 0)
		}
		return 0, err
	}
	if s.snapPools == nil {
		s.snapPools = map[string]*poolHold{}
	}
	s.snapPools[k] = hold
	if persist {
		if err := writePoolSize(dir, size); err != nil {
			// The pool runs; only the next start will not know of it.
			s.log.Error("record a snapshot pool's size", "snapshot", name, "err", err)
		}
	}
	return s.engine.SnapshotPoolReady(k), nil
}

// snapshotPool is what a snapshot's directory keeps of its pool
// (snapshotPoolFile): the size its account asked for.
type snapshotPool struct {
	Size int `json:"size"`
}

// writePoolSize records, in the snapshot directory dir, the size of its
// pool (0: the record goes). The record is written anew and renamed into
// place, so that a crash leaves the old size or the new.
func writePoolSize(dir string, size int) error {
	path := filepath.Join(dir, snapshotPoolFile)
	if size == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	j, err := json.Marshal(snapshotPool{Size: size})
	if err != nil {
		return err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, j, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// restoreSnapshotPools sizes again, at the server's start, the pools the
// snapshots' directories record (writePoolSize): for each, in the order
// of the directories, as its account's request would, under today's
// bounds. A pool that no longer fits them (the server's
// --max-snapshot-pool-per-account, the account's slots, the host's
// memory) is logged and its record removed, so that what GET reports
// and what the next start restores are the pool that runs.
func (s *Server) restoreSnapshotPools(ctx context.Context, root string) {
	accts, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Error("read the snapshot dir for pools", "err", err)
		}
		return
	}
	for _, a := range accts {
		if !a.IsDir() || a.Name() == forksDir || strings.HasPrefix(a.Name(), ".") {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, a.Name()))
		if err != nil {
			s.log.Error("read an account's snapshots for pools", "dir", a.Name(), "err", err)
			continue
		}
		for _, e := range ents {
			dir := filepath.Join(root, a.Name(), e.Name())
			j, err := os.ReadFile(filepath.Join(dir, snapshotPoolFile))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			var p snapshotPool
			if err == nil {
				err = json.Unmarshal(j, &p)
			}
			rec, rerr := readSnapshotRecord(dir)
			if err == nil {
				err = rerr
			}
			if err == nil && (rec.Name != e.Name() || accountSnapshots(root, rec.Owner) != filepath.Join(root, a.Name())) {
				err = errors.New("the snapshot's record names another")
			}
			if err == nil {
				_, err = s.sizeSnapshotPool(ctx, rec.Owner, rec.Name, p.Size, false)
			}
			if err != nil {
				s.log.Warn("a snapshot pool recorded before the restart is not kept", "snapshot", e.Name(), "size", p.Size, "err", err)
				if werr := writePoolSize(dir, 0); werr != nil {
					s.log.Error("remove a snapshot pool's record", "snapshot", e.Name(), "err", werr)
				}
				continue
			}
			s.log.Info("snapshot pool restored", "snapshot", rec.Name, "size", p.Size)
		}
	}
}

// poolHold is a snapshot pool as the server holds it: its size and what
// its members hold of their account's and the server's caps.
type poolHold struct {
	size      int
	footprint int64            // one member's share of the host's memory (Engine.Footprint)
	acct      *account.Account // nil with accounting off
	slots     int              // the account's slots it holds
	counted   bool             // its size and footprint are in s.pooled
}

// holdPool takes what a pool of size members of footprint each needs:
// its account's slots and the server's slots and memory (admit). It
// takes over what old (the pool it replaces; nil: none) held, so that a
// resize asks only for the difference; when it fails old holds what it
// held and nothing else is taken. snapMu is held.
func (s *Server) holdPool(ctx context.Context, old *poolHold, acct *account.Account, size int, footprint int64) (*poolHold, error) {
	h := &poolHold{size: size, footprint: footprint, acct: acct}
	if old != nil && old.acct == acct {
		h.slots, old.slots = old.slots, 0
	}
	giveBack := func() {
		if old != nil && old.acct == acct {
			n := min(h.slots, old.size)
			old.slots, h.slots = n, h.slots-n
		}
		s.releasePool(h)
	}
	for acct != nil && h.slots < size {
		holder := "pool-" + newID("")
		reserved, err := acct.AcquireSandbox(ctx, holder)
		if err != nil {
			giveBack()
			return nil, err
		}
		if reserved {
			// The account's count on this server holds the slot; a
			// reservation in the store would lapse.
			admission{holder: holder}.drop(s.store)
		}
		h.slots++
	}
	for ; acct != nil && h.slots > size; h.slots-- {
		acct.ReleaseSandbox()
	}
	s.mu.Lock()
	count, bytes := s.pooled.count+size, s.pooled.bytes+int64(size)*footprint
	if old != nil && old.counted {
		count, bytes = count-old.size, bytes-int64(old.size)*old.footprint
	}
	var err error
	switch {
	case s.cfg.MaxSandboxes > 0 && len(s.boxes)+count > s.cfg.MaxSandboxes:
		err = &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("a pool of %d does not fit this server's %d sandbox slots beside its %d sandboxes and %d other pooled", size, s.cfg.MaxSandboxes, len(s.boxes), count-size)}
	case s.cfg.HostMemoryBytes > 0:
		capacity := int64(float64(s.cfg.HostMemoryBytes) * s.cfg.Overcommit)
		used := bytes
		for _, b := range s.boxes {
			used += b.footprint
		}
		if used > capacity {
			err = &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
				Message: fmt.Sprintf("a pool of %d sandboxes of %d MiB does not fit the host's memory: %d of %d MiB would be committed",
					size, footprint>>20, used>>20, capacity>>20)}
		}
	}
	if err == nil {
		s.pooled.count, s.pooled.bytes = count, bytes
		h.counted = true
		if old != nil {
			old.counted = false
		}
	}
	s.mu.Unlock()
	if err != nil {
		giveBack()
		return nil, err
	}
	return h, nil
}

// releasePool gives back what h holds (nil: nothing).
func (s *Server) releasePool(h *poolHold) {
	if h == nil {
		return
	}
	for ; h.slots > 0; h.slots-- {
		h.acct.ReleaseSandbox()
	}
	if h.counted {
		s.mu.Lock()
		s.pooled.count -= h.size
		s.pooled.bytes -= int64(h.size) * h.footprint
		s.mu.Unlock()
		h.counted = false
	}
}

func (s *Server) getSnapshotPool(w http.ResponseWriter, r *http.Request) error {
	own, name := owner(r), r.PathValue("name")
	if _, _, err := s.findSnapshot(own, name); err != nil {
		return err
	}
	k := snapshotKey(own, name)
	s.snapMu.Lock()
	size := 0
	if h := s.snapPools[k]; h != nil {
		size = h.size
	}
	s.snapMu.Unlock()
	writeJSON(w, http.StatusOK, api.SnapshotPool{Snapshot: name, Size: size, Ready: s.engine.SnapshotPoolReady(k)})
	return nil
}

// dropSnapPool destroys own's snapshot name's pool; snapMu is held.
func (s *Server) dropSnapPool(own, name string) {
	k := snapshotKey(own, name)
	h, ok := s.snapPools[k]
	if !ok {
		return
	}
	delete(s.snapPools, k)
	if err := s.engine.SetSnapshotPool(k, sandbox.CreateOptions{}, 0); err != nil {
		s.log.Error("empty a deleted snapshot's pool", "snapshot", name, "err", err)
	}
	s.releasePool(h)
}
