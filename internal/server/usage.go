package server

import (
	"errors"
	"math"
	"net/http"
	"sort"
	"time"

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

type usageFigures struct {
	SandboxSeconds    float64 `json:"sandbox_seconds"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	GBSecondsReserved float64 `json:"gb_seconds_reserved"`
	GBSecondsUsed     float64 `json:"gb_seconds_used"`
	DiskPeakBytes     int64   `json:"disk_peak_bytes"`
	Executions        int64   `json:"executions"`
	Commands          int64   `json:"commands"`
	EgressRequests    int64   `json:"egress_requests"`
	EgressBytesIn     int64   `json:"egress_bytes_in"`
	EgressBytesOut    int64   `json:"egress_bytes_out"`
	StorageGBSeconds  float64 `json:"storage_gb_seconds"`
	CostMicros        int64   `json:"cost_micros"`
	Cost              string  `json:"cost"`
}

func figures(d store.UsageDelta, p metering.Prices) usageFigures {
	cpu := float64(d.CPUNanos) / 1e9
	cost := int64(math.Round(p.Cost(cpu, d.GBSecondsReserved, d.Executions) + d.StorageGBSeconds*p.StorageGBSecond))
	return usageFigures{SandboxSeconds: float64(d.WallNanos) / 1e9, CPUSeconds: cpu, GBSecondsReserved: d.GBSecondsReserved,
		GBSecondsUsed: d.GBSecondsUsed, DiskPeakBytes: d.DiskPeakBytes, Executions: d.Executions, Commands: d.Commands, EgressRequests: d.EgressRequests,
		EgressBytesIn: d.EgressBytesIn, EgressBytesOut: d.EgressBytesOut, StorageGBSeconds: d.StorageGBSeconds,
		CostMicros: cost, Cost: account.FormatMicros(cost)}
}

// storageFigures are an account's storage in a usage report.
type storageFigures struct {
	GBSeconds  float64 `json:"gb_seconds"`
	CostMicros int64   `json:"cost_micros"`
	Cost       string  `json:"cost"`
}

type usageGroup struct {
	Key       string `json:"key"`
	Template  string `json:"template,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	usageFigures
}

type usageReport struct {
	From    time.Time       `json:"from"`
	To      time.Time       `json:"to"`
	GroupBy string          `json:"group_by"`
	Groups  []usageGroup    `json:"groups"`
	Total   usageFigures    `json:"total"`
	Prices  metering.Prices `json:"prices"`
	// Storage is what the account kept in the store in the period (in
	// Total too, and in the groups by hour or day).
	Storage storageFigures `json:"storage"`
	// Model tokens in the period: in total, per model (with each model's
	// monthly quota), and the sum of the configured models' quotas
	// (null when any configured model has none).
	TokensUsed  int64        `json:"tokens_used"`
	TokensLimit *int64       `json:"tokens_limit"`
	Models      []modelUsage `json:"models"`
}

// modelUsage is an account's tokens of one model.
type modelUsage struct {
	Model            string `json:"model"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	MonthlyLimit     *int64 `json:"monthly_limit"`
	CostMicros       int64  `json:"cost_micros"`
	Cost             string `json:"cost"`
}

// tokenReport fills a report's model tokens.
func (s *Server) tokenReport(r *http.Request, own string, out *usageReport) error {
	rows, err := s.meter.Tokens(r.Context(), own, out.From, out.To)
	if err != nil {
		return err
	}
	out.Models = []modelUsage{}
	for _, d := range rows {
		cost := int64(math.Round(d.CostMicros))
		mu := modelUsage{Model: d.Model, Requests: d.Requests, PromptTokens: d.PromptTokens, CompletionTokens: d.CompletionTokens,
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

// groupKey is a delta's key under a grouping, as the API shows it.
func groupKey(d store.UsageDelta, by string) string {
	switch by {
	case store.GroupHour:
		return d.Hour.UTC().Format(time.RFC3339)
	case store.GroupDay:
		return d.Hour.UTC().Format(time.DateOnly)
	case store.GroupSandbox:
		return d.SandboxID
	case store.GroupTemplate:
		return d.Template
	}
	return ""
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
	// The store groups by hour for days too (a pending delta's day is its
	// hour's); pending deltas are grouped the same way and added.
	storeBy := by
	if by == store.GroupHour || by == store.GroupDay {
		storeBy = store.GroupHour // keys as times, then regrouped
	}
	var rows []store.UsageRow
	pending, err := s.meter.Pending(own, func() (err error) {
		rows, err = s.store.QueryUsage(r.Context(), store.UsageFilter{Account: own, From: from, To: to, GroupBy: storeBy})
		return err
	})
	if err != nil {
		return err
	}
	groups := map[string]*usageGroup{}
	sums := map[string]*store.UsageDelta{}
	addTo := func(d store.UsageDelta) {
		k := groupKey(d, by)
		if sums[k] == nil {
			sums[k] = &store.UsageDelta{}
			groups[k] = &usageGroup{Key: k}
			if by == store.GroupSandbox {
				groups[k].SandboxID, groups[k].Template = d.SandboxID, d.Template
			}
			if by == store.GroupTemplate {
				groups[k].Template = d.Template
			}
		}
		sums[k].Add(d)
	}
	for _, row := range rows {
		d := row.UsageDelta
		if storeBy == store.GroupTemplate {
			d.Template = row.Key
		}
		addTo(d)
	}
	for _, d := range pending {
		if !d.Hour.Before(from) && d.Hour.Before(to) {
			addTo(d)
		}
	}
	// What the account keeps in the store, metered at each flush: in the
	// report's storage and total, and by hour or day in the groups too
	// (it belongs to no sandbox and no template).
	stored, err := s.store.StorageUsage(r.Context(), own, from, to)
	if err != nil {
		return err
	}
	var storage, total store.UsageDelta
	for _, h := range stored {
		d := store.UsageDelta{Account: own, Hour: h.Hour, StorageGBSeconds: h.GBSeconds}
		storage.Add(d)
		if by == store.GroupHour || by == store.GroupDay {
			addTo(d)
		} else {
			total.Add(d)
		}
	}
	prices := s.meter.Prices()
	sf := figures(storage, prices)
	out := usageReport{From: from, To: to, GroupBy: by, Groups: []usageGroup{}, Prices: prices,
		Storage: storageFigures{GBSeconds: sf.StorageGBSeconds, CostMicros: sf.CostMicros, Cost: sf.Cost}}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g := groups[k]
		g.usageFigures = figures(*sums[k], prices)
		out.Groups = append(out.Groups, *g)
		total.Add(*sums[k])
	}
	out.Total = figures(total, prices)
	if err := s.tokenReport(r, own, &out); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

type sandboxUsageJSON struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	Live      bool   `json:"live"`
	usageFigures
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
	out := sandboxUsageJSON{SandboxID: id, Template: rec.Template}
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
	out.Live = (live || s.shared()) && rec.State == store.SandboxRunning
	out.usageFigures = figures(d, s.meter.Prices())
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
