package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Forks: independent copies of a running sandbox, with its memory and
// files (POST /v1/sandboxes/{id}/fork), and what a fork changed in its
// files since (GET /v1/sandboxes/{id}/diff?against=PARENT).
//
// A fork is a snapshot taken once (the parent runs on) and restored
// count times, each restore a create through the ordinary path
// (admission, the account's caps, its record, its tokens) with the
// parent's template, limits, environment, policy and execution timeout.
// The snapshot lives in the snapshot dir's .forks/<parent>-<random>: its
// images go once the forks have started, its copy of the parent's files
// stays as the forks' baseline for diffs, until the last of its forks
// has stopped (pruneForks, at each fork) or the server restarts (a diff
// is then ERR_NOT_FOUND; the server's start removes .forks). A fork that fails undoes the forks it
// made.
//
// A fork group's baseline is its account's storage while it is kept: its
// bytes count with the account's snapshots, in the store's
// snapshot_bytes that storage metering charges (meterSnapshots) and
// against --max-snapshot-mb-per-account (a fork of an account at its
// bound is refused before any checkpoint, ERR_STORAGE_QUOTA_EXCEEDED;
// one whose baseline passes it is undone). The images a fork restores
// from live only while its forks start.

// MaxForks bounds one fork request's count.
const MaxForks = 8

// forksDir is, under the snapshot dir, where forks' snapshots are kept.
const forksDir = ".forks"

// forkGroup is a fork group's baseline as metered: whose, how many bytes.
type forkGroup struct {
	owner string
	bytes int64
}

// forkBytes is what own's fork groups' baselines hold; snapMu is held.
func (s *Server) forkBytes(own string) int64 {
	var n int64
	for _, g := range s.forkGroups {
		if g.owner == own {
			n += g.bytes
		}
	}
	return n
}

// forkOf is what the server knows of a fork: its parent and the
// snapshot it started from.
type forkOf struct {
	parent string
	dir    string // the fork group's directory; its snapshot is dir/state
}

