package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Replicas. When the engine shares its sandboxes (sandbox.Config.Shared:
// the Kubernetes backend, where sandboxes are Pods), several servers over
// one store serve every sandbox, and each sandbox outlives the server
// that created it:
//
//   - The record decides. Every lookup reads it: a sandbox another
//     replica stopped is released here (not destroyed), and a running one
//     this replica does not hold is adopted (sandbox.Manager.Adopt), then
//     served as if created here. Streams and previews need no routing:
//     each replica reaches every agent itself.
//   - Starting and stopping a replica leave sandboxes and records alone.
//   - The collector (collect), in every replica, compares the runtime's
//     inventory with the records: it destroys sandboxes no record claims
//     (past a grace for creates in flight; warm pool members end on their
//     own when their replica is gone, at their lease, which their agent
//     holds from its start: runtime.Spec.Lifetime) and ends records whose
//     sandbox is gone or ended. Collecting twice is harmless.
//
//   - Each replica has a name, new at every start, and a heartbeat in the
//     store (store.ReplicaStore) that it renews every CollectInterval and
//     that lasts replicaLapses of them; each execution it records names
//     it. The collector of every replica ends the executions still
//     recorded as running by replicas whose heartbeat lapsed: they died,
//     since a live one renews it long before (a replica that could not
//     reach the store for that long, and lives, writes the true outcome
//     over it when its execution ends). A replica restarted under the
//     same Pod is a new name, so its previous self's executions end
//     this way too. A replica that stops lets its heartbeat lapse at
//     once and ends its own (retire).
//
// What each replica keeps to itself: ports made public through /v1
// (preview.go). Per-minute rate limits are not: an account's are counted
// in the shared store (store.RateStore), a sandbox policy's by its agent
// (internal/sandbox, agentbudget.go). Usage is metered by the one replica holding a
// sandbox's meter lease (internal/metering).

// collectGrace is how long a sandbox may exist without a record (a
// create in flight) and a record without its sandbox, before the
// collector acts.
var collectGrace = 2 * time.Minute

// DefaultCollectInterval is how often replicas run the collector.
const DefaultCollectInterval = 15 * time.Second

// replicaLapses is how many CollectIntervals a replica's heartbeat
// lasts: one missed renewal, or a slow store, does not make it dead.
const replicaLapses = 4

// cutByStop is the error message of an execution ended because the
// replica running it stopped or died (its code is ERR_INTERNAL, as for
// "server restarted" on one box).
const cutByStop = "the server running it stopped"

// newReplicaID returns a new replica name: the host's (the Pod's) name
// and a random part.
func newReplicaID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "replica"
	}
	return newID(host + "-")
}

// heartbeat renews this replica's heartbeat.
func (s *Server) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CollectInterval)
	defer cancel()
	if err := s.store.Heartbeat(ctx, s.replica, time.Now().Add(replicaLapses*s.cfg.CollectInterval)); err != nil {
		s.log.Error("replica heartbeat", "replica", s.replica, "err", err)
	}
}

// heartbeats renews the heartbeat every CollectInterval until Shutdown,
// apart from the collector, which may be slow (it lists Pods).
func (s *Server) heartbeats() {
	defer s.sweeper.Done()
	t := time.NewTicker(s.cfg.CollectInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.heartbeat(context.Background())
		}
	}
}

// endLapsed ends the executions of replicas that died.
func (s *Server) endLapsed(ctx context.Context) {
	n, err := s.store.EndLapsedExecutions(ctx, time.Now(), string(apierr.Internal), cutByStop)
	if err != nil {
		s.log.Error("collector: end the executions of stopped replicas", "err", err)
	} else if n > 0 {
		s.log.Info("collector: ended executions of stopped replicas", "count", n)
	}
}

