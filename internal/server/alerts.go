package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Alerts: raised by callers (POST /v1/alerts) and by rules the server
// checks after every metering flush (monthly quotas at 80 % and 100 %,
// credits low or exhausted) and on every stored security_violation event
// at or above Config.Accounts' SecurityAlertSeverity. Each new alert is
// also an "alert.created" event, so it goes out through the webhooks.

// Alert severities, in order.
var severities = map[string]int{"low": 1, "medium": 2, "high": 3, "critical": 4}

// violationSeverity is how grave each kind of security violation is.
var violationSeverity = map[string]string{
	events.KindModuleBlocked: "medium", events.KindPathDenied: "medium", events.KindNetworkDenied: "medium",
	events.KindDNSDenied: "medium", events.KindSubprocessDenied: "high", events.KindSyscallDenied: "high",
}

func (s *Server) alertRoutes(add addFunc) {
	add("POST /v1/alerts", true, s.createAlert)
	add("GET /v1/alerts", true, s.listAlerts)
	add("POST /v1/alerts/{id}/ack", true, s.ackAlert)
}

type alertJSON struct {
	ID             string     `json:"id"`
	Severity       string     `json:"severity"`
	Kind           string     `json:"kind"`
	Message        string     `json:"message"`
	SandboxID      string     `json:"sandbox_id,omitempty"`
	SessionID      string     `json:"session_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	Acknowledged   bool       `json:"acknowledged"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
}

func alertOut(a store.Alert) alertJSON {
	return alertJSON{ID: a.ID, Severity: a.Severity, Kind: a.Kind, Message: a.Message, SandboxID: a.SandboxID,
		SessionID: a.SessionID, CreatedAt: a.CreatedAt.UTC(), Acknowledged: a.AcknowledgedAt != nil, AcknowledgedAt: a.AcknowledgedAt}
}

type createAlertRequest struct {
	Severity  *string `json:"severity"`
	Message   *string `json:"message"`
	SandboxID string  `json:"sandbox_id"`
	SessionID string  `json:"session_id"`
}

func (s *Server) createAlert(w http.ResponseWriter, r *http.Request) error {
	var req createAlertRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Severity == nil || severities[*req.Severity] == 0 {
		return apierr.New(apierr.BadRequest, "severity must be low, medium, high or critical")
	}
	if req.Message == nil || *req.Message == "" || len(*req.Message) > 2000 {
		return apierr.New(apierr.BadRequest, "message is required: at most 2000 bytes")
	}
	if len(req.SessionID) > 200 {
		return apierr.New(apierr.BadRequest, "session_id must be at most 200 bytes")
	}
	if req.SandboxID != "" {
		rec, err := s.store.GetSandbox(r.Context(), req.SandboxID)
		if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != owner(r) {
			return apierr.New(apierr.BadRequest, "sandbox_id %q is not a sandbox of this account", req.SandboxID)
		}
		if err != nil {
			return err
		}
	}
	a := store.Alert{ID: newID("alert_"), Account: owner(r), Severity: *req.Severity, Kind: "manual", Message: *req.Message,
		SandboxID: req.SandboxID, SessionID: req.SessionID, CreatedAt: time.Now().UTC()}
	if _, err := s.raise(r.Context(), a); isStorageBound(err) {
		return s.alertBoundError(err)
	} else if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, alertOut(a))
	return nil
}

func (s *Server) listAlerts(w http.ResponseWriter, r *http.Request) error {
	unacked := false
	switch v := r.URL.Query().Get("unacknowledged"); v {
	case "", "false":
	case "true":
		unacked = true
	default:
		return apierr.New(apierr.BadRequest, "unacknowledged must be true or false")
	}
	l, err := s.store.ListAlerts(r.Context(), owner(r), unacked)
	if err != nil {
		return err
	}
	out := make([]alertJSON, 0, len(l))
	for _, a := range l {
		out = append(out, alertOut(a))
	}
	writeJSON(w, http.StatusOK, map[string]any{"alerts": out})
	return nil
}

func (s *Server) ackAlert(w http.ResponseWriter, r *http.Request) error {
	a, err := s.store.AckAlert(r.Context(), owner(r), r.PathValue("id"), time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return apierr.New(apierr.NotFound, "alert %q not found", r.PathValue("id"))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, alertOut(a))
	return nil
}

