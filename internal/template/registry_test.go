package template

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testRegistry is a registry (go-containerregistry's) on loopback that
// counts the requests it gets, and blob fetches apart; with user set it
// asks for basic auth.
type testRegistry struct {
	host            string
	requests, blobs atomic.Int64
	user, password  string
}

func newTestRegistry(t *testing.T, user, password string) *testRegistry {
	t.Helper()
	tr := &testRegistry{user: user, password: password}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tr.user != "" && r.Header.Get("X-Test-Push") == "" {
			if u, p, ok := r.BasicAuth(); !ok || u != tr.user || p != tr.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		if r.Header.Get("X-Test-Push") == "" {
			tr.requests.Add(1)
			if strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
				tr.blobs.Add(1)
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr
}

// pushHeader marks the test's own pushes (not counted, no auth).
type pushHeader struct{ base http.RoundTripper }

func (p pushHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Test-Push", "1")
	return p.base.RoundTrip(r)
}

// push stores an image of the given uncompressed layers as ref and
// returns its manifest digest.
func (tr *testRegistry) push(t *testing.T, repo string, layers ...[]byte) string {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(l, types.OCIUncompressedLayer)); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, ggcrv1.Config{Env: []string{"PATH=/bin", "FROM_REGISTRY=1"}, WorkingDir: "/srv"})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(tr.host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(pushHeader{http.DefaultTransport})); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func dfBuildFrom(t *testing.T, dataDir, ctxDir, name, src string, regs Registries) (Info, error) {
	t.Helper()
	return BuildDockerfile(t.Context(), []byte(src), DockerfileOptions{
		DataDir: dataDir, Name: name, Context: ctxDir, UIDShift: 1000, Runner: &hostRunner{}, Registries: regs,
	})
}

// TestDockerfileFromRegistry builds FROM an image in a registry run on
// loopback, listed by the operator as insecure (plain HTTP): its layers
// apply as an OCI layout's do, its config is kept; a second build and a
// build FROM the same image by digest fetch its manifest and config but
// no layer (the cache is keyed by the manifest's digest).
func TestDockerfileFromRegistry(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, map[string]string{"ok": "ok\n"})
	reg := newTestRegistry(t, "", "")
	dg := reg.push(t, "test/img:v1", layerOf(t, imageBase...), layerOf(t,
		layerEntry{name: "bin/.wh.old", body: ""},
		layerEntry{name: "bin/tool", body: "tool v2\n"},
	))
	regs := Registries{Insecure: []string{reg.host}}
	info, err := dfBuildFrom(t, dataDir, ctxDir, "reg", "FROM "+reg.host+"/test/img:v1\nCOPY ok ./ok\n", regs)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"bin/tool": "tool v2\n", "srv/ok": "ok\n", "srv/data/a": "a\n"} {
		if got := readFile(t, filepath.Join(info.Path, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(info.Path, "bin/old")); !os.IsNotExist(err) {
		t.Errorf("bin/old, deleted by a whiteout, is there: %v", err)
	}
	if uid, _, _ := lstatOwner(t, filepath.Join(info.Path, "srv/data/a")); uid != 1033 {
		t.Errorf("srv/data/a owner %d, want 1033 (33 shifted)", uid)
	}
	if info.WorkDir != "/srv" || !strings.Contains(strings.Join(info.Env, " "), "FROM_REGISTRY=1") {
		t.Errorf("image config not kept: %+v", info)
	}
	if reg.blobs.Load() < 3 {
		t.Fatalf("the first build fetched %d blobs, want config and two layers", reg.blobs.Load())
	}
	for _, from := range []string{reg.host + "/test/img:v1", reg.host + "/test/img@" + dg} {
		before := reg.blobs.Load()
		info2, err := dfBuildFrom(t, dataDir, ctxDir, "reg2", "FROM "+from+"\n", regs)
		if err != nil {
			t.Fatal(err)
		}
		if got := reg.blobs.Load() - before; got != 1 {
			t.Errorf("FROM %s again: %d blobs fetched, want the config alone", from, got)
		}
		if log, _ := BuildLog(dataDir, "reg2"); !bytes.Contains(log, []byte(": cached")) {
			t.Errorf("FROM %s: the image's base was not cached:\n%s", from, log)
		}
		if filepath.Dir(info2.Path) == "" || readFile(t, filepath.Join(info2.Path, "bin/tool")) != "tool v2\n" {
			t.Errorf("FROM %s: wrong tree", from)
		}
	}
}

// TestDockerfileRegistryNotAllowed: a FROM naming a registry the operator
// did not list fails with ErrRegistryNotAllowed before any request
// reaches it (Docker Hub's short names too); a registry listed for HTTPS
// only is not spoken to over plain HTTP, though go-containerregistry
// alone falls back to HTTP for a loopback address (the control).
func TestDockerfileRegistryNotAllowed(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	reg := newTestRegistry(t, "", "")
	reg.push(t, "test/img:v1", layerOf(t, imageBase...))
	from := "FROM " + reg.host + "/test/img:v1\n"
	for _, tc := range []struct {
		name string
		src  string
		regs Registries
	}{
		{"no registries", from, Registries{}},
		{"another listed", from, Registries{Allow: []string{"registry.example:5000"}, Insecure: []string{"127.0.0.2:5000"}}},
		{"docker hub", "FROM python:3.12\n", Registries{Insecure: []string{reg.host}}},
		{"by build arg", "ARG R=" + reg.host + "\nFROM $R/test/img:v1\n", Registries{}},
	} {
		if err := CheckFrom([]byte(tc.src), nil, tc.regs); !errors.Is(err, ErrRegistryNotAllowed) {
			t.Errorf("%s: CheckFrom: %v, want ErrRegistryNotAllowed", tc.name, err)
		}
		if _, err := dfBuildFrom(t, dataDir, ctxDir, "deny", tc.src, tc.regs); !errors.Is(err, ErrRegistryNotAllowed) {
			t.Errorf("%s: build: %v, want ErrRegistryNotAllowed", tc.name, err)
		}
	}
	if n := reg.requests.Load(); n != 0 {
		t.Fatalf("%d requests reached a registry not allowed", n)
	}
	// Listed for HTTPS only: no plain HTTP request is made.
	_, err := dfBuildFrom(t, dataDir, ctxDir, "deny", from, Registries{Allow: []string{reg.host}})
	if err == nil || !strings.Contains(err.Error(), "plain HTTP only to a registry listed as insecure") {
		t.Errorf("HTTPS-only registry: %v", err)
	}
	if n := reg.requests.Load(); n != 0 {
		t.Fatalf("%d plain HTTP requests reached a registry listed for HTTPS only", n)
	}
	// Control: go-containerregistry on its own speaks HTTP to it.
	ref, _ := name.ParseReference(reg.host + "/test/img:v1")
	if _, err := remote.Get(ref); err != nil || reg.requests.Load() == 0 {
		t.Fatalf("control: go-containerregistry did not reach the loopback registry over HTTP: %v", err)
	}
	if err := CheckFrom([]byte(from), nil, Registries{Insecure: []string{reg.host}}); err != nil {
		t.Errorf("control: CheckFrom of a listed registry: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(templatesDir(dataDir), layersDir, ".*")); len(left) > 0 {
		t.Errorf("left in the layer cache: %v", left)
	}
}

// TestDockerfileRegistryAuth: credentials come from the Docker config file
// the operator names; without them the registry refuses the pull.
func TestDockerfileRegistryAuth(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	reg := newTestRegistry(t, "puller", "s3cret")
	reg.push(t, "test/img:v1", layerOf(t, imageBase...))
	from := "FROM " + reg.host + "/test/img:v1\n"
	if _, err := dfBuildFrom(t, dataDir, ctxDir, "auth", from, Registries{Insecure: []string{reg.host}}); err == nil ||
		!strings.Contains(err.Error(), "UNAUTHORIZED") && !strings.Contains(err.Error(), "401") {
		t.Fatalf("anonymous pull: %v, want refused", err)
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte("puller:s3cret"))
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `{"auths":{"http://%s":{"auth":%q}}}`, reg.host, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := dfBuildFrom(t, dataDir, ctxDir, "auth", from, Registries{Insecure: []string{reg.host}, AuthFile: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(info.Path, "bin/tool")); got != "tool v1\n" {
		t.Errorf("bin/tool = %q", got)
	}
}

// TestDockerfileRegistryEscape: an image from a registry is unpacked as an
// OCI layout's is: a layer whose entry has ../ in its name, or goes
// through an absolute symbolic link an earlier entry made, is refused and
// nothing lands outside (the control in TestDockerfileImageEscape shows
// the planted link leads out where it is followed); a device node and a
// setuid bit do not reach the template.
func TestDockerfileRegistryEscape(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	reg := newTestRegistry(t, "", "")
	regs := Registries{Insecure: []string{reg.host}}
	outside := t.TempDir()
	for name, layer := range map[string][]layerEntry{
		"dotdot":       {{name: "../../../../../../" + outside + "/dotdot", body: "x"}},
		"abs symlink":  {{name: "l", typ: tar.TypeSymlink, link: outside}, {name: "l/via-link", body: "x"}},
		"root symlink": {{name: "r", typ: tar.TypeSymlink, link: "/"}, {name: "r" + outside + "/via-root", body: "x"}},
	} {
		repo := "esc/" + strings.ReplaceAll(name, " ", "-") + ":v1"
		reg.push(t, repo, layerOf(t, append(append([]layerEntry{}, imageBase...), layer...)...))
		_, err := dfBuildFrom(t, dataDir, ctxDir, "esc", "FROM "+reg.host+"/"+repo+"\n", regs)
		if err == nil {
			t.Errorf("%s: the build succeeded", name)
		}
		t.Logf("%s: %v", name, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("entries landed outside: %v", ents)
	}
	// Device nodes are left out and setuid bits stripped.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "dev/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8})
	tw.WriteHeader(&tar.Header{Name: "bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2})
	tw.Write([]byte("su"))
	tw.Close()
	reg.push(t, "esc/dev:v1", layerOf(t, imageBase...), buf.Bytes())
	info, err := dfBuildFrom(t, dataDir, ctxDir, "dev", "FROM "+reg.host+"/esc/dev:v1\n", regs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(info.Path, "dev/sda")); !os.IsNotExist(err) {
		t.Errorf("dev/sda: a device node reached the template: %v", err)
	}
	fi, err := os.Lstat(filepath.Join(info.Path, "bin/su"))
	if err != nil || fi.Mode()&os.ModeSetuid != 0 {
		t.Errorf("bin/su: %v, mode %v: the setuid bit was kept", err, fi)
	}
	if left, _ := filepath.Glob(filepath.Join(templatesDir(dataDir), layersDir, ".*")); len(left) > 0 {
		t.Errorf("left in the layer cache: %v", left)
	}
}

// TestDockerfileRegistryIndex: FROM a multi-platform image (an index)
// pulls the image of this machine's architecture, whichever comes first.
func TestDockerfileRegistryIndex(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	reg := newTestRegistry(t, "", "")
	image := func(tool string) ggcrv1.Image {
		img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layerOf(t, append(append([]layerEntry{}, imageBase[:5]...),
			layerEntry{name: "bin/", typ: tar.TypeDir}, layerEntry{name: "bin/tool", body: tool})...), types.OCIUncompressedLayer))
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	other := "arm64"
	if goruntime.GOARCH == "arm64" {
		other = "amd64"
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: image("other\n"), Descriptor: ggcrv1.Descriptor{Platform: &ggcrv1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: image("mine\n"), Descriptor: ggcrv1.Descriptor{Platform: &ggcrv1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}})
	ref, _ := name.ParseReference(reg.host+"/multi:1", name.Insecure)
	if err := remote.WriteIndex(ref, idx, remote.WithTransport(pushHeader{http.DefaultTransport})); err != nil {
		t.Fatal(err)
	}
	info, err := dfBuildFrom(t, dataDir, ctxDir, "multi", "FROM "+reg.host+"/multi:1\n", Registries{Insecure: []string{reg.host}})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(info.Path, "bin/tool")); got != "mine\n" {
		t.Errorf("bin/tool = %q, want this machine's image", got)
	}
}
