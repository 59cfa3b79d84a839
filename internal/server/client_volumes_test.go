package server_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKVolumes drives /v1/volumes and volume mounts through the Go
// SDK.
func TestGoSDKVolumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	ctx := context.Background()
	c, other := client.New(e.url, e.keyA), client.New(e.url, e.keyB)
	v, err := c.CreateVolume(ctx, "data", 16)
	if err != nil || v.Name != "data" || v.SizeMB != 16 || v.CreatedAt.IsZero() {
		t.Fatalf("create: %+v, %v", v, err)
	}
	if v, err = c.CreateVolume(ctx, "cache", 0); err != nil || v.SizeMB != server.DefaultVolumeLimits.DefaultMB {
		t.Fatalf("create at the default size: %+v, %v", v, err)
	}
	if _, err := c.CreateVolume(ctx, "data", 16); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("create twice: %v", err)
	}
	if l, err := c.ListVolumes(ctx); err != nil || len(l) != 2 || l[0].Name != "cache" || l[1].Name != "data" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{VolumeMounts: []client.VolumeMount{{Name: "data", Path: "/data"}, {Name: "cache", Path: "/mnt/cache", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if vs := e.rt.Spec(sb.ID).Volumes; len(vs) != 2 || vs[0].ReadOnly || !vs[1].ReadOnly || vs[1].Path != "/mnt/cache" {
		t.Fatalf("the runtime mounts %+v", vs)
	}
	want := []client.VolumeMount{{Name: "data", Path: "/data"}, {Name: "cache", Path: "/mnt/cache", ReadOnly: true}}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || !reflect.DeepEqual(got.VolumeMounts, want) {
		t.Fatalf("get shows the mounts %+v, %v", got, err)
	}
	if v, err := c.GetVolume(ctx, "data"); err != nil || len(v.MountedBy) != 1 || v.MountedBy[0] != sb.ID || v.UsedBytes == nil {
		t.Fatalf("get: %+v, %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "data"); !errors.Is(err, client.ErrVolumeInUse) {
		t.Fatalf("delete while mounted: %v", err)
	}
	if _, err := other.GetVolume(ctx, "data"); !errors.Is(err, client.ErrVolumeNotFound) {
		t.Fatalf("another account's get: %v", err)
	}
	if _, err := other.CreateSandbox(ctx, client.CreateSandboxRequest{VolumeMounts: []client.VolumeMount{{Name: "data", Path: "/data"}}}); !errors.Is(err, client.ErrVolumeNotFound) {
		t.Fatalf("another account's mount: %v", err)
	}
	if _, err := c.WriteVolumeFile(ctx, "data", "/x", strings.NewReader("x")); !errors.Is(err, client.ErrVolumeInUse) {
		t.Fatalf("a file write while a sandbox writes: %v", err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Files without a sandbox.
	if f, err := c.WriteVolumeFile(ctx, "data", "/in/a.txt", strings.NewReader("hello")); err != nil || f.Path != "/in/a.txt" || f.Size != 5 || f.Type != "file" {
		t.Fatalf("write: %+v, %v", f, err)
	}
	if b, err := c.ReadVolumeFile(ctx, "data", "in/a.txt"); err != nil || string(b) != "hello" {
		t.Fatalf("read: %q, %v", b, err)
	}
	if l, err := c.ListVolumeFiles(ctx, "data", ""); err != nil || len(l) != 1 || l[0].Name != "in" || l[0].Type != "dir" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if _, err := other.ReadVolumeFile(ctx, "data", "/in/a.txt"); !errors.Is(err, client.ErrVolumeNotFound) {
		t.Fatalf("another account's read: %v", err)
	}
	if err := c.RemoveVolumeFile(ctx, "data", "/in/a.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadVolumeFile(ctx, "data", "/in/a.txt"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read a removed file: %v", err)
	}
	if err := c.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
}

// TestPythonSDKVolumes runs sdk/python/tests/test_volumes.py against a
// server.
func TestPythonSDKVolumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "-v", "test_volumes")
	cmd.Dir = "../../sdk/python/tests"
	cmd.Env = append(os.Environ(), "SHEEPFOLD_VOLUMES_URL="+e.url, "SHEEPFOLD_VOLUMES_KEY="+e.keyA, "SHEEPFOLD_VOLUMES_OTHER_KEY="+e.keyB)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python volumes client: %v\n%s", err, out)
	}
}
