package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
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
	h := sandbox.Hooks{AgentCall: s.metrics.agentCallDone}
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

// admitCreate checks a new sandbox of an account against its limits and
// takes a slot of its concurrent cap, here and in the store (release
// gives it back when the create fails). With accounting off it admits
// everything.
func (s *Server) admitCreate(ctx context.Context, own string, opt *sandbox.CreateOptions) (admission, error) {
	if s.cfg.NoAccounting {
		return admission{}, nil
	}
	ad, err := s.admitAccount(ctx, own, opt)
	if err != nil {
		return admission{}, err
	}
	holder := "create-" + newID("")
	reserved, err := ad.AcquireSandbox(ctx, holder)
	if err != nil {
		return admission{}, err
	}
	if !reserved {
		holder = ""
	}
	return admission{acct: ad, holder: holder}, nil
}

// admitAccount checks a new sandbox's resources against its account's
// limits, filling in what the caller left to the account's maxima.
func (s *Server) admitAccount(ctx context.Context, own string, opt *sandbox.CreateOptions) (*account.Account, error) {
	a, err := s.accounts.Get(ctx, own)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierr.Wrap(err, apierr.AuthenticationFailed, "the key's account %q does not exist", own)
	}
	if err != nil {
		return nil, err
	}
	lim, _ := a.Limits()
	// What the caller does not set comes from the engine's defaults, cut
	// to the account's maxima.
	def := s.engine.DefaultLimits()
	if opt.Limits.CPUs == 0 && lim.MaxCPUs > 0 {
		opt.Limits.CPUs = min(def.CPUs, lim.MaxCPUs)
	}
	if opt.Limits.MemoryBytes == 0 && lim.MaxMemoryMB > 0 {
		opt.Limits.MemoryBytes = min(def.MemoryBytes, lim.MaxMemoryMB<<20)
	}
	if opt.Limits.DiskBytes == 0 && lim.MaxDiskMB > 0 {
		opt.Limits.DiskBytes = min(def.DiskBytes, lim.MaxDiskMB<<20)
	}
	if opt.Timeout == 0 && lim.MaxTimeout > 0 {
		opt.Timeout = min(s.engine.DefaultTimeout(), time.Duration(lim.MaxTimeout)*time.Second)
	}
	if err := a.CheckResources(opt.Limits.CPUs, opt.Limits.MemoryBytes>>20, opt.Limits.DiskBytes>>20, opt.Timeout); err != nil {
		return nil, err
	}
	return a, nil
}

// checkTimeout refuses a lifetime above the account's max_timeout.
func (s *Server) checkTimeout(ctx context.Context, own string, d time.Duration) error {
	if s.cfg.NoAccounting {
		return nil
	}
	a, err := s.accounts.Get(ctx, own)
	if err != nil {
		return err
	}
	return a.CheckResources(0, 0, 0, d)
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

type creditsJSON struct {
	Balance       string `json:"balance"`
	BalanceMicros int64  `json:"balance_micros"`
	FreeLeft      int64  `json:"free_left_micros"`
	Free          int64  `json:"free_micros"`
	Granted       int64  `json:"granted_micros"`
	Spent         int64  `json:"spent_micros"`
	// Pending is cost metered and not yet written to the ledger (it is
	// at the next flush); Available = BalanceMicros - Pending.
	Pending   int64 `json:"pending_micros"`
	Available int64 `json:"available_micros"`
	Enforced  bool  `json:"enforced"`
}

// creditsOf reads an account's ledger: the balance is the ledger's sum.
func (s *Server) creditsOf(r *http.Request, a *account.Account) (creditsJSON, error) {
	ct, err := s.store.CreditTotals(r.Context(), a.ID)
	if err != nil {
		return creditsJSON{}, err
	}
	bal := ct.Balance()
	avail := a.Balance()
	pending := max(bal-avail, 0)
	return creditsJSON{Balance: account.FormatMicros(bal), BalanceMicros: bal, Free: ct.FreeMicros,
		FreeLeft: max(ct.FreeMicros-ct.SpentMicros, 0), Granted: ct.GrantedMicros, Spent: ct.SpentMicros,
		Pending: pending, Available: avail, Enforced: s.accounts.Config().EnforceCredits}, nil
}

// afterFlush runs in the meter's loop after each flush: limits and
// balances changed through the CLI reach the accounts, the alert rules
// run, and sandboxes of accounts out of credits past the grace period
// stop.
func (s *Server) afterFlush(ctx context.Context) {
	if s.cfg.NoAccounting {
		return
	}
	if err := s.accounts.Refresh(ctx); err != nil {
		s.log.Error("refresh accounts", "err", err)
	}
	s.alertRules(ctx)
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
