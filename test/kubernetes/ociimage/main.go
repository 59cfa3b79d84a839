// Command ociimage writes an OCI image archive (an OCI image layout in a
// tar: oci-layout, index.json, blobs/sha256/...) holding one static binary,
// for the test cluster of test/kubernetes/cluster.sh, whose containerds can
// reach no registry and import such archives with `ctr images import`.
//
//	ociimage -name localhost/sheepfold/pause:1 -bin pause -out pause.tar [-- ARG...]
//
// The image has one uncompressed layer with the binary at /NAME-OF-BIN (mode
// 0755, owner 0:0, time 0, so the same binary gives the same digests) and
// the binary, followed by ARGs, as its entrypoint. The index names the image
// with the io.containerd.image.name annotation, which ctr uses as the image's
// name. Written here rather than with a library because it is a hundred
// lines of archive/tar and JSON with the standard library.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// blobs holds the archive's content-addressed files in the order written.
type blobs struct {
	names []string
	data  map[string][]byte
}

// add stores b and returns its descriptor.
func (bs *blobs) add(mediaType string, b []byte) descriptor {
	d := fmt.Sprintf("sha256:%x", sha256.Sum256(b))
	name := "blobs/sha256/" + strings.TrimPrefix(d, "sha256:")
	if _, ok := bs.data[name]; !ok {
		bs.names = append(bs.names, name)
		bs.data[name] = b
	}
	return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

func main() {
	name := flag.String("name", "", "image reference, e.g. localhost/sheepfold/pause:1")
	bin := flag.String("bin", "", "static binary to put at the image's root")
	out := flag.String("out", "", "archive to write")
	flag.Parse()
	if *name == "" || *bin == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: ociimage -name REF -bin BINARY -out FILE.tar [-- ARG...]")
		os.Exit(2)
	}
	if err := write(*name, *bin, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func write(name, bin, out string, args []string) error {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	if !strings.Contains(name, ":") && !strings.Contains(name, "@") {
		return fmt.Errorf("image name %q needs a tag", name)
	}
	path := "/" + filepath.Base(bin)
	layer, err := tarFiles([]file{{name: path[1:], mode: 0o755, data: exe}})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	bs := &blobs{data: map[string][]byte{}}
	layerDesc := bs.add(mediaLayer, layer)

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": append([]string{path}, args...),
			"Env":        []string{"PATH=/"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := bs.add(mediaConfig, config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := bs.add(mediaManifest, manifest)
	manifestDesc.Platform = &platform{Architecture: runtime.GOARCH, OS: "linux"}
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndexAny(name, ":@")+1:],
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}

	files := []file{
		{name: "oci-layout", mode: 0o644, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: "index.json", mode: 0o644, data: index},
	}
	for _, n := range bs.names {
		files = append(files, file{name: n, mode: 0o644, data: bs.data[n]})
	}
	archive, err := tarFiles(files)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, archive, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

type file struct {
	name string
	mode int64
	data []byte
}

// tarFiles returns a tar of files, with the directories their names need,
// owned by 0:0 and dated at the epoch so that its bytes depend on nothing
// else.
func tarFiles(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	epoch := time.Unix(0, 0)
	for _, f := range files {
		var parents []string
		for d := filepath.Dir(f.name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
