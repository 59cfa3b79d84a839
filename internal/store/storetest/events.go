package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func eventIDs(l []store.Event) []int64 {
	var out []int64
	for _, e := range l {
		out = append(out, e.ID)
	}
	return out
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	evs := []store.Event{
		{Time: base, Type: "sandbox.created", SandboxID: "a", Owner: "o1"},
		{Time: base.Add(time.Second), Type: "execution.started", SandboxID: "a", Owner: "o1", ExecutionID: "x1"},
		{Time: base.Add(2 * time.Second), Type: "execution.finished", Source: "host", SandboxID: "a", Owner: "o1", ExecutionID: "x1",
			Details: json.RawMessage(`{"status":"success"}`)},
		{Time: base.Add(3 * time.Second), Type: "sandbox.created", SandboxID: "b", Owner: "o2"},
		{Time: base.Add(4 * time.Second), Type: "sandbox.created", SandboxID: "c", Owner: "o1"},
	}
	if err := s.AddEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].ID <= evs[i-1].ID {
			t.Fatalf("ids not increasing: %d then %d", evs[i-1].ID, evs[i].ID)
		}
	}
	cases := []struct {
		name string
		f    store.EventFilter
		want []int64
	}{
		{"owner", store.EventFilter{Owner: "o1"}, []int64{evs[0].ID, evs[1].ID, evs[2].ID, evs[4].ID}},
		{"sandbox", store.EventFilter{Owner: "o1", SandboxID: "a"}, []int64{evs[0].ID, evs[1].ID, evs[2].ID}},
		{"other owner's sandbox", store.EventFilter{Owner: "o1", SandboxID: "b"}, nil},
		{"types", store.EventFilter{Owner: "o1", Types: []string{"sandbox.created", "execution.finished"}},
			[]int64{evs[0].ID, evs[2].ID, evs[4].ID}},
		{"since", store.EventFilter{Owner: "o1", Since: base.Add(2 * time.Second)}, []int64{evs[2].ID, evs[4].ID}},
		{"cursor and limit", store.EventFilter{Owner: "o1", AfterID: evs[0].ID, Limit: 2}, []int64{evs[1].ID, evs[2].ID}},
		{"up to", store.EventFilter{Owner: "o1", UpToID: evs[1].ID}, []int64{evs[0].ID, evs[1].ID}},
	}
	for _, c := range cases {
		got, err := s.ListEvents(ctx, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			t.Errorf("%s: a nil list, want an empty one", c.name)
		}
		if g := eventIDs(got); !slices.Equal(g, c.want) {
			t.Errorf("%s: ids %v, want %v", c.name, g, c.want)
		}
	}
	got, _ := s.ListEvents(ctx, store.EventFilter{Owner: "o1", SandboxID: "a", Types: []string{"execution.finished"}})
	if len(got) != 1 || string(got[0].Details) != `{"status":"success"}` || got[0].ExecutionID != "x1" || !got[0].Time.Equal(evs[2].Time) ||
		got[0].Type != "execution.finished" || got[0].Source != "host" || got[0].SandboxID != "a" || got[0].Owner != "o1" {
		t.Fatalf("finished event read back as %+v", got)
	}
	if got, _ := s.ListEvents(ctx, store.EventFilter{Owner: "o1", UpToID: evs[0].ID}); len(got) != 1 || string(got[0].Details) != `{}` ||
		got[0].Source != "" {
		t.Fatalf("an event without details read back as %+v", got)
	}

	// Retention removes old rows; ids are never reused afterwards.
	n, err := s.DeleteEventsBefore(ctx, base.Add(5*time.Second))
	if err != nil || n != 5 {
		t.Fatalf("DeleteEventsBefore = %d, %v", n, err)
	}
	more := []store.Event{{Time: base.Add(time.Hour), Type: "sandbox.stopped", SandboxID: "a", Owner: "o1"}}
	if err := s.AddEvents(ctx, more); err != nil {
		t.Fatal(err)
	}
	if more[0].ID <= evs[4].ID {
		t.Fatalf("id %d reused after deletion (last was %d)", more[0].ID, evs[4].ID)
	}
	if err := s.AddEvents(ctx, nil); err != nil {
		t.Fatalf("no events: %v", err)
	}
}

