package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

func (s *Server) sandboxRoutes(add addFunc) {
	add("POST /v1/sandboxes", true, s.createSandbox)
	add("GET /v1/sandboxes", true, s.listSandboxes)
	add("GET /v1/sandboxes/{id}", true, s.getSandbox)
	add("POST /v1/sandboxes/{id}/timeout", true, s.setTimeout)
	add("POST /v1/sandboxes/{id}/pause", true, s.pauseSandbox)
	add("POST /v1/sandboxes/{id}/resume", true, s.resumeSandbox)
	add("DELETE /v1/sandboxes/{id}", true, s.deleteSandbox)
}

func resourcesOf(l runtime.Limits) api.Resources {
	return api.Resources{CPUs: l.CPUs, MemoryMB: l.MemoryBytes >> 20, DiskMB: l.DiskBytes >> 20, Pids: l.Pids}
}

func liveUsageOf(u runtime.Usage) *api.LiveUsage {
	out := &api.LiveUsage{CPUSeconds: float64(u.CPUNanos) / 1e9, MemoryBytes: u.MemoryBytes, MemoryPeakBytes: u.MemoryPeakBytes,
		MemoryLimitBytes: u.MemoryLimit, Pids: u.Pids, DiskBytes: u.DiskBytes, OOMKills: int64(u.OOMKills)}
	if p := u.Pressure; p != nil {
		out.Pressure = &api.Pressure{CPUSomeAvg10: p.CPUSome, MemorySomeAvg10: p.MemorySome, MemoryFullAvg10: p.MemoryFull, IOSomeAvg10: p.IOSome, IOFullAvg10: p.IOFull}
	}
	return out
}

// usageParam reads the ?usage= switch.
func usageParam(r *http.Request) (bool, error) {
	switch v := r.URL.Query().Get("usage"); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, apierr.New(apierr.BadRequest, "usage must be 1 or 0, not %q", v)
	}
}

func sandboxFromInfo(in sandbox.Info) api.Sandbox {
	md := in.Metadata
	if md == nil {
		md = map[string]string{}
	}
	res := resourcesOf(in.Limits)
	res.GPU, res.Devices = in.GPUs, in.Devices
	return api.Sandbox{ID: in.ID, Template: in.Template, State: string(in.State), CreatedAt: in.Created.UTC(),
		ExpiresAt: in.Deadline.UTC(), Resources: res, Metadata: md, StopReason: in.StopReason, AutoPause: in.AutoPause,
		VolumeMounts: apiVolumeMounts(in.Volumes)}
}

func sandboxFromRecord(rec store.Sandbox) api.Sandbox {
	out := api.Sandbox{ID: rec.ID, Template: rec.Template, State: rec.State, CreatedAt: rec.CreatedAt.UTC(),
		ExpiresAt: rec.ExpiresAt.UTC(), StopReason: rec.StopReason, Metadata: map[string]string{}}
	_ = json.Unmarshal(rec.Metadata, &out.Metadata)
	_ = json.Unmarshal(rec.Resources, &out.Resources)
	return out
}

// The largest resources a request may name, far above any host and far
// below overflowing the engine's byte counts (memory_mb << 20 overflows
// int64 at 2^43). Admission then checks what the host can hold.
const (
	maxCPUs = bound.MaxCPUs
	maxMB   = bound.MaxMB // 1 PiB
	maxPids = 1 << 22
)

