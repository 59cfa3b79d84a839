package metering_test

import (
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/store"
)

// TestBuildReport: a report by day regroups the store's hours and the
// pending deltas of the period (not those outside it), adds the storage
// to its day's group and the total, and prices every group; by
// template, the store's keys name the groups and the storage counts in
// the total alone.
func TestBuildReport(t *testing.T) {
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	prices := metering.Prices{CPUSecond: 10, GBSecond: 1, Execution: 100, StorageGBSecond: 1000}
	in := metering.ReportInput{
		Account: "acct", From: day, To: day.Add(48 * time.Hour), GroupBy: store.GroupDay, Prices: prices,
		Rows: []store.UsageRow{
			{UsageDelta: store.UsageDelta{Hour: h(1), CPUNanos: 2e9, Executions: 1}},
			{UsageDelta: store.UsageDelta{Hour: h(25), CPUNanos: 1e9}},
		},
		Pending: []store.UsageDelta{
			{Hour: h(2), GBSecondsReserved: 3},
			{Hour: h(49), CPUNanos: 100e9}, // after the period
		},
		Stored: []store.StorageHour{{Hour: h(26), GBSeconds: 0.5}},
	}
	r := metering.BuildReport(in)
	if len(r.Groups) != 2 || r.Groups[0].Key != "2026-12-06" || r.Groups[1].Key != "2026-12-07" {
		t.Fatalf("groups %+v", r.Groups)
	}
	g0, g1 := r.Groups[0], r.Groups[1]
	// Day one: 2 CPU-s (20) + 3 GB-s (3) + one execution (100).
	if g0.CPUSeconds != 2 || g0.GBSecondsReserved != 3 || g0.Executions != 1 || g0.CostMicros != 123 {
		t.Errorf("day one %+v", g0.UsageFigures)
	}
	// Day two: 1 CPU-s (10) + 0.5 GB-s stored (500).
	if g1.CPUSeconds != 1 || g1.StorageGBSeconds != 0.5 || g1.CostMicros != 510 {
		t.Errorf("day two %+v", g1.UsageFigures)
	}
	if r.Total.CPUSeconds != 3 || r.Total.CostMicros != 633 || r.Total.Cost != "0.000633" {
		t.Errorf("total %+v", r.Total)
	}
	if r.Storage.GBSeconds != 0.5 || r.Storage.CostMicros != 500 {
		t.Errorf("storage %+v", r.Storage)
	}

	in.GroupBy = store.GroupTemplate
	in.Rows = []store.UsageRow{{Key: "python", UsageDelta: store.UsageDelta{CPUNanos: 1e9}}, {Key: "node", UsageDelta: store.UsageDelta{CPUNanos: 2e9}}}
	in.Pending = nil
	r = metering.BuildReport(in)
	if len(r.Groups) != 2 || r.Groups[0].Key != "node" || r.Groups[0].Template != "node" || r.Groups[1].Template != "python" {
		t.Fatalf("groups by template %+v", r.Groups)
	}
	if r.Total.CPUSeconds != 3 || r.Total.StorageGBSeconds != 0.5 || r.Total.CostMicros != 530 {
		t.Errorf("total by template %+v", r.Total)
	}
	if metering.StoreGrouping(store.GroupDay) != store.GroupHour || metering.StoreGrouping(store.GroupSandbox) != store.GroupSandbox {
		t.Error("StoreGrouping")
	}
}
