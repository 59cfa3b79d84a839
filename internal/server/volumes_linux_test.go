package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestVolumeSurvivesRestart, over runc: what a sandbox writes to a
// volume is read by a second sandbox after the first was killed and the
// whole server (store, engine, runtime) stopped and started again; a
// read-only mount refuses writes inside; an upload past the volume's
// size is ERR_DISK_FULL while the sandbox's own disk takes it; another
// account still cannot mount it. The file API (no sandbox) writes files
// the sandboxes' user owns, and follows none of a tenant's links or FIFOs
// out of the volume.
func TestVolumeSurvivesRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs := testutil.TemplateRootFS(t, "python")
	dir := testutil.ShortTempDir(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// Last: whatever volume a failed test left mounted.
	t.Cleanup(func() {
		mnts, _ := filepath.Glob(filepath.Join(dir, "volumes", "*", "mnt"))
		for _, m := range mnts {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	dbPath := filepath.Join(dir, "sheepfold.db")
	var keyA, keyB string
	boot := func() (*env, func()) {
		st, err := sqlite.Open(ctx, dbPath)
		if err != nil {
			t.Fatal(err)
		}
		rt, err := oci.New(oci.Config{RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
			CgroupParent: "sheepfold-test", Instance: testInstance("srvvolume"), VolumesDir: filepath.Join(dir, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		bus := events.NewBus(server.EventStore(st), events.BusConfig{Logger: log})
		m, err := sandbox.New(ctx, sandbox.Config{Runtime: rt, Logger: log, Events: bus,
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })})
		if err != nil {
			t.Fatal(err)
		}
		srv := server.New(server.Config{Version: "test", Events: bus}, st, m, log)
		hs := httptest.NewServer(srv)
		if keyA == "" {
			for _, p := range []*string{&keyA, &keyB} {
				if _, *p, err = auth.Create(ctx, st, auth.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		stopped := false
		stop := func() {
			if stopped {
				return
			}
			stopped = true
			hs.Close()
			srv.Shutdown(ctx)
			if err := m.Close(ctx); err != nil {
				t.Error(err)
			}
			if err := srv.Close(ctx); err != nil {
				t.Error(err)
			}
			srv.RecordStopped(ctx)
			bus.Close()
			st.Close()
			if err := rt.Close(); err != nil {
				t.Error(err)
			}
		}
		t.Cleanup(stop)
		return &env{t: t, srv: srv, url: hs.URL, engine: m, keyA: keyA, keyB: keyB}, stop
	}
	run := func(e *env, id, script string) (string, float64) {
		t.Helper()
		r := e.do("POST", "/v1/sandboxes/"+id+"/commands", e.keyA, map[string]any{"cmd": "sh", "args": []string{"-c", script}})
		want(t, r, http.StatusOK, "")
		c := r.json(t)
		return c["stdout"].(string) + c["stderr"].(string), c["exit_code"].(float64)
	}

	e, stop := boot()
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 16}), http.StatusCreated, "")
	id := e.create(e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/home/user/data"}}})
	if out, code := run(e, id, "echo kept > /home/user/data/f && ls -ln /home/user/data/f"); code != 0 || !strings.Contains(out, " 1000 1000 ") {
		t.Fatalf("write: %v %q", code, out)
	}
	// Past the volume's size: the kernel's ENOSPC, ERR_DISK_FULL (control:
	// the sandbox's own disk takes the same upload).
	big := strings.Repeat("x", 20<<20)
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/big", e.keyA, big), http.StatusCreated, "")
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/data/big", e.keyA, big), http.StatusInsufficientStorage, "ERR_DISK_FULL")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	stop()

	e, _ = boot()
	want(t, e.do("POST", "/v1/sandboxes", e.keyB, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}}),
		http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	ro := e.create(e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/mnt/data", "read_only": true}}})
	if out, code := run(e, ro, "cat /mnt/data/f"); code != 0 || out != "kept\n" {
		t.Fatalf("after the restart: %v %q", code, out)
	}
	if out, code := run(e, ro, "echo x > /mnt/data/g"); code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Fatalf("a write in the read-only mount: %v %q", code, out)
	}
	want(t, e.do("DELETE", "/v1/volumes/data", e.keyA, nil), http.StatusConflict, "ERR_VOLUME_IN_USE")
	// The file API beside a reader: what it writes is the sandboxes'
	// user's.
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/api/f.txt", e.keyA, "from the api"), http.StatusCreated, "")
	if out, code := run(e, ro, "cat /mnt/data/api/f.txt && stat -c %U:%G /mnt/data/api /mnt/data/api/f.txt"); code != 0 || out != "from the apiuser:user\nuser:user\n" {
		t.Fatalf("a file of the API in the sandbox: %v %q", code, out)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+ro, e.keyA, nil), http.StatusNoContent, "")

	// A tenant's links to the host, then read through the file API.
	secret := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := e.create(e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}})
	if out, code := run(e, w, "ln -s "+secret+" /data/esc && ln -s / /data/root && mkfifo /data/fifo"); code != 0 {
		t.Fatal(out)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+w, e.keyA, nil), http.StatusNoContent, "")
	mnts, _ := filepath.Glob(filepath.Join(dir, "volumes", "*", "mnt"))
	if len(mnts) != 1 {
		t.Fatalf("volumes: %v", mnts)
	}
	if b, err := os.ReadFile(filepath.Join(mnts[0], "esc")); err != nil || string(b) != "host only" {
		t.Fatalf("control: the link followed on the host reads %q, %v", b, err)
	}
	for _, p := range []string{"/esc", "/root" + secret, "/../../../.." + secret} {
		want(t, e.do("GET", "/v1/volumes/data/files?path="+p, e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	}
	want(t, e.do("GET", "/v1/volumes/data/files?path=/fifo", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/esc", e.keyA, "overwritten"), http.StatusNotFound, "ERR_NOT_FOUND")
	if b, _ := os.ReadFile(secret); string(b) != "host only" {
		t.Fatalf("the host file was written: %q", b)
	}
	// Full: the kernel's ENOSPC through the file API too.
	want(t, e.do("PUT", "/v1/volumes/data/files?path=/big", e.keyA, big), http.StatusInsufficientStorage, "ERR_DISK_FULL")
	want(t, e.do("DELETE", "/v1/volumes/data", e.keyA, nil), http.StatusNoContent, "")
	if _, err := os.ReadDir(filepath.Join(dir, "volumes")); err != nil {
		t.Fatal(err)
	}
	if l, _ := os.ReadDir(filepath.Join(dir, "volumes")); len(l) != 0 {
		t.Fatalf("volumes left on disk: %v", l)
	}
}
