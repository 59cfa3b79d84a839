package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Quotas: each sandbox is counted against its account from the moment a
// create is admitted until the engine stops it (the Stopping hook), and
// each execution and command is admitted by the engine's Admit hook. All
// of it is in memory; the store is the record.

// tenant is what the server keeps about a live sandbox's account.
type tenant struct {
	acct     *account.Account
	released bool // the sandbox's slot was given back; guarded by Server.tenantMu
}

// installHooks connects the engine's hooks to the accounts.
func (s *Server) installHooks() {
	h := sandbox.Hooks{AgentCall: s.metrics.AgentCallDone}
	h.Pausing, h.Resumed = s.sandboxPausing, s.sandboxResumed // paused.go: the record, the meter
	if s.cfg.MaxPausedPerAccount > 0 || s.cfg.MaxPausedBytesPerAccount > 0 {
		h.AdmitPause = s.admitPausing // pausedbytes.go
	}
	h.Resumed, h.AdmitResume = s.sandboxResumedHolds, s.admitResume
	if !s.cfg.NoAccounting {
		h.Admit, h.Stopping = s.admitWork, s.sandboxStopping
	}
	s.engine.SetHooks(h)
}

// admitWork is the engine's Admit hook: the account's executions per
// minute, monthly quotas and credits.
func (s *Server) admitWork(sb *sandbox.Sandbox, w sandbox.Work) error {
	v, ok := s.tenants.Load(sb.ID)
	if !ok {
		return nil // not one of ours (the engine used directly)
	}
	t := v.(*tenant)
	if err := t.acct.AdmitWork(w == sandbox.WorkExecution); err != nil {
		return err
	}
	s.meter.Count(sb.ID, w)
	return nil
}

// sandboxStopping is the engine's Stopping hook: the last metering sample
// and the account's slot back.
func (s *Server) sandboxStopping(sb *sandbox.Sandbox) {
	s.meter.Stop(sb)
	s.release(sb.ID)
}

// release gives a sandbox's slot back once.
func (s *Server) release(id string) {
	v, ok := s.tenants.LoadAndDelete(id)
	if !ok {
		return
	}
	t := v.(*tenant)
	s.tenantMu.Lock()
	done := t.released
	t.released = true
	s.tenantMu.Unlock()
	if !done {
		t.acct.ReleaseSandbox()
	}
}

// admission is an admitted create's hold on its account.
type admission struct {
	acct *account.Account // nil with accounting off
	// holder names the create's reservation in the store when the
	// account has a concurrent cap; "" otherwise.
	holder string
}

// release gives the slot back after a failed create.
func (ad admission) release(st store.Store) {
	ad.acct.ReleaseSandbox()
	ad.drop(st)
}

// drop gives back the create's reservation in the store, if it has one.
func (ad admission) drop(st store.Store) {
	if ad.holder == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Left behind on failure, the reservation lapses after
	// store.ReservationTTL.
	_ = st.DropReservation(ctx, ad.holder)
}

// admitCreate grants a new sandbox its resources within its account's
// ceiling (grant) and takes a slot of the account's concurrent cap, here
// and in the store (release gives it back when the create fails). With
// accounting off only the host's ceiling applies.
func (s *Server) admitCreate(ctx context.Context, own string, opt *sandbox.CreateOptions) (admission, error) {
	a, err := s.grant(ctx, own, opt)
	if err != nil || a == nil {
		return admission{}, err
	}
	holder := "create-" + newID("")
	reserved, err := a.AcquireSandbox(ctx, holder)
	if err != nil {
		return admission{}, err
	}
	if !reserved {
		holder = ""
	}
	return admission{acct: a, holder: holder}, nil
}

// grant is the one decision of a new sandbox's resources (sandbox.Grant)
// under the ceiling of its account and the host: opt's limits and
// lifetime become what is granted, what the caller left out filled in.
// It returns the account (nil with accounting off).
func (s *Server) grant(ctx context.Context, own string, opt *sandbox.CreateOptions) (*account.Account, error) {
	c, a, err := s.ceiling(ctx, own)
	if err != nil {
		return nil, err
	}
	g, err := s.engine.Grant(*opt, c)
	if err != nil {
		return nil, err
	}
	opt.Limits, opt.Timeout = g.Limits, g.Timeout
	if a != nil {
		// The account's runtime, which the engine puts after the
		// request's and the template's (sandbox.Manager.resolveRuntime).
		opt.AccountRuntime, opt.RuntimeLocked = a.Runtime()
		lim, _ := a.Limits()
		opt.MaxDevices = int(lim.MaxDevices) // the engine counts them as it takes them
	}
	return a, nil
}