// seconds converts a positive number of seconds to a duration.
func seconds(field string, v float64, limit time.Duration) (time.Duration, error) {
	return bound.Seconds(field, v, limit)
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandbox
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	var opt sandbox.CreateOptions
	var execTimeout time.Duration
	var err error
	if req.Snapshot != "" {
		var release func()
		if opt, execTimeout, release, err = s.snapshotCreateOptions(owner(r), req); err != nil {
			return err
		}
		defer release()
	} else if opt, execTimeout, err = s.createOptions(req); err != nil {
		return err
	}
	sb, err := s.create(r.Context(), owner(r), opt, execTimeout, nil)
	if err != nil {
		return err
	}
	out := sandboxFromInfo(sb.Info())
	if sb.FromPool() {
		w.Header().Set("Sheepfold-Pool", "hit")
	} else {
		w.Header().Set("Sheepfold-Pool", "miss")
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// createOptions checks a create request (of a sandbox or a session) and
// returns the engine's options and the execution timeout
// (sandbox_config.max_execution_time).
func (s *Server) createOptions(req api.CreateSandbox) (sandbox.CreateOptions, time.Duration, error) {
	opt := sandbox.CreateOptions{Template: req.Template, Env: req.Env, Metadata: req.Metadata, Runtime: req.Runtime, AutoPause: req.AutoPause,
		Names: sandbox.FieldNames{CPUs: "resources.cpus", Memory: "resources.memory_mb", Disk: "resources.disk_mb",
			Pids: "resources.pids", Timeout: "timeout", PolicyMemory: "security_policy.resource_limits.memory_mb",
			PolicyDisk: "security_policy.resource_limits.disk_write_mb"}}
	opt.Volumes = volumeMounts(req.VolumeMounts)
	var err error
	if req.Timeout != nil {
		if opt.Timeout, err = seconds("timeout", *req.Timeout, s.cfg.MaxTimeout); err != nil {
			return opt, 0, err
		}
	}
	if res := req.Resources; res != nil {
		// The ceiling is decided by Grant (at create); here only what
		// would overflow the engine's byte counts.
		for _, f := range []struct {
			name string
			bad  bool
		}{
			{"resources.cpus", res.CPUs < 0 || res.CPUs > maxCPUs}, {"resources.memory_mb", res.MemoryMB < 0 || res.MemoryMB > maxMB},
			{"resources.disk_mb", res.DiskMB < 0 || res.DiskMB > maxMB}, {"resources.pids", res.Pids < 0 || res.Pids > maxPids},
			{"resources.gpu", res.GPU < 0 || res.GPU > sandbox.MaxDevices},
		} {
			if f.bad {
				return opt, 0, &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": f.name},
					Message: fmt.Sprintf("%s is out of range: resources must not be negative, and at most %d cpus, %d memory_mb and disk_mb, %d pids, %d gpu",
						f.name, maxCPUs, maxMB, maxPids, sandbox.MaxDevices)}
			}
		}
		opt.Limits = runtime.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20, Pids: res.Pids}
		opt.GPUs, opt.Devices = res.GPU, res.Devices
	}
	var execTimeout time.Duration
	if opt.Policy, err = parsePolicy(req.SecurityPolicy); err != nil {
		return opt, 0, err
	}
	if opt.Policy.MemoryBytes() == 0 {
		// Only the shorthand can set it now.
		opt.Names.PolicyMemory = "sandbox_config.max_memory_mb"
	}
	sc, err := policy.ParseShorthand(req.SandboxConfig, "sandbox_config")
	if err != nil {
		return opt, 0, invalidPolicy(err)
	}
	if sc != nil {
		if sc.MaxExecutionTime != nil {
			if execTimeout, err = seconds("sandbox_config.max_execution_time", *sc.MaxExecutionTime, 24*time.Hour); err != nil {
				return opt, 0, err
			}
		}
		if m := opt.Policy.MemoryBytes(); m > 0 && sc.MaxMemoryMB != nil && *sc.MaxMemoryMB<<20 != m {
			// Both ask for memory: one would go unheeded (and unchecked).
			return opt, 0, invalidPolicy(&policy.FieldError{Field: "sandbox_config.max_memory_mb",
				Reason: "disagrees with security_policy.resource_limits.memory_mb; give one of them"})
		}
		if opt.Policy, err = sc.Merge(opt.Policy, "sandbox_config"); err != nil {
			return opt, 0, invalidPolicy(err)
		}
	}
	return opt, execTimeout, nil
}

