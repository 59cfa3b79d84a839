package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Paused sandboxes across restarts (Config.KeepPaused).
//
// A pause writes, beside the runtime's checkpoint and after it, what the
// engine knows of the sandbox and nothing else keeps (keptFile: its
// template, limits, env, metadata, owner, policy, the lifetime it has
// left and the network requests its gateway counted), root's alone
// (0600). A taken-back sandbox whose policy has a network gets a new
// gateway with that policy, counting on from the recorded requests,
// attached at its resume (network.go). Close leaves a paused sandbox as it is:
// the runtime keeps its bundle, writable layer, disk and host id range
// (runtime.CheckpointKeeper), the checkpoint stays in CheckpointDir. The
// next engine over the same runtime instance takes back, at New and
// before its reconcile destroys what else is left, every sandbox whose
// record reads back and whose checkpoint the runtime finds complete: a
// Sandbox in state paused, as it was, that Resume (or any request that
// needs its agent) restores. One whose record or checkpoint is missing
// or broken (a crash in the middle of its pause) is destroyed with the
// other leftovers, checkpoint and all; Lost says which, and why.

// keptFile names the engine's record of a paused sandbox in its
// checkpoint's directory.
const keptFile = "sheepfold-sandbox.json"

// keptVersion changes when keptRecord's layout does.
const keptVersion = 1

