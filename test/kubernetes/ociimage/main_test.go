package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readTar returns the regular files of a tar archive by name.
func readTar(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	files := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = hdr
	}
}

func readTarFile(t *testing.T, b []byte, name string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in archive: %v", name, err)
		}
		if hdr.Name == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "server")
	if err := os.WriteFile(bin, []byte("not really an ELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	if err := write("localhost/test/server:1", bin, out, []string{":8080"}); err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}

	// Every blob is named by its digest.
	for name := range readTar(t, archive) {
		if !strings.HasPrefix(name, "blobs/sha256/") || strings.HasSuffix(name, "/") {
			continue
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(readTarFile(t, archive, name))); got != strings.TrimPrefix(name, "blobs/sha256/") {
			t.Errorf("blob %s has digest %s", name, got)
		}
	}
	if string(readTarFile(t, archive, "oci-layout")) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Error("oci-layout is wrong")
	}

	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(readTarFile(t, archive, "index.json"), &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != "localhost/test/server:1" || m.Annotations["org.opencontainers.image.ref.name"] != "1" {
		t.Errorf("index annotations %v", m.Annotations)
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	blob := func(d descriptor) []byte {
		b := readTarFile(t, archive, "blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:"))
		if int64(len(b)) != d.Size {
			t.Errorf("%s: size %d, descriptor says %d", d.Digest, len(b), d.Size)
		}
		return b
	}
	if err := json.Unmarshal(blob(m), &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Config struct{ Entrypoint []string } `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(config.Config.Entrypoint, " "); got != "/server :8080" {
		t.Errorf("entrypoint %q", got)
	}
	if len(manifest.Layers) != 1 || len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Fatalf("layers %v, diff_ids %v: want one uncompressed layer named by its diff_id", manifest.Layers, config.RootFS.DiffIDs)
	}
	layer := blob(manifest.Layers[0])
	hdr := readTar(t, layer)["server"]
	if hdr == nil || hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Gid != 0 {
		t.Fatalf("layer entry for the binary: %+v", hdr)
	}
	if string(readTarFile(t, layer, "server")) != "not really an ELF" {
		t.Error("layer holds other bytes than the binary")
	}

	// The same binary gives the same archive.
	again := filepath.Join(dir, "again.tar")
	if err := write("localhost/test/server:1", bin, again, []string{":8080"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(again); !bytes.Equal(b, archive) {
		t.Error("two writes of the same image differ")
	}
}

func TestWriteNeedsTag(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "x")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := write("localhost/test/x", bin, filepath.Join(dir, "x.tar"), nil); err == nil {
		t.Error("an image name without a tag was accepted")
	}
}
