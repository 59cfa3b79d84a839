package sandbox_test

import (
	"context"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestCheckVolumePath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		path string
		ok   bool
	}{
		{"/data", true},
		{"/home/user/data", true},
		{"/mnt/vol", true},
		{"/workspace/a/b", true},
		{"", false},
		{"data", false},
		{"/", false},
		{"/home/user", false},
		{"/tmp", false},
		{"/data/", false},
		{"/data/../etc", false},
		{"/home/user/..", false},
		{"/data//x", false},
		{"/./data", false},
		{"/etc", false},
		{"/etc/ssl", false},
		{"/usr/local/bin", false},
		{"/proc/self", false},
		{"/dev/shm", false},
		{"/.sheepfold", false},
		{"/sys", false},
		{"/data\nx", false},
		{"/a,b", false},
	} {
		if err := sandbox.CheckVolumePath(c.path); (err == nil) != c.ok {
			t.Errorf("CheckVolumePath(%q) = %v, want ok %v", c.path, err, c.ok)
		}
	}
}

// TestVolumeMounts: a create with volumes takes the pool's miss path and
// hands the runtime its mounts; bad mounts are refused before anything
// starts; one writer at a time unless both share; a mounted volume is not
// removed, and is once its sandbox is gone.
func TestVolumeMounts(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, poolConfig(1))
	ctx := context.Background()
	if err := m.MakeVolume(ctx, "vol-1", 1<<20); err != nil {
		t.Fatal(err)
	}
	waitReady(t, m, 1)
	before := m.PoolStats()
	s, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	spec := rt.Spec(s.ID)
	if spec.Pool || len(spec.Volumes) != 1 || spec.Volumes[0].ID != "vol-1" || spec.Volumes[0].Path != "/data" || spec.Volumes[0].ReadOnly {
		t.Fatalf("the runtime got %+v", spec)
	}
	if after := m.PoolStats(); after.Hits != before.Hits {
		t.Fatalf("a create with volumes came from the pool: %+v then %+v", before, after)
	}

	for _, bad := range [][]sandbox.VolumeMount{
		{{Name: "data", ID: "vol-1", Path: "/etc"}},
		{{Name: "data", ID: "vol-1", Path: "/data/../etc", ReadOnly: true}},
		{{Name: "data", ID: "vol-1", Path: "/a", ReadOnly: true}, {Name: "data", ID: "vol-1", Path: "/b", ReadOnly: true}},
		{{Name: "a", ID: "vol-1", Path: "/a", ReadOnly: true}, {Name: "b", ID: "vol-2", Path: "/a/b", ReadOnly: true}},
	} {
		_, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: bad})
		wantCode(t, err, apierr.BadRequest)
	}

	// A second writer is refused; a reader is not.
	_, err = m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	wantCode(t, err, apierr.VolumeInUse)
	r, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data", ReadOnly: true}}})
	if err != nil {
		t.Fatalf("a reader beside the writer: %v", err)
	}
	wantCode(t, m.RemoveVolume(ctx, "vol-1", "data"), apierr.VolumeInUse)
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, m.RemoveVolume(ctx, "vol-1", "data"), apierr.VolumeInUse) // the reader still mounts it
	if err := m.Kill(ctx, r.ID); err != nil {
		t.Fatal(err)
	}

	// Writers that both share.
	shared := []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data", Shared: true}}
	a, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: shared})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: shared})
	if err != nil {
		t.Fatalf("a second writer that shares: %v", err)
	}
	_, err = m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	wantCode(t, err, apierr.VolumeInUse)
	for _, id := range []string{a.ID, b.ID} {
		if err := m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.RemoveVolume(ctx, "vol-1", "data"); err != nil {
		t.Fatal(err)
	}
	_, err = m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	wantCode(t, err, apierr.VolumeNotFound)
}

// noVolumes is a runtime that keeps no volumes (as the Kubernetes one).
type noVolumes struct{ runtime.Runtime }

// TestVolumesNotSupported: an engine whose runtime keeps no volumes
// answers ERR_NOT_SUPPORTED to a mount, a make and a remove, and starts
// nothing.
func TestVolumesNotSupported(t *testing.T) {
	t.Parallel()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	m := startEngine(t, sandbox.Config{Runtime: noVolumes{rt}, Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt)
	ctx := context.Background()
	_, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	wantCode(t, err, apierr.NotSupported)
	wantCode(t, m.MakeVolume(ctx, "vol-1", 1<<20), apierr.NotSupported)
	wantCode(t, m.RemoveVolume(ctx, "vol-1", "data"), apierr.NotSupported)
	if ids, _ := rt.List(ctx); len(ids) != 0 {
		t.Fatalf("started %v", ids)
	}
}
