package storetest

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

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

// testVolumeMeter: an account's volumes are metered with its storage at
// their sizes, an account with volumes alone too; their share is kept
// apart in each hour; a deleted volume is charged no more.
func testVolumeMeter(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now().Truncate(time.Hour).Add(10 * time.Minute)
	const size = 1 << 30
	if err := s.CreateVolume(ctx, store.Volume{Owner: "acct-v", Name: "data", ID: "vol-m", SizeBytes: size, CreatedAt: t0}, 0, 0); err != nil {
		t.Fatal(err)
	}
	meter := func(at time.Time) []store.StorageCharge {
		t.Helper()
		cs, err := s.MeterStorage(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	if cs := meter(t0); len(cs) != 0 {
		t.Fatalf("the first metering charged %+v", cs)
	}
	cs := meter(t0.Add(100 * time.Second))
	if len(cs) != 1 || cs[0].Account != "acct-v" || cs[0].Bytes != size || cs[0].VolumeBytes != size ||
		cs[0].GBSeconds != 100 || cs[0].VolumeGBSeconds != 100 {
		t.Fatalf("a volume of 1 GiB for 100 s charged %+v, want 100 GB-seconds", cs)
	}
	// Records beside it: both in GBSeconds, the volume's share apart.
	mustNil(t, s.PutSandbox(ctx, store.Sandbox{ID: "sb-v", Owner: "acct-v", Template: "python", State: store.SandboxRunning, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
	kept, err := s.Stored(ctx, "acct-v")
	mustNil(t, err)
	records := kept.Total().Bytes
	cs = meter(t0.Add(110 * time.Second))
	if len(cs) != 1 || cs[0].Bytes != size+records || cs[0].VolumeGBSeconds != 10 || math.Abs(cs[0].GBSeconds-10-float64(records)/(1<<30)*10) > 1e-9 {
		t.Fatalf("records and a volume for 10 s charged %+v", cs)
	}
	hours, err := s.StorageUsage(ctx, "acct-v", time.Time{}, time.Time{})
	if err != nil || len(hours) != 1 || hours[0].VolumeGBSeconds != 110 || hours[0].GBSeconds < 110 {
		t.Fatalf("storage usage %+v, %v", hours, err)
	}
	mustNil(t, s.DeleteVolume(ctx, "acct-v", "data"))
	cs = meter(t0.Add(120 * time.Second))
	if len(cs) != 1 || cs[0].VolumeBytes != 0 || cs[0].VolumeGBSeconds != 0 || cs[0].Bytes != records {
		t.Fatalf("after the delete: %+v", cs)
	}
}

// testSnapshotMeter: an account's snapshots' bytes, as each disk holding
// some set them, are metered with its storage, an account with
// snapshots alone too; their share is kept apart in each hour; bytes set
// to 0, or a disk cleared, are charged no more, and another disk's stay.
func testSnapshotMeter(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := now().Truncate(time.Hour).Add(20 * time.Minute)
	const size = 1 << 30
	mustNil(t, s.SetSnapshotBytes(ctx, "disk-1", "acct-s", size))
	mustNil(t, s.SetSnapshotBytes(ctx, "disk-2", "acct-s", size))
	meter := func(at time.Time) []store.StorageCharge {
		t.Helper()
		cs, err := s.MeterStorage(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		var mine []store.StorageCharge
		for _, c := range cs {
			if c.Account == "acct-s" {
				mine = append(mine, c)
			}
		}
		return mine
	}
	if cs := meter(t0); len(cs) != 0 {
		t.Fatalf("the first metering charged %+v", cs)
	}
	if cs := meter(t0.Add(100 * time.Second)); len(cs) != 1 || cs[0].Bytes != 2*size || cs[0].SnapshotBytes != 2*size ||
		cs[0].GBSeconds != 200 || cs[0].SnapshotGBSeconds != 200 || cs[0].VolumeGBSeconds != 0 {
		t.Fatalf("snapshots of 2 GiB on two disks for 100 s charged %+v, want 200 GB-seconds", cs)
	}
	mustNil(t, s.SetSnapshotBytes(ctx, "disk-1", "acct-s", size/2))
	if cs := meter(t0.Add(110 * time.Second)); len(cs) != 1 || cs[0].SnapshotBytes != size+size/2 || cs[0].SnapshotGBSeconds != 15 {
		t.Fatalf("after a set: %+v", cs)
	}
	hours, err := s.StorageUsage(ctx, "acct-s", time.Time{}, time.Time{})
	if err != nil || len(hours) != 1 || hours[0].SnapshotGBSeconds != 215 || hours[0].GBSeconds != 215 || hours[0].VolumeGBSeconds != 0 {
		t.Fatalf("storage usage %+v, %v", hours, err)
	}
	mustNil(t, s.ClearSnapshotBytes(ctx, "disk-2"))
	mustNil(t, s.SetSnapshotBytes(ctx, "disk-1", "acct-s", 0))
	if cs := meter(t0.Add(120 * time.Second)); len(cs) != 0 {
		t.Fatalf("with no snapshot left: %+v", cs)
	}
}
