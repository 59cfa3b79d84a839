package sandbox_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/volume"
)

// claims is a runtime whose host does not hold its volumes (no
// runtime.VolumeOpener), as Kubernetes' claims.
type claims struct {
	runtime.Runtime
	runtime.Volumes
}

// TestVolumeAttendant: on a runtime whose host does not hold its volumes,
// a volume's files and figures go through an attendant instance that
// mounts it read-write at AttendantMount, has no network, and ends once
// idle; writes past the volume's size are refused (volume.ErrFull, as the
// host's full filesystem); a create that mounts the volume stops the
// attendant first; a read-write sandbox's end has the volume measured;
// removing the volume stops its attendant. Not parallel: it sets the
// package's attendant hooks.
func TestVolumeAttendant(t *testing.T) {
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	rt.VolumesUnmeasured.Store(true)
	m := startEngine(t, sandbox.Config{Runtime: claims{rt, rt}, Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt)
	defer sandbox.SetAttendantIdle(300 * time.Millisecond)()
	defer sandbox.SetMeasureCommand("echo", "1000", sandbox.AttendantMount)()
	measureAs := func(n string) { sandbox.SetMeasureCommand("echo", n, sandbox.AttendantMount) }
	ctx := context.Background()
	const size = 1 << 20
	if err := m.MakeVolume(ctx, "vol-1", size); err != nil {
		t.Fatal(err)
	}
	attendants := func() []runtime.Spec {
		ids, _ := rt.List(ctx)
		var out []runtime.Spec
		for _, id := range ids {
			if strings.HasPrefix(id, "vf") {
				out = append(out, rt.Spec(id))
			}
		}
		return out
	}

	fsys, err := m.OpenVolume(ctx, "vol-1", size)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if len(attendants()) != 0 {
		t.Fatal("an attendant started before a call")
	}
	if _, err := fsys.Write("/a/b.txt", strings.NewReader("hello"), 1<<20); err != nil {
		t.Fatal(err)
	}
	att := attendants()
	if len(att) != 1 {
		t.Fatalf("attendants after a write: %+v", att)
	}
	if s := att[0]; s.Network != nil || len(s.Volumes) != 1 || s.Volumes[0] != (runtime.VolumeMount{ID: "vol-1", Path: sandbox.AttendantMount}) || s.Lifetime <= 0 || !s.Attendant {
		t.Fatalf("the attendant's spec: %+v", s)
	}
	f, e, err := fsys.Open("a/b.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "hello" || e.Size != 5 || e.Path != "/a/b.txt" || e.Type != "file" {
		t.Fatalf("read %q, entry %+v", b, e)
	}
	l, err := fsys.List("/a", 100)
	if err != nil || len(l) != 1 || l[0].Path != "/a/b.txt" || l[0].Name != "b.txt" {
		t.Fatalf("list: %+v %v", l, err)
	}
	if err := fsys.Remove("/a"); !errors.Is(err, volume.ErrNotEmpty) {
		t.Errorf("remove a directory that is not empty: %v", err)
	}
	if err := fsys.Remove("/"); !errors.Is(err, volume.ErrBadPath) {
		t.Errorf("remove the root: %v", err)
	}
	if _, _, err := fsys.Open("/../../etc/passwd"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("a path above the root: %v, want not found (it is the volume's /etc/passwd)", err)
	}
	if got := attendants(); len(got) != 1 || got[0].ID != att[0].ID {
		t.Fatalf("a burst of calls started more attendants: %+v", got)
	}
	if u, total, err := m.VolumeUsage(ctx, "vol-1", size); err != nil || u != 1000 || total != size {
		t.Fatalf("usage: %d of %d, %v", u, total, err)
	}

	// The size: measured use plus the body.
	measureAs(strconv.Itoa(size - 100))
	if _, err := fsys.Write("/big", strings.NewReader(strings.Repeat("x", 101)), 1<<20); !errors.Is(err, volume.ErrFull) {
		t.Errorf("a write past the size: %v", err)
	}
	if _, err := fsys.Write("/small", strings.NewReader(strings.Repeat("x", 100)), 1<<20); err != nil {
		t.Errorf("a write that fits: %v", err)
	}
	// The caller's own limit stays its error.
	if _, err := fsys.Write("/limited", strings.NewReader("123456"), 5); !errors.Is(err, volume.ErrFileTooLong) {
		t.Errorf("a write past the caller's limit: %v", err)
	}
	measureAs(strconv.Itoa(size + 1))
	if _, err := fsys.Write("/one", strings.NewReader("x"), 1<<20); !errors.Is(err, volume.ErrFull) {
		t.Errorf("a write into a volume past its size: %v", err)
	}
	if u, at, ok := m.LastVolumeUse("vol-1"); !ok || u != size+1 || time.Since(at) > time.Minute {
		t.Errorf("the last use: %d %v %v", u, at, ok)
	}

	// A create that mounts the volume stops the attendant first.
	measureAs("2000")
	s, err := m.Create(ctx, sandbox.CreateOptions{Template: "python", Volumes: []sandbox.VolumeMount{{Name: "data", ID: "vol-1", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := attendants(); len(got) != 0 {
		t.Fatalf("attendants while a sandbox mounts the volume: %+v", got)
	}
	// Reads go on while it runs (an attendant on its node).
	if _, err := fsys.List("/", 100); err != nil {
		t.Fatal(err)
	}
	if got := attendants(); len(got) != 1 || got[0].Node != rt.Spec(s.ID).Node {
		t.Fatalf("the attendant beside a sandbox: %+v", got)
	}
	// Its end has the volume measured.
	_, before, _ := m.LastVolumeUse("vol-1")
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if u, at, _ := m.LastVolumeUse("vol-1"); at.After(before) && u == 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the volume was not measured after its writer stopped")
		}
	}
	// Idle, it goes.
	for deadline := time.Now().Add(10 * time.Second); len(attendants()) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the attendant outlived its idle time: %+v", attendants())
		}
	}

	// Removing the volume stops its attendant, and later calls find it gone.
	if _, err := fsys.List("/", 100); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveVolume(ctx, "vol-1", "data"); err != nil {
		t.Fatal(err)
	}
	if got := attendants(); len(got) != 0 {
		t.Fatalf("attendants after the volume's removal: %+v", got)
	}
	_, err = fsys.List("/", 100)
	wantCode(t, err, apierr.VolumeNotFound)
	if ids, _ := rt.List(ctx); slices.ContainsFunc(ids, func(id string) bool { return strings.HasPrefix(id, "vf") }) {
		t.Fatalf("left: %v", ids)
	}
}
