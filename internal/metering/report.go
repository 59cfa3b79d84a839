package metering

import (
	"math"
	"sort"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Reports: what an account used in a period, as the API shows it (GET
// /v1/account/usage, GET /v1/sandboxes/{id}/usage), built from the
// store's hourly rows, the meter's deltas not yet flushed and the
// account's storage; the server fetches them and adds the model tokens.

// FiguresOf is d's figures at prices p.
func FiguresOf(d store.UsageDelta, p Prices) api.UsageFigures {
	cpu := float64(d.CPUNanos) / 1e9
	cost := int64(math.Round(p.Cost(cpu, d.GBSecondsReserved, d.Executions) + (d.StorageGBSeconds+d.PausedGBSeconds)*p.StorageGBSecond +
		d.DeviceSeconds*p.DeviceSecond))
	return api.UsageFigures{SandboxSeconds: float64(d.WallNanos) / 1e9, CPUSeconds: cpu, GBSecondsReserved: d.GBSecondsReserved,
		GBSecondsUsed: d.GBSecondsUsed, DiskPeakBytes: d.DiskPeakBytes, Executions: d.Executions, Commands: d.Commands, EgressRequests: d.EgressRequests,
		EgressBytesIn: d.EgressBytesIn, EgressBytesOut: d.EgressBytesOut, StorageGBSeconds: d.StorageGBSeconds,
		PausedGBSeconds: d.PausedGBSeconds, DeviceSeconds: d.DeviceSeconds, CostMicros: cost, Cost: account.FormatMicros(cost)}
}

// StoreGrouping is the grouping to ask the store for a report grouped
// by by: hours for days too (a pending delta's day is its hour's), then
// regrouped.
func StoreGrouping(by string) string {
	if by == store.GroupDay {
		return store.GroupHour
	}
	return by
}

// ReportInput is what a report is built from.
type ReportInput struct {
	Account  string
	From, To time.Time
	GroupBy  string
	Rows     []store.UsageRow   // the store's, grouped by StoreGrouping(GroupBy)
	Pending  []store.UsageDelta // the meter's, not yet flushed
	Stored   []store.StorageHour
	Prices   Prices
}

// BuildReport builds in's report: an account's usage in [From, To),
// grouped by GroupBy (a store.Group*): the groups in key order, their
// total, the prices, and the account's storage (in the total too, and in
// groups by hour or day: it belongs to no sandbox and no template). The
// model tokens are the server's to add.
func BuildReport(in ReportInput) api.UsageReport {
	by := in.GroupBy
	groups := map[string]*api.UsageGroup{}
	sums := map[string]*store.UsageDelta{}
	addTo := func(d store.UsageDelta) {
		k := groupKey(d, by)
		if sums[k] == nil {
			sums[k] = &store.UsageDelta{}
			groups[k] = &api.UsageGroup{Key: k}
			switch by {
			case store.GroupSandbox:
				groups[k].SandboxID, groups[k].Template = d.SandboxID, d.Template
			case store.GroupTemplate:
				groups[k].Template = d.Template
			}
		}
		sums[k].Add(d)
	}
	for _, row := range in.Rows {
		d := row.UsageDelta
		if by == store.GroupTemplate {
			d.Template = row.Key
		}
		addTo(d)
	}
	for _, d := range in.Pending {
		if !d.Hour.Before(in.From) && d.Hour.Before(in.To) {
			addTo(d)
		}
	}
	var storage, total store.UsageDelta
	var volumes, snapshots float64
	for _, h := range in.Stored {
		volumes += h.VolumeGBSeconds
		snapshots += h.SnapshotGBSeconds
		d := store.UsageDelta{Account: in.Account, Hour: h.Hour, StorageGBSeconds: h.GBSeconds}
		storage.Add(d)
		if by == store.GroupHour || by == store.GroupDay {
			addTo(d)
		} else {
			total.Add(d)
		}
	}
	sf := FiguresOf(storage, in.Prices)
	out := api.UsageReport{From: in.From, To: in.To, GroupBy: by, Groups: []api.UsageGroup{}, Prices: in.Prices.API(),
		Storage: api.StorageFigures{GBSeconds: sf.StorageGBSeconds, VolumesGBSeconds: volumes, SnapshotsGBSeconds: snapshots, CostMicros: sf.CostMicros, Cost: sf.Cost}}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g := groups[k]
		g.UsageFigures = FiguresOf(*sums[k], in.Prices)
		out.Groups = append(out.Groups, *g)
		total.Add(*sums[k])
	}
	out.Total = FiguresOf(total, in.Prices)
	return out
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
