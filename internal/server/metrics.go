package server

// The metrics' endpoints (internal/metrics keeps the instruments):
// GET /metrics, Prometheus's text format, needs an admin key; `serve
// --metrics-listen` also serves it without a key on a separate listener
// meant for a private interface (Handler MetricsHandler). GET /v1/metrics
// is the same figures as JSON, cut to what the caller may see
// (metrics.Summary).

import (
	"net/http"

	"github.com/sheepfold/sheepfold/internal/auth"
)

// MetricsHandler serves the metrics in Prometheus's text format, without
// authentication: for `serve --metrics-listen` on a private address.
func (s *Server) MetricsHandler() http.Handler { return s.metrics.Handler() }

// metricsRoutes: GET /metrics for admin keys.
func (s *Server) metricsRoutes(add addFunc) {
	h := s.MetricsHandler()
	add("GET /metrics", true, s.admin(func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	}))
}

func (s *Server) metricsSummaryRoutes(add addFunc) {
	add("GET /v1/metrics", true, s.metricsSummary)
}

// metricsSummary: GET /v1/metrics, with the caller's own sandboxes by
// state.
func (s *Server) metricsSummary(w http.ResponseWriter, r *http.Request) error {
	own := owner(r)
	sandboxes := map[string]int{}
	s.mu.Lock()
	for _, b := range s.boxes {
		if b.sb != nil && b.owner == own {
			sandboxes[string(b.sb.State())]++
		}
	}
	s.mu.Unlock()
	p, _ := auth.PrincipalFrom(r.Context())
	out, err := s.metrics.Summary(own, p.Admin())
	if err != nil {
		return err
	}
	out.Account.Sandboxes = sandboxes
	writeJSON(w, http.StatusOK, out)
	return nil
}
