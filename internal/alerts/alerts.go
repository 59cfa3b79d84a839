// Package alerts raises an account's alerts: those its callers ask for
// (Raise, for POST /v1/alerts), and those of its rules, checked after
// every metering flush (Rules: monthly quotas at 80 % and 100 %, credits
// low or exhausted) and on every stored security_violation event at or
// above the accounts' SecurityAlertSeverity (OnEvent, queued on the bus's
// goroutine and stored by Run's). An alert is stored once per dedupe key,
// and each new one is also an "alert.created" event, so that it goes out
// through the webhooks.
//
// It does not serve the alerts' endpoints (POST /v1/alerts, GET
// /v1/alerts, POST /v1/alerts/{id}/ack: internal/server, alerts.go),
// list or acknowledge them (the store does), nor bound how many an
// account keeps (the store does, store.ErrStorageBound: an alert of a
// rule the account has no room for is its own to lose, logged at debug).
//
// Imports: internal/store (the alert records), internal/events (the
// violations it reads, the events it emits) and internal/account (the
// accounts' quotas, credits and configuration).
package alerts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Alert severities, in order.
var severities = map[string]int{"low": 1, "medium": 2, "high": 3, "critical": 4}

// Severity reports whether s is an alert severity: low, medium, high or
// critical.
func Severity(s string) bool { return severities[s] != 0 }

// violationSeverity is how grave each kind of security violation is.
var violationSeverity = map[string]string{
	events.KindModuleBlocked: "medium", events.KindPathDenied: "medium", events.KindNetworkDenied: "medium",
	events.KindDNSDenied: "medium", events.KindSubprocessDenied: "high", events.KindSyscallDenied: "high",
}

// Store keeps alerts: CreateAlert stores one unless its dedupe key is
// taken, and reports whether it did.
type Store interface {
	CreateAlert(ctx context.Context, a store.Alert) (bool, error)
}

// Accounts are the accounts whose rules are checked.
type Accounts interface {
	Each(f func(a *account.Account))
	Config() account.Config
}

var _ Accounts = (*account.Registry)(nil)

// Config is what Alerts needs of the server.
type Config struct {
	Store    Store
	Accounts Accounts
	// Emit sends an event on the bus [nil: none is sent].
	Emit func(events.Event)
	// NewID returns a new alert's id.
	NewID func() string
	// Logger logs alerts that were not stored [slog.Default()].
	Logger *slog.Logger
}

// Alerts raises alerts.
type Alerts struct {
	cfg Config
	q   chan store.Alert // security alerts waiting for Run
}

// New returns the Alerts of cfg.
func New(cfg Config) *Alerts {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Alerts{cfg: cfg, q: make(chan store.Alert, 256)}
}

// Raise stores a (once per dedupe key) and emits it as an event; it
// reports whether a was new.
func (al *Alerts) Raise(ctx context.Context, a store.Alert) (bool, error) {
	ok, err := al.cfg.Store.CreateAlert(ctx, a)
	if err != nil || !ok {
		return ok, err
	}
	if al.cfg.Emit != nil {
		al.cfg.Emit(events.Event{Type: events.AlertCreated, SandboxID: a.SandboxID, Owner: a.Account,
			Details: map[string]any{"alert_id": a.ID, "severity": a.Severity, "kind": a.Kind, "message": a.Message}})
	}
	return true, nil
}

// Rules checks every loaded account's quotas and credits; the server
// runs it after each metering flush.
func (al *Alerts) Rules(ctx context.Context) {
	now := time.Now().UTC()
	month := now.Format("2006-01")
	al.cfg.Accounts.Each(func(a *account.Account) {
		used, lim := a.Month()
		for _, q := range []struct {
			name  string
			used  float64
			limit int64
		}{
			{"sandbox-seconds", used.SandboxSeconds, lim.MonthlySandboxSeconds},
			{"cpu-seconds", used.CPUSeconds, lim.MonthlyCPUSeconds},
			{"gb-seconds", used.GBSeconds, lim.MonthlyGBSeconds},
			{"executions", float64(used.Executions), lim.MonthlyExecutions},
		} {
			if q.limit <= 0 {
				continue
			}
			for _, step := range []struct {
				pct      int
				severity string
			}{{100, "high"}, {80, "medium"}} {
				if q.used*100 >= float64(q.limit)*float64(step.pct) {
					al.rule(ctx, a.ID, "quota", step.severity, fmt.Sprintf("quota:%s:%d:%s", q.name, step.pct, month),
						fmt.Sprintf("%d %% of the monthly %s quota used (%.0f of %d); it resets at %s", step.pct, q.name, q.used, q.limit,
							account.NextMonth(now).Format(time.RFC3339)))
					break
				}
			}
		}
		cfg := al.cfg.Accounts.Config()
		if !cfg.EnforceCredits {
			return
		}
		bal := a.Balance()
		switch {
		case bal <= 0:
			al.rule(ctx, a.ID, "credits", "critical", "credits:exhausted:"+now.Format(time.DateOnly),
				fmt.Sprintf("credits exhausted (balance %s): new sandboxes and executions are refused, running sandboxes stop after %s",
					account.FormatMicros(bal), cfg.CreditsGrace))
		case bal < cfg.CreditsLowMicros:
			al.rule(ctx, a.ID, "credits", "high", "credits:low:"+month,
				fmt.Sprintf("credits low: balance %s", account.FormatMicros(bal)))
		}
	})
}

func (al *Alerts) rule(ctx context.Context, acct, kind, severity, dedupe, msg string) {
	_, err := al.Raise(ctx, store.Alert{ID: al.cfg.NewID(), Account: acct, Severity: severity, Kind: kind,
		Message: msg, DedupeKey: dedupe, CreatedAt: time.Now().UTC()})
	al.failed(acct, err)
}

// failed logs an alert of a rule that was not stored: one the account
// has no room for (at its bound, none acknowledged) is its own to lose,
// at debug level; anything else is an error.
func (al *Alerts) failed(acct string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, store.ErrStorageBound):
		al.cfg.Logger.Debug("alert not kept: the account is at its bound of alerts", "account", acct)
	default:
		al.cfg.Logger.Error("raise alert", "account", acct, "err", err)
	}
}

// OnEvent queues an alert for a stored security_violation at or above
// the configured severity. It runs on the bus's goroutine, so the store
// write happens on Run's.
func (al *Alerts) OnEvent(e events.Event) {
	if e.Type != events.SecurityViolation || e.Owner == "" {
		return
	}
	kind, _ := e.Details["kind"].(string)
	sev := violationSeverity[kind]
	if sev == "" {
		sev = "high"
	}
	min := al.cfg.Accounts.Config().SecurityAlertSeverity
	if severities[min] == 0 || severities[sev] < severities[min] {
		return
	}
	target, _ := e.Details["target"].(string)
	a := store.Alert{ID: al.cfg.NewID(), Account: e.Owner, Severity: sev, Kind: "security_violation",
		Message: fmt.Sprintf("security violation in sandbox %s: %s %s", e.SandboxID, kind, target), SandboxID: e.SandboxID,
		DedupeKey: fmt.Sprintf("event:%d", e.ID), CreatedAt: time.Now().UTC()}
	select {
	case al.q <- a:
	default:
		al.cfg.Logger.Warn("alert queue full: security alert dropped", "sandbox", e.SandboxID, "kind", kind)
	}
}

// Run stores queued alerts until stop is closed.
func (al *Alerts) Run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case a := <-al.q:
			_, err := al.Raise(context.Background(), a)
			al.failed(a.Account, err)
		}
	}
}