// raise stores an alert (once per dedupe key) and emits it as an event.
func (s *Server) raise(ctx context.Context, a store.Alert) (bool, error) {
	ok, err := s.store.CreateAlert(ctx, a)
	if err != nil || !ok {
		return ok, err
	}
	if s.bus != nil {
		s.bus.Emit(events.Event{Type: events.AlertCreated, SandboxID: a.SandboxID, Owner: a.Account,
			Details: map[string]any{"alert_id": a.ID, "severity": a.Severity, "kind": a.Kind, "message": a.Message}})
	}
	return true, nil
}

// alertRules checks every loaded account's quotas and credits; it runs
// after each metering flush.
func (s *Server) alertRules(ctx context.Context) {
	now := time.Now().UTC()
	month := now.Format("2006-01")
	s.accounts.Each(func(a *account.Account) {
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
					s.ruleAlert(ctx, a.ID, "quota", step.severity, fmt.Sprintf("quota:%s:%d:%s", q.name, step.pct, month),
						fmt.Sprintf("%d %% of the monthly %s quota used (%.0f of %d); it resets at %s", step.pct, q.name, q.used, q.limit,
							account.NextMonth(now).Format(time.RFC3339)))
					break
				}
			}
		}
		cfg := s.accounts.Config()
		if !cfg.EnforceCredits {
			return
		}
		bal := a.Balance()
		switch {
		case bal <= 0:
			s.ruleAlert(ctx, a.ID, "credits", "critical", "credits:exhausted:"+now.Format(time.DateOnly),
				fmt.Sprintf("credits exhausted (balance %s): new sandboxes and executions are refused, running sandboxes stop after %s",
					account.FormatMicros(bal), cfg.CreditsGrace))
		case bal < cfg.CreditsLowMicros:
			s.ruleAlert(ctx, a.ID, "credits", "high", "credits:low:"+month,
				fmt.Sprintf("credits low: balance %s", account.FormatMicros(bal)))
		}
	})
}

func (s *Server) ruleAlert(ctx context.Context, acct, kind, severity, dedupe, msg string) {
	_, err := s.raise(ctx, store.Alert{ID: newID("alert_"), Account: acct, Severity: severity, Kind: kind,
		Message: msg, DedupeKey: dedupe, CreatedAt: time.Now().UTC()})
	s.alertFailed(acct, err)
}

// alertFailed logs an alert the server raised that was not stored: one
// the account has no room for (at its bound, none acknowledged) is its
// own to lose, at debug level; anything else is an error.
func (s *Server) alertFailed(acct string, err error) {
	switch {
	case err == nil:
	case isStorageBound(err):
		s.log.Debug("alert not kept: the account is at its bound of alerts", "account", acct)
	default:
		s.log.Error("raise alert", "account", acct, "err", err)
	}
}

// onSecurityEvent queues an alert for a stored security_violation at or
// above the configured severity. It runs on the bus's goroutine, so the
// store write happens on the alert writer's.
func (s *Server) onSecurityEvent(e events.Event) {
	if e.Type != events.SecurityViolation || e.Owner == "" {
		return
	}
	kind, _ := e.Details["kind"].(string)
	sev := violationSeverity[kind]
	if sev == "" {
		sev = "high"
	}
	min := s.accounts.Config().SecurityAlertSeverity
	if severities[min] == 0 || severities[sev] < severities[min] {
		return
	}
	target, _ := e.Details["target"].(string)
	a := store.Alert{ID: newID("alert_"), Account: e.Owner, Severity: sev, Kind: "security_violation",
		Message: fmt.Sprintf("security violation in sandbox %s: %s %s", e.SandboxID, kind, target), SandboxID: e.SandboxID,
		DedupeKey: fmt.Sprintf("event:%d", e.ID), CreatedAt: time.Now().UTC()}
	select {
	case s.alertQ <- a:
	default:
		s.log.Warn("alert queue full: security alert dropped", "sandbox", e.SandboxID, "kind", kind)
	}
}

// alertWriter stores queued alerts until the server stops.
func (s *Server) alertWriter() {
	defer s.sweeper.Done()
	for {
		select {
		case <-s.stop:
			return
		case a := <-s.alertQ:
			_, err := s.raise(context.Background(), a)
			s.alertFailed(a.Account, err)
		}
	}
}
