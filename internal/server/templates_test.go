package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// noRunner is a StepRunner for builds without RUN.
type noRunner struct{}

func (noRunner) RunStep(context.Context, template.RunStep, io.Writer) error {
	panic("no RUN expected")
}

type tarEntry struct {
	name, body, link string
	typ              byte
}

func tarOf(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: e.typ, Linkname: e.link}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// newBuildEnv is a server whose data dir holds a built template called
// base (a passwd file, shifted by 1000), for builds whose steps run
// nothing (noRunner); and its data dir.
func newBuildEnv(t *testing.T, base string) (*env, string) {
	t.Helper()
	data := t.TempDir()
	dir := filepath.Join(data, "templates", base)
	testutil.WriteTree(t, filepath.Join(dir, "rootfs"), map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\n"})
	info, _ := json.Marshal(template.Info{Name: base, Suite: "bookworm", Version: template.FormatVersion, UIDShift: 1000})
	if err := os.WriteFile(filepath.Join(dir, "template.json"), info, 0o644); err != nil {
		t.Fatal(err)
	}
	return newEnv(t, server.Config{DataDir: data, TemplateRunner: noRunner{}, TemplateUIDShift: 1000}), data
}

// TestTemplateBuildAPI: admin keys build a template from a Dockerfile in
// a context tar, poll it to its end and read its log; GET /v1/templates
// lists it; other keys may list but not build; a bad Dockerfile is a 400
// naming its line; a tar entry cannot land outside the context.
func TestTemplateBuildAPI(t *testing.T) {
	testutil.RequireRoot(t)
	e, data := newBuildEnv(t, "base")
	admin := e.adminKey()
	ctxTar := tarOf(t,
		tarEntry{name: "Dockerfile", body: "FROM base\nENV A=1\nCOPY app.py /opt/app.py\nLABEL sheepfold.start=\"python3 /opt/app.py\"\n"},
		tarEntry{name: "app.py", body: "print('hi')\n"})

	want(t, e.do("POST", "/v1/templates?name=app", e.keyA, ctxTar), http.StatusForbidden, "ERR_FORBIDDEN")
	wantMsg(t, e.do("POST", "/v1/templates?name=Bad%20Name", admin, ctxTar), http.StatusBadRequest, "ERR_BAD_REQUEST", "name")
	wantMsg(t, e.do("POST", "/v1/templates?name=app", admin, tarOf(t, tarEntry{name: "Dockerfile", body: "FROM base\nBOGUS x\n"})),
		http.StatusBadRequest, "ERR_BAD_REQUEST", "line 2: unknown instruction: BOGUS")
	wantMsg(t, e.do("POST", "/v1/templates?name=app", admin, tarOf(t, tarEntry{name: "nothing", body: ""})),
		http.StatusBadRequest, "ERR_BAD_REQUEST", `no Dockerfile "Dockerfile"`)
	// Context escape through the tar: .. names, and a link then a file
	// under it.
	outside := t.TempDir()
	for _, bad := range [][]tarEntry{
		{{name: "../../escaped", body: "x"}},
		{{name: "/abs", body: "x"}},
		{{name: "l", typ: tar.TypeSymlink, link: outside}, {name: "l/escaped", body: "x"}},
	} {
		wantMsg(t, e.do("POST", "/v1/templates?name=app", admin, tarOf(t, bad...)), http.StatusBadRequest, "ERR_BAD_REQUEST", "build context")
	}
	if ents, _ := os.ReadDir(outside); len(ents) > 0 {
		t.Fatalf("a tar entry landed outside the context: %v", ents)
	}
	// Control: unpacked naively (a path join), the link's entry does land
	// outside.
	scratch := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(scratch, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(scratch, "l", "escaped"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "escaped")); err != nil {
		t.Fatalf("control: the naive write did not land outside: %v", err)
	}

	r := e.do("POST", "/v1/templates?name=app", admin, ctxTar)
	want(t, r, http.StatusAccepted, "")
	var b struct {
		ID, Status, Error string
		Template          *struct{ Hash, Start string }
	}
	json.Unmarshal(r.body, &b)
	if b.Status != "running" || !strings.HasPrefix(b.ID, "tb_") {
		t.Fatalf("build: %s", r.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b.Status == "running" {
		if time.Now().After(deadline) {
			t.Fatal("the build did not end")
		}
		time.Sleep(20 * time.Millisecond)
		r = e.do("GET", "/v1/templates/builds/"+b.ID, admin, nil)
		want(t, r, http.StatusOK, "")
		json.Unmarshal(r.body, &b)
	}
	if b.Status != "done" || b.Template == nil || !strings.HasPrefix(b.Template.Hash, "sha256:") || b.Template.Start != "python3 /opt/app.py" {
		t.Fatalf("ended build: %s", r.body)
	}
	want(t, e.do("GET", "/v1/templates/builds/"+b.ID, e.keyA, nil), http.StatusForbidden, "ERR_FORBIDDEN")
	want(t, e.do("GET", "/v1/templates/builds/tb_nope", admin, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	r = e.do("GET", "/v1/templates/builds/"+b.ID+"/log", admin, nil)
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "COPY app.py /opt/app.py") {
		t.Fatalf("log: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/v1/templates", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var list struct {
		Templates []struct{ Name, Hash, Runtime, From string }
	}
	json.Unmarshal(r.body, &list)
	if len(list.Templates) != 2 || list.Templates[0].Name != "app" || list.Templates[0].Hash != b.Template.Hash ||
		list.Templates[0].From != "base" || list.Templates[0].Runtime != "runc" {
		t.Fatalf("list: %s", r.body)
	}
	if got, err := os.ReadFile(filepath.Join(data, "templates", "app", "rootfs", "opt", "app.py")); err != nil || string(got) != "print('hi')\n" {
		t.Fatalf("built file: %q, %v", got, err)
	}
}

// TestTemplateBuildNotSupported: a server without a step runner builds
// nothing.
func TestTemplateBuildNotSupported(t *testing.T) {
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/templates?name=x", e.adminKey(), tarOf(t)), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	r := e.do("GET", "/v1/templates", e.keyA, nil)
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"templates":[]`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
}

// TestTemplateBuildRegistryNotAllowed: a build FROM an image in a registry
// the server was not started with is refused at once, 403
// ERR_REGISTRY_NOT_ALLOWED (Docker Hub's short names too); a listed one
// passes the check (control: the same Dockerfile is accepted, 202).
func TestTemplateBuildRegistryNotAllowed(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	e := newEnv(t, server.Config{DataDir: data, TemplateRunner: noRunner{}, TemplateUIDShift: 1000,
		TemplateRegistries: template.Registries{Insecure: []string{"127.0.0.1:1"}}})
	admin := e.adminKey()
	for _, from := range []string{"registry.example:5000/app:1", "python:3.12", "127.0.0.2:1/app@sha256:" + strings.Repeat("a", 64)} {
		wantMsg(t, e.do("POST", "/v1/templates?name=app", admin, tarOf(t, tarEntry{name: "Dockerfile", body: "FROM " + from + "\n"})),
			http.StatusForbidden, "ERR_REGISTRY_NOT_ALLOWED", "is not one the operator allows")
	}
	r := e.do("POST", "/v1/templates?name=app", admin, tarOf(t, tarEntry{name: "Dockerfile", body: "FROM 127.0.0.1:1/app:1\n"}))
	want(t, r, http.StatusAccepted, "")
	var b struct{ ID, Status, Error string }
	json.Unmarshal(r.body, &b)
	// The build (nothing listens on 127.0.0.1:1) fails; wait for its end
	// so that nothing runs on after the test.
	deadline := time.Now().Add(30 * time.Second)
	for b.Status == "running" {
		if time.Now().After(deadline) {
			t.Fatal("the build did not end")
		}
		time.Sleep(20 * time.Millisecond)
		r = e.do("GET", "/v1/templates/builds/"+b.ID, admin, nil)
		json.Unmarshal(r.body, &b)
	}
	if b.Status != "failed" || !strings.Contains(b.Error, "127.0.0.1:1") {
		t.Fatalf("ended build: %s", r.body)
	}
}

// TestE2BTemplateBuildAPI drives E2B's template build endpoints as the
// SDK does (request, upload link, PUT of the files' tar, start, status
// polled to ready) for a build without RUN, and tries them as others
// would: a key that is not an admin's may not build, an upload link with
// another token stores nothing, another admin key does not see the
// build, and a tar entry with .. is refused with nothing written outside
// (control: the right token's upload is taken and the build is ready).
func TestE2BTemplateBuildAPI(t *testing.T) {
	testutil.RequireRoot(t)
	e, data := newBuildEnv(t, "python")
	ctx := context.Background()
	_, admin, err := auth.Create(ctx, e.store, auth.CreateOptions{Name: "a", Admin: true, E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	_, admin2, _ := auth.Create(ctx, e.store, auth.CreateOptions{Name: "b", Admin: true, E2B: true})
	_, user, _ := auth.Create(ctx, e.store, auth.CreateOptions{Name: "u", Owner: "u", E2B: true})
	hash := strings.Repeat("ab", 32)
	e2b := func(method, path, key string, body any) resp {
		return e.do(method, path, "", body, "X-API-Key", key)
	}
	if r := e2b("POST", "/v3/templates", user, map[string]any{"name": "sdk"}); r.status != http.StatusForbidden {
		t.Fatalf("a user key's build request: %d %s", r.status, r.body)
	}
	r := e2b("POST", "/v3/templates", admin, map[string]any{"name": "sdk:v1", "cpuCount": 2, "memoryMB": 1024})
	var req struct{ TemplateID, BuildID string }
	if json.Unmarshal(r.body, &req); r.status != http.StatusAccepted || req.TemplateID != "sdk" || req.BuildID == "" {
		t.Fatalf("build request: %d %s", r.status, r.body)
	}
	r = e2b("GET", "/templates/sdk/files/"+hash, admin, nil)
	var link struct {
		Present bool
		URL     string
	}
	if json.Unmarshal(r.body, &link); r.status != http.StatusCreated || link.Present || !strings.Contains(link.URL, "token=") {
		t.Fatalf("upload link: %d %s", r.status, r.body)
	}
	path := strings.TrimPrefix(link.URL, e.url)
	files := tarOf(t, tarEntry{name: "app/hello.txt", body: "hello\n"})
	// Another token: refused, nothing stored (the start finds no upload).
	forged := regexp.MustCompile(`token=[^&]+`).ReplaceAllString(path, "token="+strings.Repeat("x", 52))
	if r := e.do("PUT", forged, "", files); r.status != http.StatusUnauthorized {
		t.Fatalf("forged upload link: %d %s", r.status, r.body)
	}
	start := map[string]any{"fromTemplate": "base", "force": false, "steps": []map[string]any{
		{"type": "ENV", "args": []string{"A", "1"}, "force": false},
		{"type": "COPY", "args": []string{"app", "/opt/app", "", ""}, "force": false, "filesHash": hash},
	}}
	if r := e2b("POST", "/v2/templates/sdk/builds/"+req.BuildID, admin, start); r.status != http.StatusBadRequest ||
		!strings.Contains(string(r.body), "not uploaded") {
		t.Fatalf("start without the upload: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", path, "", files); r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	if r := e2b("GET", "/templates/sdk/builds/"+req.BuildID+"/status", admin2, nil); r.status != http.StatusNotFound {
		t.Fatalf("another key's view of the build: %d %s", r.status, r.body)
	}
	if r := e2b("POST", "/v2/templates/sdk/builds/"+req.BuildID, admin, start); r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	var st struct {
		Status     string
		LogEntries []struct{ Message string }
		Reason     *struct{ Message string }
	}
	deadline := time.Now().Add(30 * time.Second)
	for st.Status == "" || st.Status == "building" || st.Status == "waiting" {
		if time.Now().After(deadline) {
			t.Fatal("the build did not end")
		}
		r = e2b("GET", "/templates/sdk/builds/"+req.BuildID+"/status?logsOffset=0", admin, nil)
		if err := json.Unmarshal(r.body, &st); err != nil || r.status != http.StatusOK {
			t.Fatalf("status: %d %s", r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Status != "ready" || len(st.LogEntries) == 0 {
		t.Fatalf("ended build: %s", r.body)
	}
	if got, err := os.ReadFile(filepath.Join(data, "templates", "sdk", "rootfs", "opt", "app", "hello.txt")); err != nil || string(got) != "hello\n" {
		t.Fatalf("built file: %q, %v", got, err)
	}

	// A tar entry with ..: refused when the build starts.
	r = e2b("POST", "/v3/templates", admin, map[string]any{"name": "sdk2"})
	json.Unmarshal(r.body, &req)
	r = e2b("GET", "/templates/sdk2/files/"+hash, admin, nil)
	json.Unmarshal(r.body, &link)
	if r := e.do("PUT", strings.TrimPrefix(link.URL, e.url), "", tarOf(t, tarEntry{name: "../../../escaped-e2b", body: "x"})); r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	if r := e2b("POST", "/v2/templates/sdk2/builds/"+req.BuildID, admin, start); r.status != http.StatusBadRequest ||
		!strings.Contains(string(r.body), "outside the build context") {
		t.Fatalf("start with a .. entry: %d %s", r.status, r.body)
	}
	if left, _ := filepath.Glob(filepath.Join(os.TempDir(), "escaped-e2b")); len(left) > 0 {
		t.Fatalf("a tar entry landed outside: %v", left)
	}
}