// create starts a sandbox for own and records it, with origin when E2B's
// control plane created it. The sandbox does not die with the request's
// context.
func (s *Server) create(ctx context.Context, own string, opt sandbox.CreateOptions, execTimeout time.Duration, origin *e2b.Origin) (*sandbox.Sandbox, error) {
	if err := checkStrings("metadata", opt.Metadata, maxMetadata); err != nil {
		return nil, err
	}
	if err := checkStrings("env", opt.Env, maxEnv); err != nil {
		return nil, err
	}
	if err := s.checkPolicySecrets(ctx, own, opt.Policy, opt.Env); err != nil {
		return nil, err
	}
	if err := s.resolveVolumes(ctx, own, opt.Volumes); err != nil {
		return nil, err
	}
	if s.draining.Load() {
		return nil, apierr.New(apierr.ShuttingDown, "the server is shutting down")
	}
	// The account's limits first (its ceiling, then a slot of its
	// concurrent cap), then a slot and the footprint of the server's, so
	// that concurrent creates pass no cap.
	ad, err := s.admitCreate(ctx, own, &opt)
	if err != nil {
		return nil, err
	}
	need := s.engine.Footprint(opt.Limits)
	s.mu.Lock()
	if err := s.admit(need); err != nil {
		s.mu.Unlock()
		ad.release(s.store)
		return nil, err
	}
	placeholder := "pending-" + newID("")
	s.boxes[placeholder] = &box{owner: own, footprint: need}
	s.mu.Unlock()
	release := func() {
		s.mu.Lock()
		delete(s.boxes, placeholder)
		s.mu.Unlock()
		ad.release(s.store)
	}

	opt.Owner = own
	opt.Env = s.egressTrustEnv(opt.Policy, opt.Env)
	start := time.Now()
	sb, err := s.engine.Create(context.WithoutCancel(ctx), opt)
	if err != nil {
		release()
		return nil, err
	}
	s.metrics.Created(sb, time.Since(start))
	s.started(sb, ad.acct)
	s.trustEgress(ctx, sb)
	info := sb.Info()
	out := sandboxFromInfo(info)
	md, _ := json.Marshal(out.Metadata)
	res, _ := json.Marshal(recordResources{Resources: out.Resources, MaxExecutionMS: execTimeout.Milliseconds(), E2B: origin})
	rec := store.Sandbox{ID: sb.ID, Owner: own, Template: info.Template, State: store.SandboxRunning,
		CreatedAt: info.Created, ExpiresAt: info.Deadline, Metadata: md, Resources: res}
	if p := sb.Policy(); p != nil {
		rec.Policy = policyJSON(p)
	}
	// The record takes over the create's reservation, if it had one.
	put := func() error { return s.store.PutSandbox(context.WithoutCancel(ctx), rec) }
	if ad.holder != "" {
		put = func() error { return s.store.ConfirmSandbox(context.WithoutCancel(ctx), ad.holder, rec) }
	}
	if err := put(); err != nil {
		s.mu.Lock()
		delete(s.boxes, placeholder)
		s.mu.Unlock()
		_ = s.engine.Kill(context.Background(), sb.ID) // gives the account's slot back
		ad.drop(s.store)
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	s.mu.Lock()
	delete(s.boxes, placeholder)
	s.boxes[sb.ID] = &box{sb: sb, owner: own, execTimeout: execTimeout, footprint: s.engine.Footprint(info.Limits)}
	s.mu.Unlock()
	return sb, nil
}

// admit checks that one more sandbox of footprint need fits the server's
// caps. s.mu is held.
func (s *Server) admit(need int64) error {
	if s.cfg.MaxSandboxes > 0 && len(s.boxes)+s.pooled.count >= s.cfg.MaxSandboxes {
		return &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("all %d sandbox slots of this server are in use", s.cfg.MaxSandboxes)}
	}
	if s.cfg.HostMemoryBytes <= 0 {
		return nil
	}
	capacity := int64(float64(s.cfg.HostMemoryBytes) * s.cfg.Overcommit)
	used := s.pooled.bytes // the snapshot pools' members (snappool.go)
	for _, b := range s.boxes {
		used += b.footprint
	}
	if used+need > capacity {
		return &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("the host cannot hold another sandbox of %d MiB of memory: %d of %d MiB are committed",
				need>>20, used>>20, capacity>>20)}
	}
	return nil
}

// stringsLimit bounds a map of strings a sandbox keeps (metadata, env).
type stringsLimit struct {
	keys, keyBytes, valueBytes, totalBytes int
}

var (
	maxMetadata = stringsLimit{keys: 100, keyBytes: 256, valueBytes: 4 << 10, totalBytes: 64 << 10}
	maxEnv      = stringsLimit{keys: 1000, keyBytes: 1 << 10, valueBytes: 128 << 10, totalBytes: 1 << 20}
)

// checkStrings refuses a map over its limits, with an empty key, or with
// NUL bytes (env names may not contain '=' either).
func checkStrings(field string, m map[string]string, l stringsLimit) error {
	if len(m) > l.keys {
		return apierr.New(apierr.BadRequest, "%s has %d keys; at most %d are allowed", field, len(m), l.keys)
	}
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return apierr.New(apierr.BadRequest, "%s keys must not be empty", field)
		case len(k) > l.keyBytes:
			return apierr.New(apierr.BadRequest, "%s keys must be at most %d bytes", field, l.keyBytes)
		case len(v) > l.valueBytes:
			return apierr.New(apierr.BadRequest, "%s values must be at most %d bytes (%q is %d)", field, l.valueBytes, k, len(v))
		case strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return apierr.New(apierr.BadRequest, "%s must not contain NUL bytes", field)
		case field == "env" && strings.ContainsRune(k, '='):
			return apierr.New(apierr.BadRequest, "env names must not contain '='")
		}
		total += len(k) + len(v)
	}
	if total > l.totalBytes {
		return apierr.New(apierr.BadRequest, "%s is %d bytes; at most %d are allowed", field, total, l.totalBytes)
	}
	return nil
}

