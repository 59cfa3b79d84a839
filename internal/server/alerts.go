package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/alerts"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/store"
)

// The alerts' endpoints. Raising alerts, by callers and by rules, is
// internal/alerts' (Server.alerts).

func (s *Server) alertRoutes(add addFunc) {
	add("POST /v1/alerts", true, s.createAlert)
	add("GET /v1/alerts", true, s.listAlerts)
	add("POST /v1/alerts/{id}/ack", true, s.ackAlert)
}

func alertOut(a store.Alert) api.Alert {
	return api.Alert{ID: a.ID, Severity: a.Severity, Kind: a.Kind, Message: a.Message, SandboxID: a.SandboxID,
		SessionID: a.SessionID, CreatedAt: a.CreatedAt.UTC(), Acknowledged: a.AcknowledgedAt != nil, AcknowledgedAt: a.AcknowledgedAt}
}

func (s *Server) createAlert(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateAlert
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if !alerts.Severity(req.Severity) {
		return apierr.New(apierr.BadRequest, "severity must be low, medium, high or critical")
	}
	if req.Message == "" || len(req.Message) > 2000 {
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
	a := store.Alert{ID: newID("alert_"), Account: owner(r), Severity: req.Severity, Kind: "manual", Message: req.Message,
		SandboxID: req.SandboxID, SessionID: req.SessionID, CreatedAt: time.Now().UTC()}
	if _, err := s.alerts.Raise(r.Context(), a); isStorageBound(err) {
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
	out := make([]api.Alert, 0, len(l))
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
