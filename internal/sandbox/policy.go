package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path"
	"reflect"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/ratelimit"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// policyState is a sandbox's security policy and what its code contexts
// are told of it. gen counts changes; restartGen is the generation of the
// latest change that loosened a rule a running interpreter cannot drop.
type policyState struct {
	pol        *policy.Policy
	kernel     *agentproto.KernelPolicy
	gen        int64
	restartGen int64
	executions ratelimit.Bucket // rate_limiting.requests_per_minute
	// filter is the output filter of filterOf, the policy it was built
	// for with the sandbox's env (policyFilter, outfilter.go).
	filter   *policy.OutputFilter
	filterOf *policy.Policy
}

// takeExecution takes one execution from the policy's per-minute budget
// (rate_limiting.requests_per_minute): ERR_RATE_LIMITED with Retry-After
// once it is spent. A shared sandbox's budget is its agent's, which
// every replica takes from (agentbudget.go).
func (s *Sandbox) takeExecution(ctx context.Context) error {
	s.mu.Lock()
	limit := s.pol.pol.ExecutionsPerMinute()
	s.mu.Unlock()
	if limit <= 0 {
		return nil
	}
	if s.m.cfg.Shared {
		t, err := s.takeBudget(ctx, agentproto.BudgetSpec{Name: agentproto.BudgetExecutions, Limit: limit, PerMinute: true})
		switch {
		case err == nil && t.Allowed:
			return nil
		case err == nil:
			return executionsLimited(limit, time.Duration(t.RetryAfterMS)*time.Millisecond)
		case !errors.Is(err, errNoAgentBudgets):
			return err
		}
	}
	s.mu.Lock()
	res := s.pol.executions.Take(time.Now(), limit)
	s.mu.Unlock()
	if res.Allowed {
		return nil
	}
	return executionsLimited(res.Limit, res.RetryAfter)
}

// executionsLimited is the error of an execution past the sandbox's
// rate_limiting.
func executionsLimited(limit int64, retry time.Duration) error {
	return &apierr.Error{Code: apierr.RateLimited, RetryAfter: retry,
		Message: fmt.Sprintf("this sandbox's rate limit of %d executions per minute is reached (rate_limiting.requests_per_minute); retry in %.1f s",
			limit, retry.Seconds())}
}

// kernelPolicy is the part of p the code contexts enforce. Every sandbox
// has one, also without a policy: network mode "none" is the default.
func kernelPolicy(p *policy.Policy) (*agentproto.KernelPolicy, error) {
	k := &agentproto.KernelPolicy{
		DenySubprocess:   p.DenySubprocess(),
		AllowedImports:   policy.WithTwins(p.AllowedImports()),
		BlockedModules:   policy.WithTwins(p.BlockedModules()),
		DenyImportSystem: p.DenyImportSystem(),
		AllowNetwork:     p.NetworkMode() != policy.NetworkNone,
		CPUTimeMS:        p.CPUTime().Milliseconds(),
		FileSizeBytes:    p.FileSizeBytes(),
	}
	if k.DenySubprocess {
		prog, nr, err := policy.NoSubprocessFilter(goruntime.GOARCH)
		if err != nil {
			return nil, err
		}
		k.Seccomp, k.SeccompSyscall = prog, nr
	}
	return k, nil
}

// invalidPolicy turns a policy error into ERR_INVALID_POLICY.
func invalidPolicy(err error) error {
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		return &apierr.Error{Code: apierr.InvalidPolicy, Message: fe.Error(), Details: map[string]any{"field": fe.Field}}
	}
	return apierr.Wrap(err, apierr.InvalidPolicy, "invalid security policy: %v", err)
}

// applyCreatePolicy checks the policy and folds its read-only root into
// opt; its memory and disk are granted with the rest of the limits
// (Grant, ceiling.go).
func applyCreatePolicy(opt *CreateOptions) (*agentproto.KernelPolicy, error) {
	p := opt.Policy
	if err := p.Validate(); err != nil {
		return nil, invalidPolicy(err)
	}
	if p.ReadOnlyRoot() {
		opt.ReadOnly = true
	}
	k, err := kernelPolicy(p)
	if err != nil {
		return nil, apierr.Wrap(err, apierr.InvalidPolicy, "allow_subprocess: false is not available on this host: %v", err)
	}
	return k, nil
}

// EgressRequests is how many requests the sandbox has made through its
// egress gateway (connections, and plain HTTP requests after a
// connection's first); 0 without a network.
func (s *Sandbox) EgressRequests() int64 {
	if s.net == nil {
		return 0
	}
	return s.net.Requests()
}

// EgressBytes is how many bytes the sandbox's egress gateway carried to
// it (in) and from it (out): the payload of its TCP connections; 0
// without a network.
func (s *Sandbox) EgressBytes() (in, out int64) {
	if s.net == nil {
		return 0, 0
	}
	return s.net.Bytes()
}

