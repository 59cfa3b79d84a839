package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
)

// TestMeterPoints: on one box the meter records each sandbox's point (its
// CPU counter and the time metered up to, what a restart after a crash
// charges from: internal/metering, recover.go) with the usage that brings
// it there. A new sandbox's first point is in the store at the next
// sample, long before the flush interval; its stop ends it, with the
// last sample.
func TestMeterPoints(t *testing.T) {
	t.Parallel()
	urt := &usageRuntime{cpu: map[string]uint64{}}
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 10 * time.Second}},
		func(c *sandbox.Config) { urt.Runtime = c.Runtime; c.Runtime = urt })
	ctx := context.Background()
	before := time.Now()
	id := e.create(e.keyA, nil)
	var p store.MeterPoint
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if p, err = e.store.MeterPoint(ctx, id); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no meter point 5 s after the create (the flush interval is 10 s): %v", err)
		}
	}
	if p.Ended || p.CPUNanos != 0 || p.At.Before(before.Add(-time.Millisecond)) || p.At.After(time.Now()) {
		t.Fatalf("first point %+v; want the counter at 0, metered up to a time since the create", p)
	}
	urt.set(id, 2_000_000_000)
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p, err := e.store.MeterPoint(ctx, id)
		if err == nil && p.Ended {
			if p.CPUNanos != 2e9 {
				t.Fatalf("last point %+v; want the counter at 2 s", p)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stop did not end the point: %+v, %v", p, err)
		}
	}
	rows, err := e.store.QueryUsage(ctx, storeFilter(id))
	if err != nil || len(rows) != 1 || rows[0].CPUNanos != 2e9 {
		t.Fatalf("stored %+v, %v; want the 2 CPU-seconds the point says", rows, err)
	}
}
