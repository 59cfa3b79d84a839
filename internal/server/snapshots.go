package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"crypto/sha256"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Snapshots: a running sandbox's processes, memory and files saved under
// a name of its account's (POST /v1/sandboxes/{id}/snapshots), from which
// new sandboxes start (POST /v1/sandboxes with snapshot), listed and
// deleted under /v1/snapshots.
//
// Each snapshot is a directory of the engine's snapshot dir
// (sandbox.Manager.SnapshotDir: the data dir's snapshots), under one of
// its account's (the hex of a hash of the owner: no owner string reaches
// a path):
//
//	<account>/<name>/snapshot.json   snapshotRecord: what a sandbox started from it is made with
//	<account>/<name>/state/          the engine's snapshot (CRIU's images, the writable layer's copy)
//	<account>/<name>/pool.json       the size of its pool, when it has one (snappool.go)
//
// A snapshot is made in <account>/.new-<random> and renamed to its name
// once complete, and deleted by a rename to .old-<random> first, so that
// a crash leaves no half snapshot under a name; the server removes what
// such a crash left at its start. Snapshots survive restarts: the
// directories are the listing.
//
// A sandbox started from a snapshot is a new sandbox in every way the
// server knows (an id, host id range, agent, preview and E2B tokens of
// its own, its own record and metering), with the template, limits,
// policy, environment and execution timeout the snapshot recorded; a
// create that names a snapshot may not name those (ERR_BAD_REQUEST).
//
// What a snapshot never holds: a secret's value. A sandbox reaches a
// secret only through its egress gateway, which substitutes the value
// into its outgoing requests on the host (secrets_egress.go); the
// gateway is never dumped (a sandbox with a network is snapshotted with
// it detached, internal/sandbox network.go), and a sandbox started from
// the snapshot gets a gateway of its own with the recorded policy, whose
// rules resolve the account's secrets by the new sandbox's id. Its
// environment holds ${secrets.NAME} placeholders, never values.
//
// Bounds: each account keeps at most Config.MaxSnapshotsPerAccount
// snapshots (ERR_SESSION_QUOTA_EXCEEDED) and, when
// Config.MaxSnapshotBytesPerAccount is set, at most that many bytes of
// them (their records' size_bytes): a snapshot is measured once taken,
// and one that would pass the bound is removed before it gets its name
// (ERR_STORAGE_QUOTA_EXCEEDED; the sandbox runs on); the check and the
// rename are one step under snapMu, so two snapshots never pass the
// bound together, and an account at its bound is refused before any
// checkpoint. Each is at most its sandbox's
// memory limit plus its disk limit in size; the data dir's free space
// bounds them all (a snapshot that does not fit fails and leaves
// nothing). A snapshot a create or fork is starting sandboxes from is
// in use and not deleted (ERR_CONFLICT).

// snapshotName is what a snapshot may be called.
var snapshotName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// DefaultMaxSnapshotsPerAccount is Config.MaxSnapshotsPerAccount's default.
const DefaultMaxSnapshotsPerAccount = 16

// Files of a snapshot's directory.
const (
	snapshotRecordFile = "snapshot.json"
	snapshotStateDir   = "state"
	snapshotPoolFile   = "pool.json" // snapshotPool, when the account keeps a pool (snappool.go)
)