// testEventsVisibleInIDOrder: while writers add events concurrently, a
// reader paging by "after this id" (as SSE and webhooks do) sees every
// event: no id becomes visible after a larger one was read.
func testEventsVisibleInIDOrder(t *testing.T, s store.Store) {
	ctx := context.Background()
	const writers, batches, perBatch = 6, 40, 3
	const total = writers * batches * perBatch
	at := now()
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				evs := make([]store.Event, perBatch)
				for i := range evs {
					evs[i] = store.Event{Time: at, Type: "t", Owner: "o", SandboxID: fmt.Sprint("w", w, "b", b, "i", i)}
				}
				if err := s.AddEvents(ctx, evs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	written := make(chan struct{})
	go func() {
		wg.Wait()
		close(written)
	}()
	// Page until the writers are done and a page read after that is
	// empty: then everything committed has been offered.
	var seen []int64
	var cursor int64
	for done := false; ; {
		select {
		case <-written:
			done = true
		default:
		}
		page, err := s.ListEvents(ctx, store.EventFilter{Owner: "o", AfterID: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			seen = append(seen, e.ID)
			cursor = e.ID
		}
		if done && len(page) == 0 {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all, err := s.ListEvents(ctx, store.EventFilter{Owner: "o"})
	if err != nil || len(all) != total {
		t.Fatalf("%d events stored, want %d (%v)", len(all), total, err)
	}
	if ids := eventIDs(all); !slices.Equal(seen, ids) {
		missed := 0
		for _, id := range ids {
			if !slices.Contains(seen, id) {
				missed++
			}
		}
		t.Fatalf("a reader paging by id saw %d of %d events: %d became visible after a larger id", len(seen), total, missed)
	}
}

func testWebhooks(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := now()
	w := store.Webhook{ID: "wh1", Owner: "o1", URL: "http://127.0.0.1:9/x", Secret: "s3", Types: []string{"sandbox.created"}, CreatedAt: now}
	if err := s.CreateWebhook(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateWebhook(ctx, store.Webhook{ID: "wh2", Owner: "o2", URL: "http://x", Secret: "t", CreatedAt: now.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListWebhooks(ctx, "o1")
	if err != nil || len(l) != 1 || l[0].Secret != "s3" || !slices.Equal(l[0].Types, w.Types) || l[0].URL != w.URL || !l[0].CreatedAt.Equal(now) {
		t.Fatalf("ListWebhooks(o1) = %+v, %v", l, err)
	}
	if all, _ := s.ListWebhooks(ctx, ""); len(all) != 2 || all[0].ID != "wh1" || len(all[1].Types) != 0 {
		t.Fatalf("every webhook: %+v", all)
	}
	for i := 1; i <= 3; i++ {
		d := store.WebhookDelivery{WebhookID: "wh1", EventID: 7, EventType: "sandbox.created", Attempt: i,
			StatusCode: 500, Error: "status 500", Succeeded: i == 3, Time: now, DurationMS: 1.5}
		if err := s.AddDelivery(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := s.ListDeliveries(ctx, "wh1", 0, 2)
	if err != nil || len(ds) != 2 || ds[0].Attempt != 1 || ds[0].Succeeded || ds[0].EventID != 7 || ds[0].StatusCode != 500 ||
		ds[0].Error != "status 500" || ds[0].DurationMS != 1.5 || !ds[0].Time.Equal(now) || ds[0].ID >= ds[1].ID {
		t.Fatalf("deliveries page 1 = %+v, %v", ds, err)
	}
	ds, _ = s.ListDeliveries(ctx, "wh1", ds[1].ID, 0)
	if len(ds) != 1 || !ds[0].Succeeded || ds[0].Attempt != 3 {
		t.Fatalf("deliveries page 2 = %+v", ds)
	}
	if err := s.DeleteWebhook(ctx, "o2", "wh1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another owner deleted the webhook: %v", err)
	}
	if err := s.DeleteWebhook(ctx, "o1", "wh1"); err != nil {
		t.Fatal(err)
	}
	if ds, err := s.ListDeliveries(ctx, "wh1", 0, 0); err != nil || ds == nil || len(ds) != 0 {
		t.Fatalf("deliveries outlived their webhook: %#v, %v", ds, err)
	}
	if l, _ := s.ListWebhooks(ctx, "o1"); len(l) != 0 {
		t.Fatalf("deleted webhook still listed: %+v", l)
	}

	// Retention takes old deliveries with old events.
	mustNil(t, s.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh2", EventID: 1, EventType: "x", Attempt: 1, Time: now.Add(-time.Hour)}))
	mustNil(t, s.AddDelivery(ctx, store.WebhookDelivery{WebhookID: "wh2", EventID: 2, EventType: "x", Attempt: 1, Time: now}))
	if _, err := s.DeleteEventsBefore(ctx, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if ds, _ := s.ListDeliveries(ctx, "wh2", 0, 0); len(ds) != 1 || ds[0].EventID != 2 {
		t.Fatalf("deliveries after retention: %+v", ds)
	}
}
