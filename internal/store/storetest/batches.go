package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

func testBatches(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now()
	b := store.Batch{ID: "bat_1", Owner: "acct-a", Status: store.BatchRunning, Template: "python", Language: "python",
		Code: "def handler(x): return x", Concurrency: 2, TimeoutMS: 5000, Retries: 1, Resources: json.RawMessage(`{"cpus":0.5}`), CreatedAt: t0, Reuse: "worker"}
	inputs := []json.RawMessage{json.RawMessage(`"a"`), json.RawMessage(`{"k":[1,2]}`), json.RawMessage(`3`)}
	if err := s.CreateBatch(ctx, b, inputs); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBatch(ctx, b, nil); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create of one id: %v, want ErrExists", err)
	}
	if err := s.CreateBatch(ctx, store.Batch{ID: "bat_2", Owner: "acct-b", Status: store.BatchRunning, Template: "python",
		Language: "python", CreatedAt: t0.Add(time.Second)}, inputs[:1]); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetBatch(ctx, "acct-a", "bat_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Code != b.Code || got.Concurrency != 2 || got.TimeoutMS != 5000 || got.Retries != 1 || !got.CreatedAt.Equal(t0) ||
		string(got.Resources) != `{"cpus":0.5}` || got.Total != 3 || got.Done != 0 || got.Failed != 0 || got.EndedAt != nil || got.Status != store.BatchRunning ||
		got.Reuse != "worker" || got.Usage != (store.BatchUsage{}) {
		t.Fatalf("got %+v", got)
	}
	if _, err := s.GetBatch(ctx, "acct-b", "bat_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another owner's batch: %v, want ErrNotFound", err)
	}
	pending, err := s.PendingBatchItems(ctx, "bat_1")
	if err != nil || len(pending) != 3 || string(pending[1].Input) != `{"k":[1,2]}` || pending[2].Index != 2 {
		t.Fatalf("pending %+v, %v", pending, err)
	}
	t1 := t0.Add(2 * time.Second)
	ok, err := s.EndBatchItem(ctx, store.BatchItem{BatchID: "bat_1", Index: 1, Status: store.BatchItemDone, Attempts: 1,
		Result: json.RawMessage(`7`), EndedAt: &t1})
	if err != nil || !ok {
		t.Fatalf("end item: %v %v", ok, err)
	}
	// An ended item ends once: a second outcome (a rerun after a
	// restart) changes nothing.
	ok, err = s.EndBatchItem(ctx, store.BatchItem{BatchID: "bat_1", Index: 1, Status: store.BatchItemFailed, Attempts: 2,
		Error: json.RawMessage(`{"name":"X"}`), EndedAt: &t1})
	if err != nil || ok {
		t.Fatalf("second end of an item: %v %v, want false", ok, err)
	}
	if _, err := s.EndBatchItem(ctx, store.BatchItem{BatchID: "bat_1", Index: 0, Status: store.BatchItemFailed, Attempts: 2,
		Error: json.RawMessage(`{"name":"ValueError"}`), EndedAt: &t1}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetBatch(ctx, "acct-a", "bat_1")
	if got.Done != 1 || got.Failed != 1 || got.Total != 3 {
		t.Fatalf("counts %+v", got)
	}
	pending, _ = s.PendingBatchItems(ctx, "bat_1")
	if len(pending) != 1 || pending[0].Index != 2 {
		t.Fatalf("pending after two ended: %+v", pending)
	}
	page, err := s.PageBatchItems(ctx, "bat_1", -1, 10)
	if err != nil || len(page) != 2 || page[0].Index != 0 || page[1].Index != 1 || string(page[1].Result) != "7" ||
		page[1].Error != nil || string(page[0].Error) != `{"name":"ValueError"}` || page[0].Attempts != 2 || !page[1].EndedAt.Equal(t1) {
		t.Fatalf("page %+v, %v", page, err)
	}
	page, _ = s.PageBatchItems(ctx, "bat_1", 0, 10)
	if len(page) != 1 || page[0].Index != 1 {
		t.Fatalf("page after 0: %+v", page)
	}
	page, _ = s.PageBatchItems(ctx, "bat_1", -1, 1)
	if len(page) != 1 || page[0].Index != 0 {
		t.Fatalf("page of 1: %+v", page)
	}
	running, err := s.RunningBatches(ctx)
	if err != nil || len(running) != 2 || running[0].ID != "bat_1" || running[1].ID != "bat_2" || running[1].Resources != nil {
		t.Fatalf("running %+v, %v", running, err)
	}
	if ok, err := s.EndBatch(ctx, "bat_1", store.BatchCanceled, "", "", t1); err != nil || !ok {
		t.Fatalf("end batch: %v %v", ok, err)
	}
	if ok, _ := s.EndBatch(ctx, "bat_1", store.BatchDone, "", "", t1); ok {
		t.Fatal("an ended batch ended again")
	}
	got, _ = s.GetBatch(ctx, "acct-a", "bat_1")
	if got.Status != store.BatchCanceled || got.EndedAt == nil || !got.EndedAt.Equal(t1) {
		t.Fatalf("after cancel %+v", got)
	}
	running, _ = s.RunningBatches(ctx)
	if len(running) != 1 || running[0].ID != "bat_2" {
		t.Fatalf("running after cancel %+v", running)
	}
	// Usage adds up, an ended batch's too (its last sandboxes end after).
	u := store.BatchUsage{Sandboxes: 2, WallNanos: 3e9, CPUNanos: 1e9, GBSecondsReserved: 0.75, GBSecondsUsed: 0.25, Executions: 4}
	for range 2 {
		if err := s.AddBatchUsage(ctx, "bat_1", u); err != nil {
			t.Fatal(err)
		}
	}
	got, _ = s.GetBatch(ctx, "acct-a", "bat_1")
	if want := (store.BatchUsage{Sandboxes: 4, WallNanos: 6e9, CPUNanos: 2e9, GBSecondsReserved: 1.5, GBSecondsUsed: 0.5, Executions: 8}); got.Usage != want {
		t.Fatalf("usage %+v, want %+v", got.Usage, want)
	}
	if other, _ := s.GetBatch(ctx, "acct-b", "bat_2"); other.Usage != (store.BatchUsage{}) || other.Reuse != "" {
		t.Fatalf("another batch's usage %+v", other)
	}
	list, err := s.ListBatches(ctx, "acct-a", 10)
	if err != nil || len(list) != 1 || list[0].ID != "bat_1" || string(list[0].Resources) != `{"cpus":0.5}` {
		t.Fatalf("list %+v, %v", list, err)
	}
}
