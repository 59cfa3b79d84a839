package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sheepfold/sheepfold/internal/template/ociimage"
)

// writeBlob stores b in the layout dir and returns its descriptor.
func writeBlob(t *testing.T, dir, mediaType string, b []byte) v1.Descriptor {
	t.Helper()
	sum := sha256.Sum256(b)
	d := v1.Descriptor{MediaType: mediaType, Digest: digest.Digest("sha256:" + hex.EncodeToString(sum[:])), Size: int64(len(b))}
	p := filepath.Join(dir, "blobs", "sha256", d.Digest.Encoded())
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// layoutOf writes an OCI image layout directory of the given layers.
func layoutOf(t *testing.T, layers ...[]byte) string {
	t.Helper()
	dir := t.TempDir()
	cfg, _ := json.Marshal(v1.Image{Config: v1.ImageConfig{Env: []string{"PATH=/bin", "FROM_IMAGE=1"}, WorkingDir: "/srv"}})
	m := v1.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: v1.MediaTypeImageManifest,
		Config: writeBlob(t, dir, v1.MediaTypeImageConfig, cfg)}
	for _, l := range layers {
		m.Layers = append(m.Layers, writeBlob(t, dir, v1.MediaTypeImageLayer, l))
	}
	mb, _ := json.Marshal(m)
	idx, _ := json.Marshal(v1.Index{Versioned: specs.Versioned{SchemaVersion: 2},
		Manifests: []v1.Descriptor{writeBlob(t, dir, v1.MediaTypeImageManifest, mb)}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

type layerEntry struct {
	name, body, link string
	typ              byte
	uid              int
}

func layerOf(t *testing.T, entries ...layerEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: e.typ, Linkname: e.link, Uid: e.uid, Gid: e.uid}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

var imageBase = []layerEntry{
	{name: "etc/", typ: tar.TypeDir},
	{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
	{name: "etc/group", body: "root:x:0:\n"},
	{name: "etc/shadow", body: "root:*:19000:0:99999:7:::\n"},
	{name: "etc/gshadow", body: "root:*::\n"},
	{name: "bin/", typ: tar.TypeDir},
	{name: "bin/tool", body: "tool v1\n"},
	{name: "bin/old", body: "deleted by layer 2\n"},
	{name: "srv/", typ: tar.TypeDir},
	{name: "srv/data/", typ: tar.TypeDir},
	{name: "srv/data/a", body: "a\n", uid: 33},
}

// TestDockerfileFromOCIImage builds FROM an OCI image layout, as a
// directory and as an archive (written by ociimage, what `template
// export` writes): layers apply in order with their whiteouts, owners are
// shifted, the sandbox user is added, the image's Env and WorkingDir are
// kept, and the image's base is cached.
func TestDockerfileFromOCIImage(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, map[string]string{"ok": "ok\n"})
	dir := layoutOf(t, layerOf(t, imageBase...), layerOf(t,
		layerEntry{name: "bin/.wh.old", body: ""},
		layerEntry{name: "bin/tool", body: "tool v2\n"},
		layerEntry{name: "srv/data/", typ: tar.TypeDir},
		layerEntry{name: "srv/data/.wh..wh..opq", body: ""},
		layerEntry{name: "srv/data/b", body: "b\n"},
		layerEntry{name: "bin/tool-link", typ: tar.TypeLink, link: "bin/tool"},
	))
	info, err := dfBuild(t, dataDir, ctxDir, "img", "FROM oci:"+dir+"\nCOPY ok ./ok\n", &hostRunner{})
	if err != nil {
		t.Fatal(err)
	}
	root := info.Path
	for p, want := range map[string]string{"bin/tool": "tool v2\n", "bin/tool-link": "tool v2\n", "srv/data/b": "b\n", "srv/ok": "ok\n"} {
		if got := readFile(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"bin/old", "srv/data/a"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s, deleted by a whiteout, is there: %v", p, err)
		}
	}
	if uid, _, _ := lstatOwner(t, filepath.Join(root, "bin/tool")); uid != 1000 {
		t.Errorf("bin/tool owner %d, want 1000 (root shifted)", uid)
	}
	if !strings.Contains(readFile(t, filepath.Join(root, "etc/passwd")), "user:x:1000:1000") {
		t.Error("the sandbox user was not added")
	}
	if info.WorkDir != "/srv" || strings.Join(info.Env, " ") != "PATH=/bin FROM_IMAGE=1" {
		t.Errorf("image config not kept: %+v", info)
	}

	// The archive form, as ociimage writes it; the second build finds
	// the image's base cached.
	tree := t.TempDir()
	writeTree(t, tree, map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\n", "etc/group": "root:x:0:\n",
		"etc/shadow": "root:*:19000:0:99999:7:::\n", "etc/gshadow": "root:*::\n", "usr/bin/x": "x\n"})
	if err := chownTree(tree, 7000, 7000); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(ctxDir, "img.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ociimage.Write(context.Background(), f, ociimage.Options{Name: "test/img", RootFS: tree, HostID: 7000, TempDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for i := range 2 {
		info, err := dfBuild(t, dataDir, ctxDir, "img2", "FROM oci-archive:img.tar\n", &hostRunner{})
		if err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(info.Path, "usr/bin/x")); got != "x\n" {
			t.Errorf("usr/bin/x = %q", got)
		}
		log, _ := BuildLog(dataDir, "img2")
		if cached := bytes.Contains(log, []byte(": cached")); cached != (i == 1) {
			t.Errorf("build %d: image base cached = %v\n%s", i+1, cached, log)
		}
	}
}

// TestDockerfileImageEscape: a layer's entries cannot land outside the
// image's tree: not by .., not under a symbolic link an earlier entry
// made, not by a hard link to a host file; a blob that does not match its
// digest is refused.
func TestDockerfileImageEscape(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"secret": "host secret\n"})
	for name, layer := range map[string][]layerEntry{
		"dotdot":       {{name: "../../../../../../" + outside + "/dotdot", body: "x"}},
		"symlink dir":  {{name: "l", typ: tar.TypeSymlink, link: outside}, {name: "l/via-link", body: "x"}},
		"hard link":    {{name: "h", typ: tar.TypeLink, link: "../../../../../../" + outside + "/secret"}},
		"abs symlink2": {{name: "m", typ: tar.TypeSymlink, link: "../../../../../../../.." + outside}, {name: "m/via-rel-link", body: "x"}},
	} {
		dir := layoutOf(t, layerOf(t, append(append([]layerEntry{}, imageBase...), layer...)...))
		_, err := dfBuild(t, dataDir, ctxDir, "esc", "FROM oci:"+dir+"\n", &hostRunner{})
		if err == nil {
			t.Errorf("%s: the build succeeded", name)
		}
		t.Logf("%s: %v", name, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("entries landed outside: %v", ents)
	}
	if got := readFile(t, filepath.Join(outside, "secret")); got != "host secret\n" {
		t.Fatalf("the host file changed: %q", got)
	}
	// Control: a naive join through the planted link lands outside.
	scratch := t.TempDir()
	os.Symlink(outside, filepath.Join(scratch, "l"))
	if err := os.WriteFile(filepath.Join(scratch, "l", "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "control")); err != nil {
		t.Fatalf("control: %v", err)
	}
	os.Remove(filepath.Join(outside, "control"))
	// A tampered blob.
	dir := layoutOf(t, layerOf(t, imageBase...))
	blobs, _ := filepath.Glob(filepath.Join(dir, "blobs", "sha256", "*"))
	for _, b := range blobs {
		if data, _ := os.ReadFile(b); bytes.Contains(data, []byte("tool v1")) {
			os.WriteFile(b, bytes.Replace(data, []byte("tool v1"), []byte("tool v9"), 1), 0o644)
		}
	}
	if _, err := dfBuild(t, dataDir, ctxDir, "esc", "FROM oci:"+dir+"\n", &hostRunner{}); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("tampered blob: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(templatesDir(dataDir), layersDir, ".*")); len(left) > 0 {
		t.Errorf("left in the layer cache: %v", left)
	}
}