// retire ends this replica's heartbeat, and the executions it still
// records as running (Shutdown waited for what it could): the others
// need not wait for the heartbeat to lapse.
func (s *Server) retire() {
	if s.replica == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.store.Heartbeat(ctx, s.replica, time.Time{}); err != nil {
		s.log.Error("end replica heartbeat", "replica", s.replica, "err", err)
		return
	}
	s.endLapsed(ctx)
}

// recordResources is what a sandbox's record keeps in its resources
// column: the API's resources, and what a replica adopting the sandbox
// needs besides (its execution timeout, and what the E2B control plane
// knew of it). The API shows only the resources.
type recordResources struct {
	api.Resources
	MaxExecutionMS int64       `json:"max_execution_ms,omitempty"`
	E2B            *e2b.Origin `json:"e2b,omitempty"`
}

// shared reports whether this server shares its sandboxes with others.
func (s *Server) shared() bool { return s.engine != nil && s.engine.Shared() }

// lookupShared is lookupID for shared sandboxes: the record decides.
func (s *Server) lookupShared(ctx context.Context, own, id string) (*box, error) {
	rec, err := s.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != own {
		return nil, notFound(id)
	}
	if err != nil {
		return nil, err
	}
	return s.lookupRecord(ctx, rec)
}

// lookupRecord is lookupShared for a record already read (by a caller
// that had to read it to learn the owner).
func (s *Server) lookupRecord(ctx context.Context, rec store.Sandbox) (*box, error) {
	id := rec.ID
	s.mu.Lock()
	b, held := s.boxes[id]
	s.mu.Unlock()
	held = held && b.sb != nil
	if rec.State != store.SandboxRunning {
		if held {
			s.drop(b, rec.StopReason) // another replica stopped it
		}
		return nil, stoppedErr(rec)
	}
	if held {
		if b.sb.State() == sandbox.StateRunning {
			b.sb.Follow(rec.ExpiresAt) // another replica may have moved it
			return b, nil
		}
		s.forget(ctx, b) // stopped here: record it
		return nil, apierr.New(apierr.SandboxState, "sandbox %s is %s (%s)", id, b.sb.State(), b.sb.Info().StopReason)
	}
	return s.adopt(ctx, rec)
}

// stoppedErr is the error for a stopped sandbox's record.
func stoppedErr(rec store.Sandbox) error {
	msg := fmt.Sprintf("sandbox %s is %s", rec.ID, rec.State)
	if rec.StopReason != "" {
		msg += " (" + rec.StopReason + ")"
	}
	return apierr.New(apierr.SandboxState, "%s", msg)
}

// adopt takes a running sandbox another replica created into this one.
func (s *Server) adopt(ctx context.Context, rec store.Sandbox) (*box, error) {
	var res recordResources
	md := map[string]string{}
	if err := errors.Join(unmarshalObject(rec.Resources, &res), unmarshalObject(rec.Metadata, &md)); err != nil {
		return nil, fmt.Errorf("sandbox %s's record: %w", rec.ID, err)
	}
	pol, err := parsePolicy(rec.Policy)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s's recorded policy: %w", rec.ID, err)
	}
	limits := runtime.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20, Pids: res.Pids}
	sb, err := s.engine.Adopt(ctx, sandbox.AdoptOptions{ID: rec.ID, Template: rec.Template, Limits: limits, Metadata: md,
		Created: rec.CreatedAt, Deadline: rec.ExpiresAt, Policy: pol, Owner: rec.Owner})
	if apierr.CodeOf(err) == apierr.SandboxNotFound {
		// Recorded as running, and nothing runs: it ended while no
		// replica held it (its lifetime, a crash, its node's loss).
		reason := sandboxGone
		if time.Now().After(rec.ExpiresAt) {
			reason = store.ReasonTimedOut
		}
		if serr := s.store.StopSandbox(ctx, rec.ID, reason, time.Now()); serr != nil {
			return nil, serr
		}
		rec.State, rec.StopReason = store.SandboxStopped, reason
		return nil, stoppedErr(rec)
	}
	if err != nil {
		return nil, err
	}
	b := &box{sb: sb, owner: rec.Owner, execTimeout: time.Duration(res.MaxExecutionMS) * time.Millisecond, footprint: s.engine.Footprint(limits)}
	s.mu.Lock()
	if other, ok := s.boxes[rec.ID]; ok && other.sb != nil {
		s.mu.Unlock()
		return other, nil // a concurrent lookup adopted it first
	}
	s.boxes[rec.ID] = b
	s.mu.Unlock()
	if res.E2B != nil {
		s.e2b.Adopted(rec.ID, *res.E2B)
	}
	if !s.cfg.NoAccounting {
		if a, err := s.accounts.Get(ctx, rec.Owner); err == nil {
			// Counted, and metered by whichever replica holds its
			// meter lease (internal/metering).
			a.HoldSandbox()
			s.tenants.Store(rec.ID, &tenant{acct: a})
			s.meter.Adopt(sb, a)
			if st := sb.State(); st == sandbox.StateStopping || st == sandbox.StateStopped {
				s.meter.Stop(sb)
				s.release(rec.ID)
			}
		}
	}
	return b, nil
}

