package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func TestEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	evs := []store.Event{
		{Time: base, Type: "sandbox.created", SandboxID: "a", Owner: "o1"},
		{Time: base.Add(time.Second), Type: "execution.started", SandboxID: "a", Owner: "o1", ExecutionID: "x1"},
		{Time: base.Add(2 * time.Second), Type: "execution.finished", SandboxID: "a", Owner: "o1", ExecutionID: "x1",
			Details: json.RawMessage(`{"status":"success"}`)},
		{Time: base.Add(3 * time.Second), Type: "sandbox.created", SandboxID: "b", Owner: "o2"},
		{Time: base.Add(4 * time.Second), Type: "sandbox.created", SandboxID: "c", Owner: "o1"},
	}
	if err := db.AddEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].ID <= evs[i-1].ID {
			t.Fatalf("ids not increasing: %d then %d", evs[i-1].ID, evs[i].ID)
		}
	}
	ids := func(l []store.Event) []int64 {
		var out []int64
		for _, e := range l {
			out = append(out, e.ID)
		}
		return out
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
		got, err := db.ListEvents(ctx, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if g := ids(got); len(g) != len(c.want) || (len(g) > 0 && !equal(g, c.want)) {
			t.Errorf("%s: ids %v, want %v", c.name, g, c.want)
		}
	}
	got, _ := db.ListEvents(ctx, store.EventFilter{Owner: "o1", SandboxID: "a", Types: []string{"execution.finished"}})
	if len(got) != 1 || string(got[0].Details) != `{"status":"success"}` || got[0].ExecutionID != "x1" || !got[0].Time.Equal(evs[2].Time) {
		t.Fatalf("finished event read back as %+v", got)
	}

	// Retention removes old rows; ids are never reused afterwards.
	n, err := db.DeleteEventsBefore(ctx, base.Add(5*time.Second))
	if err != nil || n != 5 {
		t.Fatalf("DeleteEventsBefore = %d, %v", n, err)
	}
	more := []store.Event{{Time: base.Add(time.Hour), Type: "sandbox.stopped", SandboxID: "a", Owner: "o1"}}
	if err := db.AddEvents(ctx, more); err != nil {
		t.Fatal(err)
	}
	if more[0].ID <= evs[4].ID {
		t.Fatalf("id %d reused after deletion (last was %d)", more[0].ID, evs[4].ID)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestWebhooks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	defer db.Close()
	now := time.Now().UTC()
	w := store.Webhook{ID: "wh1", Owner: "o1", URL: "http://127.0.0.1:9/x", Secret: "s3", Types: []string{"sandbox.created"}, CreatedAt: now}
	if err := db.CreateWebhook(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateWebhook(ctx, store.Webhook{ID: "wh2", Owner: "o2", URL: "http://x", Secret: "t", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	l, err := db.ListWebhooks(ctx, "o1")
	if err != nil || len(l) != 1 || l[0].Secret != "s3" || len(l[0].Types) != 1 || l[0].URL != w.URL {
		t.Fatalf("ListWebhooks(o1) = %+v, %v", l, err)
	}
	if all, _ := db.ListWebhooks(ctx, ""); len(all) != 2 {
		t.Fatalf("every webhook: %+v", all)
	}
	for i := 1; i <= 3; i++ {
		d := store.WebhookDelivery{WebhookID: "wh1", EventID: 7, EventType: "sandbox.created", Attempt: i,
			StatusCode: 500, Error: "status 500", Succeeded: i == 3, Time: now, DurationMS: 1.5}
		if err := db.AddDelivery(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := db.ListDeliveries(ctx, "wh1", 0, 2)
	if err != nil || len(ds) != 2 || ds[0].Attempt != 1 || ds[0].Succeeded {
		t.Fatalf("deliveries page 1 = %+v, %v", ds, err)
	}
	ds, _ = db.ListDeliveries(ctx, "wh1", ds[1].ID, 0)
	if len(ds) != 1 || !ds[0].Succeeded || ds[0].Attempt != 3 {
		t.Fatalf("deliveries page 2 = %+v", ds)
	}
	if err := db.DeleteWebhook(ctx, "o2", "wh1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another owner deleted the webhook: %v", err)
	}
	if err := db.DeleteWebhook(ctx, "o1", "wh1"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := db.ListDeliveries(ctx, "wh1", 0, 0); len(ds) != 0 {
		t.Fatalf("deliveries outlived their webhook: %+v", ds)
	}
}
