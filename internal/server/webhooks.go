package server

import (
	"net/http"
	"strconv"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/webhooks"
)

// The endpoints of webhooks (internal/webhooks, which registers them and
// delivers the events).

func (s *Server) webhookRoutes(add addFunc) {
	add("POST /v1/webhooks", true, s.createWebhook)
	add("GET /v1/webhooks", true, s.listWebhooks)
	add("DELETE /v1/webhooks/{id}", true, s.deleteWebhook)
	add("GET /v1/webhooks/{id}/deliveries", true, s.listDeliveries)
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) error {
	var req api.WebhookRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	h, err := s.hooks.Create(r.Context(), owner(r), req.URL, req.Types)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h)
	return nil
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) error {
	l, err := s.hooks.List(r.Context(), owner(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"webhooks": l})
	return nil
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) error {
	if err := s.hooks.Delete(r.Context(), owner(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	own, id := owner(r), r.PathValue("id")
	if !s.hooks.Registered(own, id) {
		return webhooks.NotFound(id)
	}
	q := r.URL.Query()
	var after int64
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n < 0 {
			return apierr.New(apierr.BadRequest, "cursor must be a delivery id")
		}
		after = n
	}
	limit := defaultEventPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventPage {
			return apierr.New(apierr.BadRequest, "limit must be between 1 and %d", maxEventPage)
		}
		limit = n
	}
	l, next, err := s.hooks.Deliveries(r.Context(), id, after, limit)
	if err != nil {
		return err
	}
	var cursor *string
	if next != "" {
		cursor = &next
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": l, "next_cursor": cursor})
	return nil
}