// sandboxGone is the stop reason of a sandbox whose Pod is gone.
const sandboxGone = "the sandbox stopped unexpectedly"

func unmarshalObject(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return nil
	}
	return json.Unmarshal(raw, v)
}

// drop lets go of a sandbox another replica stopped: nothing is
// destroyed and nothing recorded.
func (s *Server) drop(b *box, reason string) {
	s.engine.Release(b.sb.ID, reason)
	s.mu.Lock()
	if s.boxes[b.sb.ID] == b {
		delete(s.boxes, b.sb.ID)
	}
	s.mu.Unlock()
}

// collect is the replicas' garbage collector (see the top of this file).
func (s *Server) collect(ctx context.Context) {
	if s.replica != "" {
		s.endLapsed(ctx)
	}
	held, err := s.engine.Inventory(ctx)
	if err != nil {
		s.log.Error("collector: list sandboxes", "err", err)
		return
	}
	recs, err := s.store.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true, State: store.SandboxRunning})
	if err != nil {
		s.log.Error("collector: list records", "err", err)
		return
	}
	now := time.Now()
	running := make(map[string]store.Sandbox, len(recs))
	for _, r := range recs {
		running[r.ID] = r
	}
	exists := make(map[string]bool, len(held))
	for _, h := range held {
		exists[h.ID] = true
		rec, recorded := running[h.ID]
		switch {
		case recorded && h.Ended:
			reason := sandboxGone
			if now.After(rec.ExpiresAt) {
				reason = store.ReasonTimedOut
			}
			s.collectOne(ctx, h.ID, reason, true)
		case h.Pool && h.Ended:
			// A warm pool member whose replica died: it ended itself
			// (its lease ran out), whatever its age, and nobody else
			// will destroy its objects.
			s.collectOne(ctx, h.ID, "warm pool member ended", false)
		case recorded, now.Sub(h.Created) < collectGrace, h.Pool, !h.Ended && now.Before(h.Until):
			// A live sandbox, a create in flight, a live warm pool
			// member (which ends itself when its replica is gone), or a
			// volume's attendant within its lifetime (which ends itself
			// then: runtime.Held.Until), which a replica may be serving
			// a long call through.
		default:
			s.collectOne(ctx, h.ID, "no record", false)
		}
	}
	for id, rec := range running {
		if !exists[id] && now.Sub(rec.CreatedAt) > collectGrace {
			reason := sandboxGone
			if now.After(rec.ExpiresAt) {
				reason = store.ReasonTimedOut
			}
			s.collectOne(ctx, id, reason, true)
		}
	}
	// Sandboxes held here that another replica stopped.
	s.mu.Lock()
	var stale []*box
	for id, b := range s.boxes {
		if _, ok := running[id]; !ok && b.sb != nil && b.sb.State() == sandbox.StateRunning {
			stale = append(stale, b)
		}
	}
	s.mu.Unlock()
	for _, b := range stale {
		rec, err := s.store.GetSandbox(ctx, b.sb.ID)
		if err == nil && rec.State != store.SandboxRunning {
			s.drop(b, rec.StopReason)
		}
	}
}