// notFound is the answer for a sandbox the caller may not see.
func notFound(id string) error {
	return apierr.New(apierr.SandboxNotFound, "sandbox %q not found", id)
}

// lookup returns the caller's running sandbox. A sandbox of another owner
// is not found; the caller's own stopped sandbox (timed out, killed,
// or from before a restart) is ERR_SANDBOX_STATE with the reason it
// stopped.
func (s *Server) lookup(r *http.Request) (*box, error) {
	id := r.PathValue("id")
	setSandbox(r, id)
	return s.lookupID(r.Context(), owner(r), id)
}

// lookupID is lookup for an owner and id.
func (s *Server) lookupID(ctx context.Context, own, id string) (*box, error) {
	if s.shared() {
		return s.lookupShared(ctx, own, id)
	}
	s.mu.Lock()
	b, ok := s.boxes[id]
	s.mu.Unlock()
	if ok && b.sb != nil && b.owner == own {
		if live(b.sb) {
			return b, nil
		}
		s.forget(ctx, b)
	} else if ok {
		return nil, notFound(id)
	}
	rec, err := s.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != own {
		return nil, notFound(id)
	}
	if err != nil {
		return nil, err
	}
	if rec.State == store.SandboxRunning {
		// Recorded but not held here: being created, or left from a run
		// that ended without recording its stop.
		return nil, notFound(id)
	}
	msg := fmt.Sprintf("sandbox %s is %s", id, rec.State)
	if rec.StopReason != "" {
		msg += " (" + rec.StopReason + ")"
	}
	return nil, apierr.New(apierr.SandboxState, "%s", msg)
}

