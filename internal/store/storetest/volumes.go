package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/sheepfold/sheepfold/internal/store"
)

func testVolumes(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now()
	a := store.Volume{Owner: "acct-a", Name: "data", ID: "v1", SizeBytes: 100 << 20, CreatedAt: t0}
	if err := s.CreateVolume(ctx, a, 3, 300<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-a", Name: "data", ID: "v9", SizeBytes: 1, CreatedAt: t0}, 3, 0); !errors.Is(err, store.ErrExists) {
		t.Fatalf("the same name again: %v, want ErrExists", err)
	}
	// Another owner's name space is its own.
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-b", Name: "data", ID: "v2", SizeBytes: 1 << 20, CreatedAt: t0}, 1, 0); err != nil {
		t.Fatal(err)
	}
	// The byte bound: 100 + 250 MiB is past 300.
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-a", Name: "big", ID: "v3", SizeBytes: 250 << 20, CreatedAt: t0}, 3, 300<<20); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("past the byte bound: %v, want ErrLimit", err)
	}
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-a", Name: "cache", ID: "v4", SizeBytes: 200 << 20, CreatedAt: t0}, 3, 300<<20); err != nil {
		t.Fatalf("at the byte bound exactly: %v", err)
	}
	// The count bound.
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-b", Name: "two", ID: "v5", SizeBytes: 1, CreatedAt: t0}, 1, 0); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("past the count bound: %v, want ErrLimit", err)
	}

	got, err := s.GetVolume(ctx, "acct-a", "data")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != a.ID || got.Owner != a.Owner || got.Name != a.Name || got.SizeBytes != a.SizeBytes || !got.CreatedAt.Equal(t0) || got.CreatedAt.Location().String() != "UTC" {
		t.Fatalf("got %+v, want %+v", got, a)
	}
	if _, err := s.GetVolume(ctx, "acct-b", "cache"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another owner's volume: %v, want ErrNotFound", err)
	}
	l, err := s.ListVolumes(ctx, "acct-a")
	if err != nil || len(l) != 2 || l[0].Name != "cache" || l[1].Name != "data" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	all, err := s.AllVolumes(ctx)
	if err != nil || len(all) != 3 || all[2].Owner != "acct-b" {
		t.Fatalf("all: %+v, %v", all, err)
	}
	if err := s.DeleteVolume(ctx, "acct-b", "cache"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete another owner's volume: %v, want ErrNotFound", err)
	}
	if err := s.DeleteVolume(ctx, "acct-a", "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVolume(ctx, "acct-a", "data"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted: %v, want ErrNotFound", err)
	}
	if l, err := s.ListVolumes(ctx, "acct-b"); err != nil || len(l) != 1 {
		t.Fatalf("acct-b kept: %+v, %v", l, err)
	}
}
