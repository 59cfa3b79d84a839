package server

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Usage: what the meter recorded (internal/metering), with the deltas not
// yet flushed added, so that reports are live and still sum exactly.

func (s *Server) usageRoutes(add addFunc) {
	add("GET /v1/account/usage", true, s.accountUsage)
	add("GET /v1/sandboxes/{id}/usage", true, s.sandboxUsage)
	add("GET /v1/account/credits", true, s.accountCredits)
}

// tokenReport fills a report's model tokens.
func (s *Server) tokenReport(r *http.Request, own string, out *api.UsageReport) error {
	rows, err := s.meter.Tokens(r.Context(), own, out.From, out.To)
	if err != nil {
		return err
	}
	out.Models = []api.ModelUsage{}
	for _, d := range rows {
		cost := int64(math.Round(d.CostMicros))
		mu := api.ModelUsage{Model: d.Model, Requests: d.Requests, PromptTokens: d.PromptTokens, CompletionTokens: d.CompletionTokens,
			TotalTokens: d.PromptTokens + d.CompletionTokens, CostMicros: cost, Cost: account.FormatMicros(cost)}
		if p := s.cfg.Models.Provider(d.Model); p != nil && p.MonthlyTokenQuota > 0 {
			mu.MonthlyLimit = &p.MonthlyTokenQuota
		}
		out.TokensUsed += mu.TotalTokens
		out.Models = append(out.Models, mu)
	}
	var limit int64
	models := s.cfg.Models.Models()
	for _, m := range models {
		q := s.cfg.Models.Provider(m.ID).MonthlyTokenQuota
		if q <= 0 {
			return nil
		}
		limit += q
	}
	if len(models) > 0 {
		out.TokensLimit = &limit
	}
	return nil
}

// parseTimeParam reads an RFC 3339 time or a date (YYYY-MM-DD, UTC).
func parseTimeParam(r *http.Request, name string) (time.Time, bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, false, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t.UTC(), true, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, true, nil
	}
	return time.Time{}, false, apierr.New(apierr.BadRequest, "%s must be an RFC 3339 time or a date (YYYY-MM-DD)", name)
}

func (s *Server) accountUsage(w http.ResponseWriter, r *http.Request) error {
	now := time.Now().UTC()
	from, _, err := parseTimeParam(r, "from")
	if err != nil {
		return err
	}
	to, toSet, err := parseTimeParam(r, "to")
	if err != nil {
		return err
	}
	if from.IsZero() {
		from = account.MonthStart(now)
	}
	if !toSet {
		to = now
	}
	from = from.Truncate(time.Hour)
	if t := to.Truncate(time.Hour); !t.Equal(to) {
		to = t.Add(time.Hour)
	}
	// Nothing is metered after the present hour: a later end (up to year
	// 9999 and beyond, with an offset) is cut to it, which also keeps
	// the answer's times encodable.
	if end := now.Truncate(time.Hour).Add(time.Hour); to.After(end) {
		to = end
	}
	if !from.Before(to) {
		return bound.Error("from", "must be before to (and before the present hour's end)")
	}
	by := r.URL.Query().Get("group_by")
	if by == "" {
		by = store.GroupDay
	}
	switch by {
	case store.GroupDay, store.GroupHour, store.GroupSandbox, store.GroupTemplate:
	default:
		return apierr.New(apierr.BadRequest, "group_by must be day, hour, sandbox or template")
	}
	own := owner(r)
	storeBy := metering.StoreGrouping(by)
	var rows []store.UsageRow
	pending, err := s.meter.Pending(own, func() (err error) {
		rows, err = s.store.QueryUsage(r.Context(), store.UsageFilter{Account: own, From: from, To: to, GroupBy: storeBy})
		return err
	})
	if err != nil {
		return err
	}
	stored, err := s.store.StorageUsage(r.Context(), own, from, to)
	if err != nil {
		return err
	}
	out := metering.BuildReport(metering.ReportInput{Account: own, From: from, To: to, GroupBy: by,
		Rows: rows, Pending: pending, Stored: stored, Prices: s.meter.Prices()})
	if err := s.tokenReport(r, own, &out); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sandboxUsage is one sandbox's usage: sampled now while it runs, the
// stored total once it has stopped (and a shared sandbox's always: the
// replicas meter it in turns, internal/metering).
func (s *Server) sandboxUsage(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	rec, err := s.store.GetSandbox(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != owner(r) {
		return notFound(id)
	}
	if err != nil {
		return err
	}
	out := api.SandboxUsage{SandboxID: id, Template: rec.Template}
	d, live := s.meter.Live(id)
	if !live {
		rows, err := s.store.QueryUsage(r.Context(), store.UsageFilter{Account: rec.Owner, SandboxID: id, GroupBy: store.GroupNone})
		if err != nil {
			return err
		}
		for _, row := range rows {
			d = row.UsageDelta
		}
	}
	out.Live = (live || s.shared()) && rec.State != store.SandboxStopped
	out.UsageFigures = metering.FiguresOf(d, s.meter.Prices())
	writeJSON(w, http.StatusOK, out)
	return nil
}

// accountCredits is GET /v1/account/credits.
func (s *Server) accountCredits(w http.ResponseWriter, r *http.Request) error {
	a, err := s.accounts.Get(r.Context(), owner(r))
	if err != nil {
		return err
	}
	c, err := s.creditsOf(r, a)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}