// collectOne destroys a sandbox and, when it has a running record,
// records it stopped for reason.
func (s *Server) collectOne(ctx context.Context, id, reason string, recorded bool) {
	s.log.Info("collector: destroying a sandbox", "sandbox", id, "reason", reason)
	if err := s.engine.Collect(ctx, id, reason); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		s.log.Error("collector: destroy", "sandbox", id, "err", err)
		return
	}
	if !recorded {
		return
	}
	if err := s.store.StopSandbox(ctx, id, reason, time.Now()); err != nil {
		s.log.Error("collector: record the stop", "sandbox", id, "err", err)
	}
	s.mu.Lock()
	b, ok := s.boxes[id]
	if ok && b.sb != nil && b.sb.State() != sandbox.StateRunning {
		delete(s.boxes, id) // destroyed here: recorded just now
	}
	s.mu.Unlock()
}

// runningShared lists the running sandboxes of owner ("": of every
// owner) as their records say: held here, or adopted now. A sandbox held
// here whose record says it stopped (another replica stopped it) is
// released, not listed.
func (s *Server) runningShared(ctx context.Context, owner string) []*sandbox.Sandbox {
	recs, err := s.store.ListSandboxes(ctx, store.SandboxFilter{Owner: owner, AnyOwner: owner == "", State: store.SandboxRunning})
	if err != nil {
		s.log.Error("list sandboxes of other replicas", "err", err)
		return nil
	}
	running := make(map[string]bool, len(recs))
	var out []*sandbox.Sandbox
	for _, rec := range recs {
		running[rec.ID] = true
		s.mu.Lock()
		b, held := s.boxes[rec.ID]
		s.mu.Unlock()
		if !held || b.sb == nil {
			if b, err = s.adopt(ctx, rec); err != nil {
				s.log.Debug("adopt a sandbox for a listing", "sandbox", rec.ID, "err", err)
				continue
			}
		}
		if b.sb.State() == sandbox.StateRunning {
			out = append(out, b.sb)
		}
	}
	s.mu.Lock()
	var stale []*box
	for id, b := range s.boxes {
		if b.sb != nil && !running[id] && (owner == "" || b.owner == owner) && b.sb.State() == sandbox.StateRunning {
			stale = append(stale, b)
		}
	}
	s.mu.Unlock()
	for _, b := range stale {
		if rec, err := s.store.GetSandbox(ctx, b.sb.ID); err == nil && rec.State != store.SandboxRunning {
			s.drop(b, rec.StopReason)
		}
	}
	return out
}

// recordKill records a shared sandbox killed before it is destroyed: the
// record decides for every replica, and none may find it running once
// the kill has begun (a stream this replica serves ends as the Pod goes,
// and the client at once asks another replica whether it runs). Should
// the destroy then fail, the collector ends the Pod no record claims. On
// one box the stop is recorded after (forget).
func (s *Server) recordKill(ctx context.Context, id string) error {
	if !s.shared() {
		return nil
	}
	return s.store.StopSandbox(context.WithoutCancel(ctx), id, "killed", time.Now())
}

// killUnreachable destroys a sandbox this replica cannot reach though its
// record says it runs (its Pod's node lost its kubelet, and this replica
// reaches agents through port-forward): a kill must not depend on the
// agent answering.
func (s *Server) killUnreachable(ctx context.Context, own, id string) error {
	rec, err := s.store.GetSandbox(ctx, id)
	if err != nil || rec.Owner != own {
		return notFound(id)
	}
	if err := s.engine.Collect(ctx, id, "killed"); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		return err
	}
	return s.store.StopSandbox(ctx, id, "killed", time.Now())
}