// keptRecord is what a later engine needs to take a paused sandbox back.
type keptRecord struct {
	Version  int               `json:"version"`
	ID       string            `json:"id"`
	Template string            `json:"template"`
	Limits   runtime.Limits    `json:"limits"`
	ReadOnly bool              `json:"read_only,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Created  time.Time         `json:"created"`
	Owner    string            `json:"owner,omitempty"`
	LeftMS   int64             `json:"left_ms"` // the lifetime it has left
	Policy   *policy.Policy    `json:"policy,omitempty"`
	Paused   time.Time         `json:"paused"`
	// AutoLifeMS, when set, is the lifetime of an auto-pause sandbox
	// (autopause.go): it pauses again when that ends.
	AutoLifeMS int64 `json:"auto_life_ms,omitempty"`
	// NetRequests is the network_requests its gateway had counted: the
	// next engine's gateway for it goes on from there (network.go).
	NetRequests int64 `json:"net_requests,omitempty"`
	// RootFS is the template root it runs on, which the next engine
	// holds again (holds.go): a tag moved since has another. Empty in
	// older records: the template's.
	RootFS string `json:"rootfs,omitempty"`
}

// writeKept records the paused sandbox in its checkpoint's directory dir.
func (s *Sandbox) writeKept(dir string, left time.Duration) error {
	s.mu.Lock()
	rec := keptRecord{Version: keptVersion, ID: s.ID, Template: s.Template, Limits: s.Limits, ReadOnly: s.ReadOnly,
		Env: s.Env, Metadata: s.Metadata, Created: s.Created, Owner: s.owner, LeftMS: left.Milliseconds(),
		Policy: s.pol.pol, Paused: time.Now().UTC(), RootFS: s.root}
	if s.auto.on {
		rec.AutoLifeMS = s.auto.life.Milliseconds()
	}
	s.mu.Unlock()
	if s.net != nil {
		rec.NetRequests = s.net.Requests()
	}
	j, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+keptFile)
	if err := os.WriteFile(tmp, j, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, keptFile))
}

// readKept reads the record of paused sandbox id.
func (m *Manager) readKept(id string) (keptRecord, error) {
	var rec keptRecord
	j, err := os.ReadFile(filepath.Join(m.checkpointPath(id), keptFile))
	if err != nil {
		return rec, fmt.Errorf("the engine's record of its pause is missing: %w", err)
	}
	if err := json.Unmarshal(j, &rec); err != nil || rec.Version != keptVersion || rec.ID != id {
		return rec, fmt.Errorf("the engine's record of its pause is not this sandbox's (%v)", err)
	}
	if rec.LeftMS <= 0 {
		return rec, errors.New("its lifetime had ended")
	}
	return rec, nil
}

// keep says whether Close leaves s to the next engine: it is paused to
// its checkpoint (not frozen: its memory would die with this process).
// Such a sandbox stays paused here, and is never resumed by this engine
// again (errKept), so that nothing restores it under Close.
func (s *Sandbox) keep() bool {
	s.lifeMu.Lock() // a pause or a resume in flight ends first
	defer s.lifeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StatePaused || s.frozen {
		return false
	}
	s.kept = true
	return true
}

// errKept is the error of a resume of a sandbox Close left to the next
// engine.
func (s *Sandbox) errKept() error {
	return apierr.New(apierr.Capacity, "the engine is shutting down; sandbox %s stays paused for the next start", s.ID)
}

// takeBack re-creates, paused, every sandbox an earlier engine left
// paused (Config.KeepPaused) and returns their ids; it records the others
// that had a checkpoint in Lost.
func (m *Manager) takeBack(ctx context.Context) map[string]bool {
	kept := map[string]bool{}
	if !m.cfg.KeepPaused || m.cfg.CheckpointDir == "" {
		return kept
	}
	ids, err := m.cfg.Runtime.List(ctx)
	if err != nil {
		return kept // reconcile says so
	}
	lost := map[string]string{}
	for _, id := range ids {
		if _, err := os.Stat(m.checkpointPath(id)); err != nil {
			continue // not paused: a leftover of a crash
		}
		s, err := m.takeBackOne(ctx, id)
		if err != nil {
			m.log.Error("a paused sandbox cannot be taken back after the restart; destroying it", "sandbox", id, "err", err)
			lost[id] = lostReason // the cause, with host paths, is the log's
			continue
		}
		m.mu.Lock()
		m.sandboxes[id] = s
		m.mu.Unlock()
		kept[id] = true
		m.log.Info("paused sandbox taken back", "sandbox", id, "left", s.left.Round(time.Second))
	}
	m.mu.Lock()
	m.lost = lost
	m.mu.Unlock()
	return kept
}

// takeBackOne re-creates paused sandbox id from its record.
func (m *Manager) takeBackOne(ctx context.Context, id string) (*Sandbox, error) {
	if _, err := m.checkpointer(); err != nil {
		return nil, err
	}
	k, ok := m.cfg.Runtime.(runtime.CheckpointKeeper)
	if !ok {
		return nil, fmt.Errorf("the runtime (%s) keeps no checkpointed sandbox across a restart", m.cfg.Runtime.Name())
	}
	rec, err := m.readKept(id)
	if err != nil {
		return nil, err
	}
	if err := k.Checkpointed(ctx, id, m.checkpointPath(id)); err != nil {
		return nil, err
	}
	kpol, err := kernelPolicy(rec.Policy)
	if err != nil {
		return nil, err
	}
	inst := &runtime.Instance{ID: id}
	s := &Sandbox{
		ID: id, Template: rec.Template, Limits: rec.Limits, ReadOnly: rec.ReadOnly, Env: rec.Env, Metadata: rec.Metadata,
		Created: rec.Created, m: m, owner: rec.Owner, inst: inst, created: make(chan struct{}),
		agent: newAgentClient(inst, m.agentCall, m.log.With("sandbox", id)),
		pol:   policyState{pol: rec.Policy, kernel: kpol, gen: 1},
		state: StatePaused, left: time.Duration(rec.LeftMS) * time.Millisecond,
		announced: true, // in the run that created it: its stop is reported
	}
	close(s.created)
	s.root = rec.RootFS
	if s.root == "" {
		s.root, _ = m.cfg.Templates.RootFS(rec.Template)
	}
	if s.root != "" {
		s.project = m.projectOf(rec.Template, s.root, nil)
	}
	// Its gateway, detached until the resume attaches it (network.go).
	if egressPolicy, err := policy.CompileEgress(rec.Policy.NetworkPolicy()); err != nil {
		return nil, err
	} else if egressPolicy.Enabled() {
		gw, err := egress.New(m.cfg.Egress, id, egressPolicy, rec.Policy.NetworkRequests())
		if err != nil {
			return nil, err
		}
		gw.SetRequests(rec.NetRequests)
		s.net = gw
	}
	if rec.AutoLifeMS > 0 {
		s.auto.on, s.auto.life = true, time.Duration(rec.AutoLifeMS)*time.Millisecond
		m.startAutoLoop()
	}
	s.lastActive = time.Now()
	// Held again before the engine sweeps the trees nothing holds.
	if s.root != "" {
		if err := m.holdRoot(id, s.root); err != nil {
			return nil, err
		}
	}
	s.timer = time.AfterFunc(s.left, func() { s.m.expire(s) })
	s.timer.Stop() // Resume starts it again
	return s, nil
}

// lostReason is Lost's word for a paused sandbox not taken back: what its
// owner may read.
const lostReason = "its checkpoint is missing or incomplete"

// Lost lists the paused sandboxes an earlier engine left that New could
// not take back (their checkpoint or record missing or broken: a crash
// in the middle of a pause), with why; New destroyed them.
func (m *Manager) Lost() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}
