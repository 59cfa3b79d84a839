package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestTemplateImportRegistry: `template import HOST/REPO:TAG NAME` pulls
// from a registry the flags allow (here one on loopback, plain HTTP) and
// refuses one they do not name.
func TestTemplateImportRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, body := range map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\n", "etc/group": "root:x:0:\n",
		"etc/shadow": "root:*:1::::::\n", "etc/gshadow": "root:*::\n", "usr/bin/tool": "tool\n"} {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/tiny:1")
	if err := ggcrremote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	run := func(args ...string) error {
		cmd := templateCmd(&config.Config{DataDir: data})
		cmd.SetArgs(args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		return cmd.ExecuteContext(context.Background())
	}
	if err := run("import", host+"/tiny:1", "denied", "-q"); !errors.Is(err, template.ErrRegistryNotAllowed) {
		t.Fatalf("import from a registry not listed: %v", err)
	}
	if err := run("import", host+"/tiny:1", "tiny", "-q", "--insecure-registry", host); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(data, "templates", "tiny", "rootfs", "usr", "bin", "tool")); err != nil || string(got) != "tool\n" {
		t.Fatalf("imported file: %q, %v", got, err)
	}
}