func (s *Server) forkRoutes(add addFunc) {
	add("POST /v1/sandboxes/{id}/fork", true, s.forkSandbox)
	add("GET /v1/sandboxes/{id}/diff", true, s.diffSandbox)
	add("POST /v1/sandboxes/{id}/adopt", true, s.adoptSandbox)
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > MaxForks {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "count"},
			Message: fmt.Sprintf("count must be 1 to %d, not %d", MaxForks, count)}
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	made, err := s.fork(context.WithoutCancel(r.Context()), owner(r), b, count, 0, nil)
	if err != nil {
		return err
	}
	out := api.ForkResult{Sandboxes: make([]api.Sandbox, 0, count)}
	for _, sb := range made {
		out.Sandboxes = append(out.Sandboxes, sandboxFromInfo(sb.Info()))
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// fork makes count forks of b for own, each living timeout (0: the
// default lifetime), with origin (E2B's, for forks made through its
// control plane; nil otherwise), all or none.
func (s *Server) fork(ctx context.Context, own string, b *box, count int, timeout time.Duration, origin *e2b.Origin) ([]*sandbox.Sandbox, error) {
	root, err := s.snapshots()
	if err != nil {
		return nil, err
	}
	s.pruneForks(root)
	s.snapMu.Lock()
	have, err := readSnapshots(root, own)
	if err == nil {
		err = s.admitSnapshotBytes(own, b.sb.ID, have, 0) // at its bound already: not even taken
	}
	s.snapMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(root, forksDir), 0o700); err != nil {
		return nil, err
	}
	// Made under a dot name, which pruneForks leaves alone, and renamed
	// once its forks have started.
	dir, err := os.MkdirTemp(filepath.Join(root, forksDir), ".new-"+b.sb.ID+"-")
	if err != nil {
		return nil, err
	}
	state := filepath.Join(dir, snapshotStateDir)
	if err := b.sb.Snapshot(ctx, state); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	rec := sourceOf(b)
	made := make([]*sandbox.Sandbox, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opt, execTimeout, err := s.recordOptions(rec, state)
			opt.Timeout = timeout
			if err == nil {
				made[i], err = s.create(ctx, own, opt, execTimeout, origin)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	// The images are the memory of the moment; the files stay as the
	// forks' baseline.
	if err := os.RemoveAll(filepath.Join(state, "images")); err != nil {
		s.log.Warn("remove a fork's images", "dir", dir, "err", err)
	}
	for _, err := range errs {
		if err == nil {
			continue
		}
		for _, sb := range made {
			if sb != nil {
				s.killHere(ctx, sb.ID)
			}
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
	group := filepath.Join(root, forksDir, strings.TrimPrefix(filepath.Base(dir), ".new-"))
	size := dirSize(dir)
	s.snapMu.Lock()
	have, err = readSnapshots(root, own)
	if err == nil {
		err = s.admitSnapshotBytes(own, b.sb.ID, have, size)
	}
	if err == nil {
		err = os.Rename(dir, group)
	}
	if err != nil {
		s.snapMu.Unlock()
		for _, sb := range made {
			s.killHere(ctx, sb.ID)
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if s.forks == nil {
		s.forks = map[string]forkOf{}
	}
	for _, sb := range made {
		s.forks[sb.ID] = forkOf{parent: b.sb.ID, dir: group}
	}
	if s.forkGroups == nil {
		s.forkGroups = map[string]forkGroup{}
	}
	s.forkGroups[group] = forkGroup{owner: own, bytes: size}
	s.meterSnapshots(root, own)
	s.snapMu.Unlock()
	s.log.Info("sandbox forked", "sandbox", b.sb.ID, "count", count)
	return made, nil
}

// killHere kills a sandbox this server holds and records its stop.
func (s *Server) killHere(ctx context.Context, id string) {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if err := s.recordKill(ctx, id); err != nil {
		s.log.Error("record an undone fork killed", "sandbox", id, "err", err)
	}
	if err := s.engine.Kill(ctx, id); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		s.log.Error("kill an undone fork", "sandbox", id, "err", err)
	}
	if b != nil {
		s.forget(ctx, b)
	}
}

// pruneForks removes the fork groups none of whose forks is held here
// any more, and what an earlier run left: at each fork, and when a fork
// stops (forget).
func (s *Server) pruneForks(root string) {
	s.mu.Lock()
	held := map[string]bool{}
	for id, b := range s.boxes {
		if b.sb != nil && live(b.sb) {
			held[id] = true
		}
	}
	s.mu.Unlock()
	s.snapMu.Lock()
	inUse := map[string]bool{}
	for id, f := range s.forks {
		if held[id] {
			inUse[f.dir] = true
		} else {
			delete(s.forks, id)
		}
	}
	// The baselines to be removed are no longer the accounts' storage.
	metered := map[string]bool{}
	for d, g := range s.forkGroups {
		if !inUse[d] {
			delete(s.forkGroups, d)
			metered[g.owner] = true
		}
	}
	for own := range metered {
		s.meterSnapshots(root, own)
	}
	s.snapMu.Unlock()
	ents, err := os.ReadDir(filepath.Join(root, forksDir))
	if err != nil {
		return
	}
	for _, e := range ents {
		d := filepath.Join(root, forksDir, e.Name())
		if !inUse[d] && !strings.HasPrefix(e.Name(), ".") {
			if err := os.RemoveAll(d); err != nil {
				s.log.Warn("remove a fork group", "dir", d, "err", err)
			}
		}
	}
}

func (s *Server) diffSandbox(w http.ResponseWriter, r *http.Request) error {
	against := r.URL.Query().Get("against")
	if against == "" {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "against"},
			Message: "against is required: the id of the sandbox this one was forked from"}
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	s.snapMu.Lock()
	f, ok := s.forks[b.sb.ID]
	s.snapMu.Unlock()
	if !ok || f.parent != against {
		return apierr.New(apierr.NotFound, "sandbox %s is not a fork of %s that this server made since its start", b.sb.ID, against)
	}
	ch, err := b.sb.Changes(r.Context(), filepath.Join(f.dir, snapshotStateDir))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.Diff{Against: against, Added: ch.Added, Changed: ch.Changed, Deleted: ch.Deleted})
	return nil
}

// adoptSandbox copies a fork's changes since the fork (its diff) into
// its parent, through both sandboxes' agents, acting as root inside
// each: what the fork added or changed is written into the parent (its
// directories made, its files' bytes and permission bits copied), what
// it deleted is removed from the parent. Each write is the parent's own
// file call, held to the parent's policy and walls as any file call is
// (a path it refuses is skipped, with why), and leaves what it makes
// owned by the fork's owner of it (by name); nothing is written from the
// host. The parent's files changed since the fork are overwritten where
// the fork changed the same paths.
func (s *Server) adoptSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := decodeJSON(w, r, &struct{}{}, true); err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	s.snapMu.Lock()
	f, ok := s.forks[b.sb.ID]
	s.snapMu.Unlock()
	if !ok {
		return apierr.New(apierr.NotFound, "sandbox %s is not a fork this server made since its start", b.sb.ID)
	}
	pb, err := s.lookupID(r.Context(), owner(r), f.parent)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	ch, err := b.sb.Changes(ctx, filepath.Join(f.dir, snapshotStateDir))
	if err != nil {
		return err
	}
	root := sandbox.AsUser("root")
	out := api.AdoptResult{Parent: f.parent, Copied: []string{}, Deleted: []string{}, Skipped: []api.AdoptSkipped{}}
	skip := func(p string, err error) {
		out.Skipped = append(out.Skipped, api.AdoptSkipped{Path: p, Reason: apierr.From(err).Message})
	}
	// Deletions first, deepest first: a path deleted and made again as
	// another type is then written afresh.
	for i := len(ch.Deleted) - 1; i >= 0; i-- {
		p := ch.Deleted[i]
		if err := pb.sb.Remove(ctx, p, root); err != nil && apierr.CodeOf(err) != apierr.NotFound {
			skip(p, err)
			continue
		}
		out.Deleted = append(out.Deleted, p)
	}
	for _, p := range slices.Sorted(slices.Values(slices.Concat(ch.Added, ch.Changed))) {
		fi, err := b.sb.Stat(ctx, p, root)
		if err != nil {
			skip(p, err)
			continue
		}
		// What is made in the parent has the fork's owner (by name).
		as := root
		if fi.Owner != "" {
			as = sandbox.OwnedBy(fi.Owner)
		}
		switch fi.Type {
		case agentproto.FileTypeDir:
			if _, err := pb.sb.MakeDir(ctx, p, as); err != nil && apierr.CodeOf(err) != apierr.Conflict {
				skip(p, err)
				continue
			}
		case agentproto.FileTypeFile:
			if err := copyFile(ctx, b.sb, pb.sb, p, fi.Mode, s.cfg.MaxUploadBytes, as); err != nil {
				skip(p, err)
				continue
			}
		default:
			out.Skipped = append(out.Skipped, api.AdoptSkipped{Path: p, Reason: fi.Type + ": only files and directories are copied"})
			continue
		}
		out.Copied = append(out.Copied, p)
	}
	s.log.Info("fork adopted", "sandbox", b.sb.ID, "parent", f.parent, "copied", len(out.Copied), "deleted", len(out.Deleted), "skipped", len(out.Skipped))
	writeJSON(w, http.StatusOK, out)
	return nil
}

// copyFile streams the file p of from (read as root inside it) into to,
// written as as, with its permission bits.
func copyFile(ctx context.Context, from, to *sandbox.Sandbox, p string, mode uint32, limit int64, as sandbox.FileOption) error {
	pr, pw := io.Pipe()
	read := make(chan error, 1)
	go func() {
		_, err := from.ReadFile(ctx, p, pw, limit, sandbox.AsUser("root"))
		pw.CloseWithError(err)
		read <- err
	}()
	_, err := to.WriteFile(ctx, p, pr, mode, limit, as)
	pr.CloseWithError(errors.New("the write ended"))
	if rerr := <-read; rerr != nil && err == nil {
		err = rerr
	}
	return err
}
