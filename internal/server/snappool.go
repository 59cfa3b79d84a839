package server

import (
	"net/http"
	"path/filepath"
	"strings"

	"github.com/sheepfold/sheepfold/api"
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
// the same member. Pools are not kept across restarts: the sizes are
// the running server's.

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
	if !snapshotName.MatchString(name) {
		return apierr.New(apierr.NotFound, "no snapshot %q", name)
	}
	if req.Size < 0 {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "size"},
			Message: "size must be 0 or more"}
	}
	if req.Size > 0 && s.cfg.MaxSnapshotPoolPerAccount <= 0 {
		return apierr.New(apierr.NotSupported, "this server keeps no snapshot pools (--max-snapshot-pool-per-account is 0)")
	}
	rec, dir, err := s.findSnapshot(own, name)
	if err != nil {
		return err
	}
	opt, _, err := s.recordOptions(rec, filepath.Join(dir, snapshotStateDir))
	if err != nil {
		return err
	}
	opt.Owner = own
	k := snapshotKey(own, name)
	// snapMu orders this against the snapshot's delete (which empties the
	// pool under it) and against the account's other pools' sizes.
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if _, _, err := s.findSnapshot(own, name); err != nil {
		return err // deleted meanwhile
	}
	others := 0
	for pk, n := range s.snapPools {
		if pk != k && strings.HasPrefix(pk, own+"\x00") {
			others += n
		}
	}
	if req.Size > 0 && others+req.Size > s.cfg.MaxSnapshotPoolPerAccount {
		return apierr.New(apierr.SessionQuotaExceeded, "the account's snapshot pools would hold %d sandboxes, more than its %d (--max-snapshot-pool-per-account)",
			others+req.Size, s.cfg.MaxSnapshotPoolPerAccount)
	}
	opt.SnapshotPool = k
	if err := s.engine.SetSnapshotPool(k, opt, req.Size); err != nil {
		return err
	}
	if s.snapPools == nil {
		s.snapPools = map[string]int{}
	}
	if req.Size == 0 {
		delete(s.snapPools, k)
	} else {
		s.snapPools[k] = req.Size
	}
	writeJSON(w, http.StatusOK, api.SnapshotPool{Snapshot: name, Size: req.Size, Ready: s.engine.SnapshotPoolReady(k)})
	return nil
}

func (s *Server) getSnapshotPool(w http.ResponseWriter, r *http.Request) error {
	own, name := owner(r), r.PathValue("name")
	if _, _, err := s.findSnapshot(own, name); err != nil {
		return err
	}
	k := snapshotKey(own, name)
	s.snapMu.Lock()
	size := s.snapPools[k]
	s.snapMu.Unlock()
	writeJSON(w, http.StatusOK, api.SnapshotPool{Snapshot: name, Size: size, Ready: s.engine.SnapshotPoolReady(k)})
	return nil
}

// dropSnapPool destroys own's snapshot name's pool; snapMu is held.
func (s *Server) dropSnapPool(own, name string) {
	k := snapshotKey(own, name)
	if _, ok := s.snapPools[k]; !ok {
		return
	}
	delete(s.snapPools, k)
	if err := s.engine.SetSnapshotPool(k, sandbox.CreateOptions{}, 0); err != nil {
		s.log.Error("empty a deleted snapshot's pool", "snapshot", name, "err", err)
	}
}