// EgressDiagnosis summarises what the sandbox's egress gateway saw of
// its connections, link and stack (egress.Gateway.Diagnose); empty
// without a network.
func (s *Sandbox) EgressDiagnosis() string {
	if s.net == nil {
		return ""
	}
	return s.net.Diagnose()
}

// Policy returns the sandbox's security policy (nil: none given).
func (s *Sandbox) Policy() *policy.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pol.pol
}

// PolicyChange is what applying a policy did.
type PolicyChange struct {
	// Policy is the sandbox's policy now: the one applied, merged over
	// the one before (policy.Merge).
	Policy *policy.Policy
	// RestartRequired: the new policy loosens rules a running interpreter
	// cannot drop (Loosened names them); each code context restarts
	// before its next execution, and its state is lost.
	RestartRequired bool
	Loosened        []string
	// Resized: the sandbox's memory limit or writable layer changed.
	Resized bool
}

// SetPolicy applies next over the sandbox's security policy: each section
// next sets replaces the current one, each it leaves out stays
// (policy.Merge). Tightening takes effect at the next execution with the
// contexts' state kept. resource_limits.memory_mb and disk_write_mb
// resize the running sandbox (within the engine's maxima; the caller
// checks its account's). Filesystem rules are fixed at create: changing
// them is ERR_INVALID_POLICY.
func (s *Sandbox) SetPolicy(next *policy.Policy) (PolicyChange, error) {
	if err := next.Validate(); err != nil {
		return PolicyChange{}, invalidPolicy(err)
	}
	if err := s.running(); err != nil {
		return PolicyChange{}, err
	}
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	cur := s.Policy()
	p := policy.Merge(cur, next)
	k, err := kernelPolicy(p)
	if err != nil {
		return PolicyChange{}, apierr.Wrap(err, apierr.InvalidPolicy, "allow_subprocess: false is not available on this host: %v", err)
	}
	egressPolicy, err := policy.CompileEgress(p.NetworkPolicy())
	if err != nil {
		return PolicyChange{}, invalidPolicy(err)
	}
	// The network interface exists from the start or never: a sandbox
	// created without one cannot gain it.
	if s.net == nil && egressPolicy.Enabled() {
		return PolicyChange{}, invalidPolicy(&policy.FieldError{Field: "network.mode",
			Reason: "this sandbox was created without a network; create a new sandbox with network.mode " + egressPolicy.Mode})
	}
	if err := policy.FixedChange(cur, p); err != nil {
		return PolicyChange{}, invalidPolicy(err)
	}
	// Every replica holding a shared sandbox carries its egress with the
	// policy it adopted: a change made through one would not reach the
	// others' gateways, so the network rules are fixed there.
	if s.m.cfg.Shared && s.net != nil && !reflect.DeepEqual(cur.NetworkPolicy(), p.NetworkPolicy()) {
		return PolicyChange{}, invalidPolicy(&policy.FieldError{Field: "network",
			Reason: "the network rules of a sandbox served by several replicas are fixed when it is created; create a new sandbox to change them"})
	}
	resized, err := s.resize(p)
	if err != nil {
		return PolicyChange{}, err
	}
	ch := PolicyChange{Policy: p, Loosened: policy.Loosened(cur, p), Resized: resized}
	ch.RestartRequired = len(ch.Loosened) > 0
	s.mu.Lock()
	s.pol.gen++
	if ch.RestartRequired {
		s.pol.restartGen = s.pol.gen
	}
	s.pol.pol, s.pol.kernel = p, k
	if s.net != nil {
		s.net.SetPolicy(egressPolicy, p.NetworkRequests())
	}
	s.mu.Unlock()
	details := map[string]any{"restart_required": ch.RestartRequired}
	if len(ch.Loosened) > 0 {
		details["loosened"] = ch.Loosened
	}
	if resized {
		lim := s.CurrentLimits()
		details["memory_mb"], details["disk_mb"] = lim.MemoryBytes>>20, lim.DiskBytes>>20
	}
	s.emit(events.PolicyChanged, "", details)
	return ch, nil
}

