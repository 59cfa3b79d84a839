package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// TestE2BTemplateBuild runs E2B's Template builder (the vendored Python
// SDK, test/e2b/python/template_build.py) against a server of its own
// (its data dir holds a link to the python template, so that nothing is
// built in the shared templates dir): a template built from `base` with
// set_envs, copy (uploaded through the build's link), run_cmd as root
// and as user, set_workdir and set_start_cmd; a sandbox of it sees the
// files the build made. A build FROM an image of Docker Hub fails with
// ERR_REGISTRY_NOT_ALLOWED's message; a key that is not an admin's may
// not build (control: the admin key's build succeeds). from_image of an
// image in a registry the server allows (one on loopback) builds too.
// Then template_tags.py: a build of NAME:v1 and one of NAME, exists and
// alias_exists, the list, get_tags, assign_tags and remove_tags, and
// sandboxes created from NAME:TAG each getting the build its tag names;
// a tag moved while a sandbox runs on its old copy: the sandbox goes on
// with the old files, a new one gets the new, the old copy leaves the
// disk with the sandbox's kill; a bad tag is refused (ERR_BAD_REQUEST). A
// template built with set_workdir and set_user: its sandboxes' commands
// run as that user in that directory unless they name their own; base's
// as "user" in /home/user.
func TestE2BTemplateBuild(t *testing.T) {
	testutil.RequireRoot(t)
	runc := testutil.Runc(t)
	python := filepath.Dir(testutil.TemplateRootFS(t, "python"))
	dir, err := os.MkdirTemp("/var/tmp", "sf-e2btpl-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // the build steps' root traverses it
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := build(bin); err != nil {
		t.Fatal(err)
	}
	for old, new := range map[string]string{runc: filepath.Join(bin, "runc"), python: filepath.Join(dir, "templates", "python")} {
		if err := os.Symlink(old, new); err != nil {
			t.Fatal(err)
		}
	}
	sf := filepath.Join(bin, "sheepfold")
	mint := func(args ...string) string {
		out, err := exec.Command(sf, append([]string{"--data-dir", dir, "keys", "create", "--e2b"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("keys create: %v\n%s", err, out)
		}
		return regexp.MustCompile(`e2b_[0-9a-f]{40}`).FindString(string(out))
	}
	adminKey := mint("--name", "tpl-admin", "--admin")
	userKey := mint("--name", "tpl-user", "--owner", "tpl-user")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url := "http://" + addr
	// A registry on loopback holding a tiny image, which the server is
	// told it may pull from over plain HTTP.
	reg := httptest.NewServer(registry.New(registry.Logger(stdlog.New(io.Discard, "", 0))))
	defer reg.Close()
	regHost := strings.TrimPrefix(reg.URL, "http://")
	pushTinyImage(t, regHost+"/tiny:1")
	cmd := exec.Command(sf, "--data-dir", dir, "serve", "--listen", addr, "--pool", "0", "--insecure-registry", regHost)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err := http.Get(url + "/v1/version"); err == nil {
			r.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s", log.String())
		}
	}
	sdk := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", "../e2b/python/vendor/e2b-python-2.34.0.tar.gz", "-C", sdk).CombinedOutput(); err != nil {
		t.Fatalf("unpack the vendored SDK: %v\n%s", err, out)
	}
	run := func(key, name string, script ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		py := "template_build.py"
		if len(script) > 0 {
			py = script[0]
		}
		c := exec.CommandContext(ctx, "/usr/bin/python3", py, name)
		c.Dir = "../e2b/python"
		c.Env = append(nodejs.Environ("E2B_", "PYTHON"), "PYTHONPATH="+filepath.Join(sdk, "e2b-python", "site"),
			"E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key, "SHEEPFOLD_TEST_IMAGE="+regHost+"/tiny:1", "SHEEPFOLD_TEST_DATA="+dir)
		c.WaitDelay = 10 * time.Second
		out, err := c.CombinedOutput()
		return string(out), err
	}
	out, err := run(adminKey, "sdkbuilt")
	if err != nil {
		t.Fatalf("template_build.py: %v\n%s\nserver:\n%s", err, out, log.String())
	}
	for _, want := range []string{
		"RESULT built sdkbuilt ",
		"RESULT logs ",
		`RESULT made 'hi there from run_cmd\nroot\n'`,
		`RESULT hello 'hello from the context\n'`,
		`RESULT csv 'x,y\n1,2\n'`,
		`RESULT asuser 'user\n'`,
		"RESULT hub refused BuildException",
		"registry index.docker.io is not one the operator allows",
		"RESULT image built sdkbuilt-img",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output:\n%s", want, out)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "templates", "sdkbuilt-img", "rootfs", "srv", "hello.txt")); err != nil || string(got) != "hello from the context\n" {
		t.Errorf("the template from the registry's image: %q, %v", got, err)
	}
	info, err := os.ReadFile(filepath.Join(dir, "templates", "sdkbuilt", "template.json"))
	if err != nil || !bytes.Contains(info, []byte(`"start": "touch /tmp/started"`)) {
		t.Errorf("template.json: %s, %v", info, err)
	}
	// Tags, the list and aliases (test/e2b/python/template_tags.py).
	out, err = run(adminKey, "sdktags", "template_tags.py")
	if err != nil {
		t.Fatalf("template_tags.py: %v\n%s\nserver:\n%s", err, out, log.String())
	}
	for _, want := range []string{
		"RESULT exists True True False False",
		"RESULT listed 200 True ready False",
		"RESULT tags ['default', 'v1'] True",
		"RESULT versions two one two",
		"RESULT assigned ['prod', 'stable'] True",
		"RESULT stable one",
		"RESULT moved two True",
		"RESULT removed ['default', 'stable', 'v1'] False",
		"RESULT untagged create refused",
		"RESULT remove unknown refused TemplateException",
		// A tag moved under a running sandbox: the old copy stays for it,
		// whole, and goes with it.
		"RESULT solo moved True True",
		"RESULT old sandbox two 42 two /usr/bin/python3",
		"RESULT new sandbox one",
		"RESULT old copy after the kill False",
		"RESULT bad tag refused",
		// set_user / set_workdir: the sandboxes' defaults.
		"RESULT owned default 65534 /srv/x here",
		"RESULT owned explicit 0 /tmp",
		"RESULT owned python 65534 /srv/x",
		"RESULT base default 1000 /home/user",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output:\n%s", want, out)
		}
	}
	// A key that is not an admin's may not build.
	out, err = run(userKey, "sdkuser")
	if err == nil || !strings.Contains(out, "admin key") {
		t.Errorf("a user key built: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "templates", "sdkuser")); !os.IsNotExist(err) {
		t.Errorf("the user key's template exists: %v", err)
	}
}

// pushTinyImage pushes an image of a few files (no shell) as ref.
func pushTinyImage(t *testing.T, ref string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range [][2]string{{"etc/passwd", "root:x:0:0::/root:/bin/sh\n"}, {"etc/group", "root:x:0:\n"},
		{"etc/shadow", "root:*:1::::::\n"}, {"etc/gshadow", "root:*::\n"}, {"usr/bin/tool", "tool\n"}} {
		tw.WriteHeader(&tar.Header{Name: e[0], Mode: 0o644, Size: int64(len(e[1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(e[1]))
	}
	tw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}