// snapshotRecord is what a snapshot keeps of the sandbox it was taken of.
type snapshotRecord struct {
	Name          string            `json:"name"`
	Owner         string            `json:"owner"`
	Sandbox       string            `json:"sandbox"`
	Template      string            `json:"template"`
	CreatedAt     time.Time         `json:"created_at"`
	Limits        runtime.Limits    `json:"limits"`
	ReadOnly      bool              `json:"read_only,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Policy        json.RawMessage   `json:"policy,omitempty"`
	ExecTimeoutMS int64             `json:"exec_timeout_ms,omitempty"`
	SizeBytes     int64             `json:"size_bytes"`
}

func (rec snapshotRecord) json() api.Snapshot {
	return api.Snapshot{Name: rec.Name, SandboxID: rec.Sandbox, Template: rec.Template, Resources: resourcesOf(rec.Limits),
		CreatedAt: rec.CreatedAt.UTC(), SizeBytes: rec.SizeBytes}
}

func (s *Server) snapshotRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/snapshots", true, s.createSnapshot)
	add("GET /v1/snapshots", true, s.listSnapshots)
	add("GET /v1/snapshots/{name}", true, s.getSnapshot)
	add("DELETE /v1/snapshots/{name}", true, s.deleteSnapshot)
	s.snapPoolRoutes(add)
}

// snapshots returns the engine's snapshot dir, or why there is none.
func (s *Server) snapshots() (string, error) {
	if s.engine == nil || !s.engine.CanSnapshot() || s.engine.SnapshotDir() == "" {
		return "", apierr.New(apierr.NotSupported, "this server cannot snapshot sandboxes")
	}
	return s.engine.SnapshotDir(), nil
}

// accountSnapshots is own's directory of snapshots.
func accountSnapshots(root, own string) string {
	h := sha256.Sum256([]byte(own))
	return filepath.Join(root, hex.EncodeToString(h[:16]))
}

// checkSnapshotName refuses a name a snapshot may not have.
func checkSnapshotName(field, name string) error {
	if !snapshotName.MatchString(name) {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": field},
			Message: fmt.Sprintf("%s must be 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit; got %q", field, name)}
	}
	return nil
}

// snapshotKey names one account's snapshot among all (Server.snapUse).
func snapshotKey(own, name string) string { return own + "\x00" + name }

// readSnapshots lists own's snapshots, oldest first.
func readSnapshots(root, own string) ([]snapshotRecord, error) {
	dir := accountSnapshots(root, own)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []snapshotRecord
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		rec, err := readSnapshotRecord(filepath.Join(dir, e.Name()))
		if err != nil || rec.Owner != own || rec.Name != e.Name() {
			continue
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b snapshotRecord) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

func readSnapshotRecord(dir string) (snapshotRecord, error) {
	var rec snapshotRecord
	j, err := os.ReadFile(filepath.Join(dir, snapshotRecordFile))
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(j, &rec)
}

// findSnapshot returns own's snapshot name and its directory; another
// account's, or none, is ERR_NOT_FOUND alike.
func (s *Server) findSnapshot(own, name string) (snapshotRecord, string, error) {
	root, err := s.snapshots()
	if err != nil {
		return snapshotRecord{}, "", err
	}
	if !snapshotName.MatchString(name) {
		return snapshotRecord{}, "", apierr.New(apierr.NotFound, "no snapshot %q", name)
	}
	dir := filepath.Join(accountSnapshots(root, own), name)
	rec, err := readSnapshotRecord(dir)
	if err != nil || rec.Owner != own || rec.Name != name {
		return snapshotRecord{}, "", apierr.New(apierr.NotFound, "no snapshot %q", name)
	}
	return rec, dir, nil
}

// useSnapshot marks own's snapshot name in use (a delete is refused)
// until the returned func is called.
func (s *Server) useSnapshot(own, name string) func() {
	k := snapshotKey(own, name)
	s.snapMu.Lock()
	if s.snapUse == nil {
		s.snapUse = map[string]int{}
	}
	s.snapUse[k]++
	s.snapMu.Unlock()
	return func() {
		s.snapMu.Lock()
		if s.snapUse[k]--; s.snapUse[k] <= 0 {
			delete(s.snapUse, k)
		}
		s.snapMu.Unlock()
	}
}

// sourceOf is what a sandbox held here was made with, for a snapshot or
// a fork of it.
func sourceOf(b *box) snapshotRecord {
	sb := b.sb
	rec := snapshotRecord{Sandbox: sb.ID, Template: sb.Template, Limits: sb.CurrentLimits(), ReadOnly: sb.ReadOnly,
		Env: sb.Env, Metadata: sb.Metadata, ExecTimeoutMS: b.execTimeout.Milliseconds()}
	if p := sb.Policy(); p != nil {
		rec.Policy = policyJSON(p)
	}
	return rec
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := checkSnapshotName("name", req.Name); err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	rec, err := s.takeSnapshot(context.WithoutCancel(r.Context()), owner(r), b, req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, rec.json())
	return nil
}

// takeSnapshot snapshots b for own under name (checked already).
func (s *Server) takeSnapshot(ctx context.Context, own string, b *box, name string) (snapshotRecord, error) {
	root, err := s.snapshots()
	if err != nil {
		return snapshotRecord{}, err
	}
	dir := accountSnapshots(root, own)
	// The name and the account's bound are held for this snapshot while
	// it is made: two at once pass neither.
	k := snapshotKey(own, name)
	s.snapMu.Lock()
	if s.snapMaking == nil {
		s.snapMaking = map[string]bool{}
	}
	have, err := readSnapshots(root, own)
	if err != nil {
		s.snapMu.Unlock()
		return snapshotRecord{}, err
	}
	making := 0
	for mk := range s.snapMaking {
		if strings.HasPrefix(mk, own+"\x00") {
			making++
		}
	}
	switch {
	case s.snapMaking[k] || slices.ContainsFunc(have, func(rec snapshotRecord) bool { return rec.Name == name }):
		s.snapMu.Unlock()
		return snapshotRecord{}, &apierr.Error{Code: apierr.Conflict, Details: map[string]any{"field": "name"},
			Message: fmt.Sprintf("a snapshot named %q exists: delete it first or choose another name", name)}
	case len(have)+making >= s.cfg.MaxSnapshotsPerAccount:
		s.snapMu.Unlock()
		return snapshotRecord{}, apierr.New(apierr.SessionQuotaExceeded, "the account has %d snapshots, its most (--max-snapshots-per-account); delete one first",
			s.cfg.MaxSnapshotsPerAccount)
	}
	if err := s.admitSnapshotBytes(own, b.sb.ID, have, 0); err != nil { // at its bound already: not even taken
		s.snapMu.Unlock()
		return snapshotRecord{}, err
	}
	s.snapMaking[k] = true
	s.snapMu.Unlock()
	defer func() {
		s.snapMu.Lock()
		delete(s.snapMaking, k)
		s.snapMu.Unlock()
	}()

	rec := sourceOf(b)
	rec.Name, rec.Owner, rec.CreatedAt = name, own, time.Now().UTC()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return snapshotRecord{}, err
	}
	tmp, err := os.MkdirTemp(dir, ".new-")
	if err != nil {
		return snapshotRecord{}, err
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := b.sb.Snapshot(ctx, filepath.Join(tmp, snapshotStateDir)); err != nil {
		return snapshotRecord{}, err
	}
	rec.SizeBytes = dirSize(tmp)
	j, err := json.Marshal(rec)
	if err != nil {
		return snapshotRecord{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, snapshotRecordFile), j, 0o600); err != nil {
		return snapshotRecord{}, err
	}
	// Its bytes are known now: admitted with the account's snapshots as
	// they are at its rename, which no other snapshot's passes (snapMu).
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if have, err = readSnapshots(root, own); err != nil {
		return snapshotRecord{}, err
	}
	if err := s.admitSnapshotBytes(own, b.sb.ID, have, rec.SizeBytes); err != nil {
		return snapshotRecord{}, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return snapshotRecord{}, err
	}
	done = true
	s.meterSnapshots(root, own)
	s.log.Info("snapshot taken", "sandbox", b.sb.ID, "snapshot", name, "bytes", rec.SizeBytes)
	return rec, nil
}

// admitSnapshotBytes admits a snapshot of sandbox id of size bytes beside
// own's snapshots have and its forks' baselines (fork.go), within
// Config.MaxSnapshotBytesPerAccount; a size of 0 asks whether the account
// is below its bound at all. snapMu is held.
func (s *Server) admitSnapshotBytes(own, id string, have []snapshotRecord, size int64) error {
	limit := s.cfg.MaxSnapshotBytesPerAccount
	if limit <= 0 {
		return nil
	}
	held := s.forkBytes(own)
	for _, rec := range have {
		held += rec.SizeBytes
	}
	if held+size > limit || (size == 0 && held >= limit) {
		return &apierr.Error{Code: apierr.StorageQuotaExceeded, Details: map[string]any{"snapshot_bytes": held, "needed_bytes": size, "max_bytes": limit},
			Message: fmt.Sprintf("a snapshot of sandbox %s would keep %d MiB of the account's snapshots on the server's disk, past its %d MiB (--max-snapshot-mb-per-account; %d MiB held now); nothing of it is kept and the sandbox runs on: delete a snapshot first",
				id, (held+size)>>20, limit>>20, held>>20)}
	}
	return nil
}

// snapshotDiskFile holds the snapshot dir's name among the disks of the
// servers sharing a store (Server.snapDisk), made at its first start.
const snapshotDiskFile = ".disk"

// meterSnapshots records what own's snapshots hold now in the store, for
// its storage metering; s.snapMu is held, so that the last change's sum
// is the one recorded.
func (s *Server) meterSnapshots(root, own string) {
	if s.store == nil || s.snapDisk == "" {
		return
	}
	recs, err := readSnapshots(root, own)
	if err == nil {
		n := s.forkBytes(own) // its forks' baselines are its snapshots too
		for _, rec := range recs {
			n += rec.SizeBytes
		}
		ctx, cancel := context.WithTimeout(context.Background(), pausedReadTimeout)
		err = s.store.SetSnapshotBytes(ctx, s.snapDisk, own, n)
		cancel()
	}
	if err != nil {
		s.log.Error("meter an account's snapshots: they are charged as before until its next snapshot or delete", "err", err)
	}
}

// startSnapshotMeter names root among the disks (made once, kept in
// root) and records what every account's snapshots in it hold, in place
// of what the store had of this disk.
func (s *Server) startSnapshotMeter(root string) {
	if s.store == nil {
		return
	}
	disk, err := readOrMakeDisk(root)
	if err != nil {
		s.log.Error("name the snapshot dir: snapshots are not metered", "err", err)
		return
	}
	held := map[string]int64{}
	accts, _ := os.ReadDir(root)
	for _, a := range accts {
		if !a.IsDir() || strings.HasPrefix(a.Name(), ".") {
			continue
		}
		ents, _ := os.ReadDir(filepath.Join(root, a.Name()))
		for _, e := range ents {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			rec, err := readSnapshotRecord(filepath.Join(root, a.Name(), e.Name()))
			if err == nil && rec.Name == e.Name() && accountSnapshots(root, rec.Owner) == filepath.Join(root, a.Name()) {
				held[rec.Owner] += rec.SizeBytes
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), pausedReadTimeout)
	defer cancel()
	errs := []error{s.store.ClearSnapshotBytes(ctx, disk)}
	for own, n := range held {
		errs = append(errs, s.store.SetSnapshotBytes(ctx, disk, own, n))
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Error("meter the snapshots kept", "err", err)
	}
	s.snapDisk = disk
}

// readOrMakeDisk returns root's disk name, made the first time.
func readOrMakeDisk(root string) (string, error) {
	p := filepath.Join(root, snapshotDiskFile)
	if b, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", err
	}
	disk := newID("disk_")
	if err := os.WriteFile(p, []byte(disk+"\n"), 0o600); err != nil {
		return "", err
	}
	return disk, nil
}

// dirSize is the bytes the files under dir take on disk.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil && !d.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	root, err := s.snapshots()
	if err != nil {
		return err
	}
	recs, err := readSnapshots(root, owner(r))
	if err != nil {
		return err
	}
	out := api.SnapshotList{Snapshots: []api.Snapshot{}}
	for _, rec := range recs {
		out.Snapshots = append(out.Snapshots, rec.json())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	rec, _, err := s.findSnapshot(owner(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rec.json())
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.removeSnapshot(owner(r), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// removeSnapshot deletes own's snapshot name, unless it is in use.
func (s *Server) removeSnapshot(own, name string) error {
	_, dir, err := s.findSnapshot(own, name)
	if err != nil {
		return err
	}
	s.snapMu.Lock()
	if n := s.snapUse[snapshotKey(own, name)]; n > 0 {
		s.snapMu.Unlock()
		return apierr.New(apierr.Conflict, "snapshot %q is in use: %d sandboxes are starting from it; delete it when they have started", name, n)
	}
	s.dropSnapPool(own, name) // snapMu held (snappool.go)
	old := filepath.Join(filepath.Dir(dir), ".old-"+newID(""))
	err = os.Rename(dir, old)
	if err == nil {
		s.meterSnapshots(filepath.Dir(filepath.Dir(dir)), own)
	}
	s.snapMu.Unlock()
	if err != nil {
		return err
	}
	if err := os.RemoveAll(old); err != nil {
		s.log.Error("remove a deleted snapshot", "snapshot", name, "err", err)
	}
	return nil
}

// snapshotCreateOptions are the engine's options of a sandbox started
// from own's snapshot named in req, and its execution timeout; release
// ends the snapshot's use.
func (s *Server) snapshotCreateOptions(own string, req api.CreateSandbox) (opt sandbox.CreateOptions, execTimeout time.Duration, release func(), err error) {
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"template", req.Template != ""}, {"resources", req.Resources != nil}, {"env", len(req.Env) > 0}, {"runtime", req.Runtime != ""},
		{"sandbox_config", len(req.SandboxConfig) > 0}, {"security_policy", len(req.SecurityPolicy) > 0},
	} {
		if f.set {
			return opt, 0, nil, &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": f.name},
				Message: fmt.Sprintf("%s cannot be given with snapshot: a sandbox started from a snapshot has the template, resources, environment and policy of the one snapshotted", f.name)}
		}
	}
	if err := checkSnapshotName("snapshot", req.Snapshot); err != nil {
		return opt, 0, nil, err
	}
	release = s.useSnapshot(own, req.Snapshot)
	rec, dir, err := s.findSnapshot(own, req.Snapshot)
	if err != nil {
		release()
		return opt, 0, nil, err
	}
	opt, execTimeout, err = s.recordOptions(rec, filepath.Join(dir, snapshotStateDir))
	if err != nil {
		release()
		return opt, 0, nil, err
	}
	opt.SnapshotPool = snapshotKey(own, req.Snapshot) // a member when one is ready (snappool.go)
	if req.Metadata != nil {
		opt.Metadata = req.Metadata
	}
	if req.Timeout != nil {
		if opt.Timeout, err = seconds("timeout", *req.Timeout, s.cfg.MaxTimeout); err != nil {
			release()
			return opt, 0, nil, err
		}
	}
	return opt, execTimeout, release, nil
}

// recordOptions are the options of a sandbox made as rec says, from the
// engine's snapshot in state.
func (s *Server) recordOptions(rec snapshotRecord, state string) (sandbox.CreateOptions, time.Duration, error) {
	opt := sandbox.CreateOptions{Template: rec.Template, Limits: rec.Limits, ReadOnly: rec.ReadOnly, Env: rec.Env,
		Metadata: rec.Metadata, Snapshot: state}
	if len(rec.Policy) > 0 {
		p, err := parsePolicy(rec.Policy)
		if err != nil {
			return opt, 0, apierr.Wrap(err, apierr.Internal, "the snapshot's policy no longer parses")
		}
		opt.Policy = p
	}
	return opt, time.Duration(rec.ExecTimeoutMS) * time.Millisecond, nil
}

// removeSnapshotLeftovers removes what a crash left in the middle of
// making or deleting a snapshot.
func removeSnapshotLeftovers(root string) error {
	accts, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range accts {
		if !a.IsDir() {
			continue
		}
		if a.Name() == forksDir { // forks are known to the run that made them alone
			errs = append(errs, os.RemoveAll(filepath.Join(root, a.Name())))
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, a.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".new-") || strings.HasPrefix(e.Name(), ".old-") {
				errs = append(errs, os.RemoveAll(filepath.Join(root, a.Name(), e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}