// resize gives the running sandbox the memory limit and writable layer
// size p asks for (resource_limits.memory_mb, disk_write_mb), where they
// differ from the ones in force; s.policyMu is held.
func (s *Sandbox) resize(p *policy.Policy) (bool, error) {
	cur := s.CurrentLimits()
	want, ask := cur, runtime.Limits{}
	if b := p.MemoryBytes(); b > 0 && b != cur.MemoryBytes {
		if b > s.m.cfg.MaxLimits.MemoryBytes {
			return false, invalidPolicy(&policy.FieldError{Field: "resource_limits.memory_mb",
				Reason: fmt.Sprintf("%d MiB is above this server's most of %d MiB", b>>20, s.m.cfg.MaxLimits.MemoryBytes>>20)})
		}
		want.MemoryBytes, ask.MemoryBytes = b, b
	}
	if b := p.DiskBytes(); b > 0 && b != cur.DiskBytes {
		if b > s.m.cfg.MaxLimits.DiskBytes {
			return false, invalidPolicy(&policy.FieldError{Field: "resource_limits.disk_write_mb",
				Reason: fmt.Sprintf("%d MiB is above this server's most of %d MiB", b>>20, s.m.cfg.MaxLimits.DiskBytes>>20)})
		}
		want.DiskBytes = b
		// A read-only root with no writable path has no writable layer
		// to size (only the runtime's mount points live there).
		if !s.ReadOnly || len(s.Policy().WritablePaths()) > 0 {
			ask.DiskBytes = b
		}
	}
	if want == cur {
		return false, nil
	}
	if ask != (runtime.Limits{}) {
		rz, ok := s.m.cfg.Runtime.(runtime.Resizer)
		if !ok {
			return false, invalidPolicy(&policy.FieldError{Field: "resource_limits",
				Reason: "this server's runtime cannot change a running sandbox's memory or disk; create a new sandbox with them"})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rz.Resize(ctx, s.ID, ask); err != nil {
			if errors.Is(err, runtime.ErrTooSmall) || errors.Is(err, runtime.ErrCannotGrow) {
				return false, apierr.Wrap(err, apierr.InvalidPolicy, "resource_limits.disk_write_mb: %v", err)
			}
			return false, apierr.Wrap(err, apierr.SandboxState, "could not resize the running sandbox")
		}
	}
	s.mu.Lock()
	s.Limits = want
	s.mu.Unlock()
	return true, nil
}

// executePolicy fills an execution's policy fields.
func (s *Sandbox) executePolicy(spec *agentproto.ExecuteSpec) {
	s.mu.Lock()
	spec.Policy, spec.PolicyGen, spec.PolicyRestartGen = s.pol.kernel, s.pol.gen, s.pol.restartGen
	spec.StopAtOutputCap = s.pol.pol.StopOnOutputCap()
	s.mu.Unlock()
}

// violation reports what the code tried (an EventViolation) as a
// security_violation (with "count" when the agent coalesced repeated
// refusals into one report), or a resource_exceeded for the resources,
// recorded as the sandbox's or the agent's (reports.go).
func (s *Sandbox) violation(execID string, v *agentproto.Violation) {
	if v.Kind == "resource" {
		d := map[string]any{"resource": v.Target}
		switch v.Target {
		case "disk": // ENOSPC: the writable layer is full
			d["resource"], d["limit"], d["unit"] = events.ResourceDisk, s.CurrentLimits().DiskBytes, "bytes"
			if u, err := s.usage(context.Background()); err == nil {
				d["observed"] = u.DiskBytes
			}
		case "file_size": // EFBIG: a file reached RLIMIT_FSIZE
			limit := s.Policy().FileSizeBytes()
			d["resource"], d["limit"], d["observed"], d["unit"] = events.ResourceDisk, limit, limit, "bytes"
			d["rule"] = "resource_limits.file_size_upload_mb"
		}
		s.emitFrom(reportSource(v), events.ResourceExceeded, execID, d)
		return
	}
	details := map[string]any{"kind": v.Kind, "target": v.Target}
	if v.Count > 1 {
		details["count"] = v.Count // repeated refusals, coalesced by the agent
	}
	s.emitFrom(reportSource(v), events.SecurityViolation, execID, details)
}

// errorCodes maps the exceptions the kernels raise for policy refusals to
// the execution's error code.
var errorCodes = map[string]apierr.Code{
	"ModuleBlockedError":     apierr.ModuleBlocked,
	"NetworkRestrictedError": apierr.NetworkRestricted,
	"SubprocessDeniedError":  apierr.SubprocessDenied,
}

// checkWritable refuses a file call that would write outside the
// policy's writable paths, before it reaches the sandbox (whose read-only
// mounts refuse it anyway), and reports it.
func (s *Sandbox) checkWritable(req agentproto.Request) error {
	p := s.Policy()
	if !p.ReadOnlyRoot() {
		return nil
	}
	for _, target := range []string{req.Path, req.NewPath} {
		if target == "" {
			continue
		}
		if !strings.HasPrefix(target, "/") {
			home := "/home/user"
			if req.User == agentproto.UserRoot || req.Owner == agentproto.UserRoot {
				home = "/root"
			}
			target = path.Join(home, target)
		}
		target = path.Clean(target)
		if !p.Writable(target) {
			s.emit(events.SecurityViolation, "", map[string]any{"kind": events.KindPathDenied, "target": target})
			return apierr.New(apierr.PathNotAllowed, "%s is not writable: the sandbox's filesystem policy allows writes only under %s",
				target, strings.Join(p.WritablePaths(), ", "))
		}
	}
	return nil
}

// deniedByMount reports a write the sandbox's read-only mounts refused
// (a symlink out of a writable path, say) as path_denied.
func (s *Sandbox) deniedByMount(req agentproto.Request, err error) {
	if err == nil || apierr.CodeOf(err) != apierr.PathNotAllowed || !s.Policy().ReadOnlyRoot() {
		return
	}
	s.emit(events.SecurityViolation, "", map[string]any{"kind": events.KindPathDenied, "target": req.Path})
}
