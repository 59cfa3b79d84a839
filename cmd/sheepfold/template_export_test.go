package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// fakeTemplate makes a small built template called name in a new data dir
// (its files owned by shifted ids) and an agent binary, and returns both
// paths.
func fakeTemplate(t *testing.T, name string) (dataDir, agent string) {
	t.Helper()
	dataDir = t.TempDir()
	dir := filepath.Join(dataDir, "templates", name)
	shift := int(oci.DefaultIDMap.HostID)
	files := map[string]string{"etc/": "", "etc/hostname": "sandbox\n", "home/user/": "", "usr/local/bin/": "", "bin": "->usr/bin", "usr/bin/": ""}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		full := filepath.Join(dir, "rootfs", p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch c := files[p]; {
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(full, 0o755)
		case strings.HasPrefix(c, "->"):
			err = os.Symlink(c[2:], full)
		default:
			err = os.WriteFile(full, []byte(c), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	err := filepath.Walk(filepath.Join(dir, "rootfs"), func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		id := shift
		if strings.Contains(p, "home/user") {
			id += 1000
		}
		return os.Lchown(p, id, id)
	})
	if err != nil {
		t.Fatal(err)
	}
	info := template.Info{Name: name, Suite: "bookworm", Packages: []string{"python3"},
		Created: time.Date(2026, 12, 4, 14, 50, 17, 0, time.UTC), UIDShift: uint32(shift), Version: template.FormatVersion}
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	agent = filepath.Join(t.TempDir(), "sheepfold-agent")
	if err := os.WriteFile(agent, []byte("\x7fELF agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dataDir, agent
}

// archiveIndex reads the image archive at p: its index.json, the config
// blob and the names of all entries.
func archiveIndex(t *testing.T, p string) (v1.Index, v1.Image, []string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	var names []string
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Size < 1<<20 {
			if blobs[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	var idx v1.Index
	var m v1.Manifest
	var img v1.Image
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", blobs["index.json"], err)
	}
	if err := json.Unmarshal(blobs["blobs/sha256/"+idx.Manifests[0].Digest.Encoded()], &m); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blobs["blobs/sha256/"+m.Config.Digest.Encoded()], &img); err != nil {
		t.Fatal(err)
	}
	return idx, img, names
}

// leftovers lists what is in dir but the names in keep.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		if !slices.Contains(keep, e.Name()) {
			left = append(left, e.Name())
		}
	}
	return left
}

func TestTemplateExport(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	dataDir, agent := fakeTemplate(t, "demo")
	outDir := t.TempDir()
	out := filepath.Join(outDir, "demo.tar")
	o := exportOptions{DataDir: dataDir, Agent: agent, Output: out}
	ctx := context.Background()

	res, err := exportTemplate(ctx, "demo", o)
	if err != nil {
		t.Fatal(err)
	}
	idx, img, names := archiveIndex(t, out)
	if !strings.HasPrefix(res.Ref, "sheepfold.local/template/demo:") || idx.Manifests[0].Annotations["io.containerd.image.name"] != res.Ref {
		t.Errorf("Ref %s, index annotations %v", res.Ref, idx.Manifests[0].Annotations)
	}
	if idx.Manifests[0].Digest != res.Manifest.Digest {
		t.Errorf("index names %s, Result %s", idx.Manifests[0].Digest, res.Manifest.Digest)
	}
	c := img.Config
	if !slices.Equal(c.Entrypoint, []string{oci.AgentPath}) || c.User != "0:0" || c.WorkingDir != oci.SandboxHome ||
		!slices.Equal(c.Env, oci.BaseEnv) || c.Labels["io.sheepfold.template"] != "demo" ||
		!strings.HasPrefix(c.Labels["io.sheepfold.agent.digest"], "sha256:") {
		t.Errorf("image config %+v", c)
	}
	if len(img.RootFS.DiffIDs) != 2 || !slices.Contains(names, "oci-layout") {
		t.Errorf("diff_ids %v, entries %v", img.RootFS.DiffIDs, names)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o644 || fi.Size() != res.Size {
		t.Errorf("archive: %v, %v; Result.Size %d", fi, err, res.Size)
	}

	// An existing output needs --force.
	if _, err := exportTemplate(ctx, "demo", o); err == nil || !strings.Contains(err.Error(), "use --force") {
		t.Errorf("export over an existing file: %v", err)
	}
	o.Force, o.Tag = true, "v2"
	if res, err = exportTemplate(ctx, "demo", o); err != nil || res.Ref != "sheepfold.local/template/demo:v2" {
		t.Errorf("--force --tag v2: %v, %v", res.Ref, err)
	}
	if idx, _, _ := archiveIndex(t, out); idx.Manifests[0].Annotations[v1.AnnotationRefName] != "v2" {
		t.Errorf("--force did not replace the archive: %v", idx.Manifests[0].Annotations)
	}
	if left := leftovers(t, outDir, "demo.tar"); len(left) > 0 {
		t.Errorf("left in the output dir: %v", left)
	}
}

func TestTemplateExportFails(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	tests := []struct {
		name   string
		tpl    string
		change func(t *testing.T, dataDir string, o *exportOptions)
		is     error
		want   string
	}{
		{name: "unknown template", tpl: "nope", is: template.ErrUnknown, want: `unknown template "nope"`},
		{name: "builtin not built", tpl: "python", is: template.ErrNotBuilt, want: "sheepfold template build python"},
		{name: "missing agent", tpl: "demo", change: func(t *testing.T, _ string, o *exportOptions) {
			o.Agent = filepath.Join(t.TempDir(), "sheepfold-agent")
		}, want: "not found: run `make build`"},
		{name: "agent is a directory", tpl: "demo", change: func(t *testing.T, _ string, o *exportOptions) {
			o.Agent = t.TempDir()
		}, want: "is not a regular file"},
		{name: "bad tag", tpl: "demo", change: func(t *testing.T, _ string, o *exportOptions) { o.Tag = "a:b" }, want: "invalid image tag"},
		{name: "output is a directory", tpl: "demo", change: func(t *testing.T, _ string, o *exportOptions) {
			o.Output = filepath.Dir(o.Output)
		}, want: "is a directory"},
		{name: "unshifted file", tpl: "demo", change: func(t *testing.T, dataDir string, _ *exportOptions) {
			if err := os.Lchown(filepath.Join(dataDir, "templates/demo/rootfs/etc/hostname"), 0, 0); err != nil {
				t.Fatal(err)
			}
		}, want: "rebuild it: sheepfold template build --force demo"},
		{name: "cancelled", tpl: "demo", is: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dataDir, agent := fakeTemplate(t, "demo")
			outDir := t.TempDir()
			o := exportOptions{DataDir: dataDir, Agent: agent, Output: filepath.Join(outDir, "out.tar")}
			if tt.change != nil {
				tt.change(t, dataDir, &o)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.is == context.Canceled {
				cancel()
			}
			_, err := exportTemplate(ctx, tt.tpl, o)
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("export: %v; want an error containing %q (is %v)", err, tt.want, tt.is)
			}
			if left := leftovers(t, outDir); len(left) > 0 {
				t.Errorf("a failed export left %v", left)
			}
		})
	}
}