// forget drops a stopped sandbox from memory and records its stop.
//
// The stop is recorded before forget returns even when the periodic sweep
// (RecordStopped) took the box out of the table first and is still
// writing: a kill's reply must find the record stopped, for every replica
// reads that record next (StopSandbox keeps the first stop).
func (s *Server) forget(ctx context.Context, b *box) {
	s.mu.Lock()
	if s.boxes[b.sb.ID] == b {
		delete(s.boxes, b.sb.ID)
	}
	s.mu.Unlock()
	if !b.sb.Released() {
		s.recordStop(ctx, b)
	}
	s.snapMu.Lock()
	_, forked := s.forks[b.sb.ID]
	s.snapMu.Unlock()
	if root, err := s.snapshots(); forked && err == nil {
		s.pruneForks(root) // its group's baseline may be the last of it (fork.go)
	}
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	withUsage, err := usageParam(r)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if apierr.CodeOf(err) == apierr.SandboxState {
		// A stopped sandbox of the caller's is still shown, as stopped.
		rec, rerr := s.store.GetSandbox(r.Context(), r.PathValue("id"))
		if rerr != nil {
			return rerr
		}
		writeJSON(w, http.StatusOK, sandboxFromRecord(rec))
		return nil
	}
	if err != nil {
		return err
	}
	out := sandboxFromInfo(b.sb.Info())
	if withUsage {
		if u, err := b.sb.Usage(r.Context()); err == nil {
			out.Usage = liveUsageOf(u)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	state := r.URL.Query().Get("state")
	if state != "" && state != "all" && state != "running" && state != "paused" {
		return apierr.New(apierr.BadRequest, "state must be running, paused or all")
	}
	withUsage, err := usageParam(r)
	if err != nil {
		return err
	}
	s.RecordStopped(r.Context())
	own := owner(r)
	filter := store.SandboxFilter{Owner: own, Live: state != "all"}
	limit, err := pageLimit(r)
	if err != nil {
		return err
	}
	// One more than the page tells whether there is a next one. A cursor
	// is a sandbox of the caller's (the next of a page): anything else is
	// refused, not answered with an empty page.
	if c := r.URL.Query().Get("cursor"); c != "" {
		if rec, err := s.store.GetSandbox(r.Context(), c); errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != own {
			return bound.Error("cursor", "must be the next of a previous page of this listing")
		} else if err != nil {
			return err
		}
	}
	filter.After, filter.Limit = r.URL.Query().Get("cursor"), limit+1
	recs, err := s.store.ListSandboxes(r.Context(), filter)
	if err != nil {
		return err
	}
	next := ""
	if len(recs) > limit {
		recs = recs[:limit]
		next = recs[limit-1].ID
	}
	s.mu.Lock()
	live := make(map[string]*sandbox.Sandbox, len(s.boxes))
	for id, b := range s.boxes {
		if b.sb != nil && b.owner == own {
			live[id] = b.sb
		}
	}
	s.mu.Unlock()
	out := make([]api.Sandbox, 0, len(recs))
	for _, rec := range recs {
		if sb, ok := live[rec.ID]; ok {
			j := sandboxFromInfo(sb.Info())
			if (state == "running" || state == "paused") && j.State != state {
				continue // the store knows them as live; the engine which
			}
			if withUsage {
				if cpu, mem, ok := s.meter.Now(rec.ID); ok {
					j.Usage = &api.LiveUsage{CPUSeconds: cpu.Seconds(), MemoryBytes: mem}
				}
			}
			out = append(out, j)
		} else if rec.State == store.SandboxStopped || s.shared() {
			out = append(out, sandboxFromRecord(rec))
		}
		// A record still "running" that this server does not hold is
		// about to be swept; leave it out (unless another replica holds
		// it: shared.go).
	}
	page := map[string]any{"sandboxes": out}
	if next != "" {
		page["next"] = next
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// Pages of lists: ?limit=N (default and most maxPage), ?cursor= the
// previous page's "next".
const maxPage = 1000

func pageLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return maxPage, nil
	}
	n, err := bound.ParseInt("limit", v, 1, maxPage)
	return int(n), err
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req api.SetTimeout
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Timeout == nil {
		return apierr.New(apierr.BadRequest, "timeout is required")
	}
	d, err := seconds("timeout", *req.Timeout, s.cfg.MaxTimeout)
	if err != nil {
		return err
	}
	if err := s.checkTimeout(r.Context(), owner(r), d); err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.SetTimeout(r.Context(), d); err != nil {
		return err
	}
	info := b.sb.Info()
	if err := s.store.UpdateSandboxExpiry(r.Context(), info.ID, info.Deadline); err != nil {
		return fmt.Errorf("record timeout: %w", err)
	}
	writeJSON(w, http.StatusOK, sandboxFromInfo(info))
	return nil
}

// deleteSandbox kills a sandbox. Deleting the caller's own sandbox that
// has already stopped succeeds too: the call is idempotent.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	b, err := s.lookup(r)
	if s.shared() && apierr.CodeOf(err) == apierr.Internal {
		if err := s.killUnreachable(context.WithoutCancel(r.Context()), owner(r), r.PathValue("id")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if apierr.CodeOf(err) == apierr.SandboxState {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.recordKill(r.Context(), b.sb.ID); err != nil {
		return err
	}
	if err := s.engine.Kill(context.WithoutCancel(r.Context()), b.sb.ID); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
		return err
	}
	s.forget(r.Context(), b)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// live reports whether a sandbox held here is running or paused (a
// request that needs it resumes it).
func live(sb *sandbox.Sandbox) bool {
	st := sb.State()
	return st == sandbox.StateRunning || st == sandbox.StatePaused
}

// pauseSandbox checkpoints a sandbox and frees its memory and processes,
// or with memory "keep" freezes it (internal/sandbox, pause.go); a
// paused sandbox is paused again without error.
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if req.Memory != "" && req.Memory != "disk" && req.Memory != "keep" {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "memory"},
			Message: fmt.Sprintf("memory must be disk or keep, not %q", req.Memory)}
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	pause := b.sb.Pause
	if req.Memory == "keep" {
		pause = b.sb.Freeze
	}
	if err := pause(context.WithoutCancel(r.Context())); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxFromInfo(b.sb.Info()))
	return nil
}

// resumeSandbox restores a paused sandbox; a running one is resumed
// without error.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := decodeJSON(w, r, &struct{}{}, true); err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.Resume(context.WithoutCancel(r.Context())); err != nil {
		return err
	}
	info := b.sb.Info()
	if err := s.store.UpdateSandboxExpiry(r.Context(), info.ID, info.Deadline); err != nil {
		return fmt.Errorf("record the resumed sandbox's expiry: %w", err)
	}
	writeJSON(w, http.StatusOK, sandboxFromInfo(info))
	return nil
}