// ceiling is the most one sandbox of own's may have: the account's
// per-sandbox maxima and what the host can hold. The account is nil with
// accounting off.
func (s *Server) ceiling(ctx context.Context, own string) (sandbox.Ceiling, *account.Account, error) {
	var c sandbox.Ceiling
	if s.cfg.HostMemoryBytes > 0 {
		c.HostBytes = int64(float64(s.cfg.HostMemoryBytes) * s.cfg.Overcommit)
	}
	if s.cfg.NoAccounting {
		return c, nil, nil
	}
	a, err := s.accounts.Get(ctx, own)
	if errors.Is(err, store.ErrNotFound) {
		return c, nil, apierr.Wrap(err, apierr.AuthenticationFailed, "the key's account %q does not exist", own)
	}
	if err != nil {
		return c, nil, err
	}
	lim, _ := a.Limits()
	c.CPUs, c.MemoryBytes, c.DiskBytes = lim.MaxCPUs, lim.MaxMemoryMB<<20, lim.MaxDiskMB<<20
	c.Timeout = time.Duration(lim.MaxTimeout) * time.Second
	return c, a, nil
}

// checkTimeout refuses a lifetime above the ceiling (the account's
// max_timeout, the engine's longest), through the same Grant.
func (s *Server) checkTimeout(ctx context.Context, own string, d time.Duration) error {
	c, _, err := s.ceiling(ctx, own)
	if err != nil {
		return err
	}
	c.HostBytes = 0 // the sandbox holds its size already
	_, err = s.engine.Grant(sandbox.CreateOptions{Timeout: d, Names: sandbox.FieldNames{Timeout: "timeout"}}, c)
	return err
}

// checkPolicyLimits refuses a policy (PUT) whose resource limits are
// above the ceiling, through the same Grant; the engine then refuses any
// change of them (they are fixed at create).
func (s *Server) checkPolicyLimits(ctx context.Context, own string, p *policy.Policy) error {
	c, _, err := s.ceiling(ctx, own)
	if err != nil {
		return err
	}
	c.HostBytes = 0
	_, err = s.engine.Grant(sandbox.CreateOptions{Policy: p, Names: sandbox.FieldNames{PolicyMemory: "resource_limits.memory_mb",
		PolicyDisk: "resource_limits.disk_write_mb"}}, c)
	// A policy's refusal is the policy's, as every other refusal of a PUT
	// of it: the same message under ERR_INVALID_POLICY.
	if ae := apierr.From(err); err != nil && ae.Code == apierr.BadRequest {
		return &apierr.Error{Code: apierr.InvalidPolicy, Message: ae.Message, Details: ae.Details, Err: err}
	}
	return err
}

// started registers a created sandbox with its account and the meter. A
// sandbox that stopped before it was registered gives its slot back here.
func (s *Server) started(sb *sandbox.Sandbox, a *account.Account) {
	if a == nil {
		return // accounting is off
	}
	s.tenants.Store(sb.ID, &tenant{acct: a})
	s.meter.Start(sb, a)
	if st := sb.State(); st == sandbox.StateStopping || st == sandbox.StateStopped {
		s.meter.Stop(sb)
		s.release(sb.ID)
	}
}

// creditsOf reads an account's ledger: the balance is the ledger's sum.
func (s *Server) creditsOf(r *http.Request, a *account.Account) (api.Credits, error) {
	ct, err := s.store.CreditTotals(r.Context(), a.ID)
	if err != nil {
		return api.Credits{}, err
	}
	bal := ct.Balance()
	avail := a.Balance()
	pending := max(bal-avail, 0)
	return api.Credits{Balance: account.FormatMicros(bal), BalanceMicros: bal, FreeMicros: ct.FreeMicros,
		FreeLeftMicros: max(ct.FreeMicros-ct.SpentMicros, 0), GrantedMicros: ct.GrantedMicros, SpentMicros: ct.SpentMicros,
		PendingMicros: pending, AvailableMicros: avail, Enforced: s.accounts.Config().EnforceCredits}, nil
}

// afterFlush runs in the meter's loop after each flush: limits and
// balances changed through the CLI reach the accounts, the alert rules
// run, and sandboxes of accounts out of credits past the grace period
// stop.
func (s *Server) afterFlush(ctx context.Context) {
	defer s.flushes.Add(1)
	if s.cfg.NoAccounting {
		return
	}
	if err := s.accounts.Refresh(ctx); err != nil {
		s.log.Error("refresh accounts", "err", err)
	}
	s.alerts.Rules(ctx)
	s.accounts.Each(func(a *account.Account) {
		if !a.Exhausted() {
			return
		}
		for _, sb := range s.meter.Sandboxes(a.ID) {
			s.log.Info("credits exhausted: stopping sandbox", "account", a.ID, "sandbox", sb.ID)
			if err := s.engine.KillReason(ctx, sb.ID, "credits exhausted"); err != nil && apierr.CodeOf(err) != apierr.SandboxNotFound {
				s.log.Error("stop sandbox", "sandbox", sb.ID, "err", err)
			}
		}
	})
}
