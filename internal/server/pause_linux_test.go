package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// runcEnv is a server over the real runc runtime that keeps checkpoints;
// the runtime closes after the server and its engine.
func runcEnv(t *testing.T) *env {
	t.Helper()
	return runcEnvWith(t, server.Config{})
}

// runcEnvWith is runcEnv with the server's Config; opts adjust the
// engine's.
func runcEnvWith(t *testing.T, cfg server.Config, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	return runcEnvOCI(t, func(*oci.Config) {}, cfg, opts...)
}

// runcEnvOCI is runcEnvWith whose runtime's Config ocfg adjusts.
func runcEnvOCI(t *testing.T, ocfg func(*oci.Config), cfg server.Config, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	state := testutil.ShortTempDir(t)
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	c := oci.Config{RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: testInstance("srv" + strings.ToLower(t.Name()[4:9])), Logger: testLog(t)}
	ocfg(&c)
	rt, err := oci.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	})
	return newEnv(t, cfg, append([]func(*sandbox.Config){func(c *sandbox.Config) {
		c.Runtime = rt
		c.Templates = sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })
		c.CheckpointDir = filepath.Join(state, "checkpoints")
	}}, opts...)...)
}

// TestPauseResumeAPI drives pause and resume through /v1: a paused
// sandbox is shown and listed as paused (and filtered by state), its
// metering stands still while paused, an execution resumes it with its
// variables, the events say paused and resumed, and a resume of a
// running sandbox or a pause of a paused one is no error.
func TestPauseResumeAPI(t *testing.T) {
	e := runcEnv(t)
	id := e.create(e.keyA, map[string]any{})
	exec := func(code string) string {
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute", e.keyA, map[string]any{"code": code})
		want(t, r, http.StatusOK, "")
		return r.json(t)["stdout"].(string)
	}
	exec("x = 6 * 7")
	state := func(r resp) string { return r.json(t)["state"].(string) }
	listed := func(q string) []string {
		r := e.do("GET", "/v1/sandboxes"+q, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		var out []string
		for _, s := range r.json(t)["sandboxes"].([]any) {
			out = append(out, s.(map[string]any)["id"].(string)+":"+s.(map[string]any)["state"].(string))
		}
		return out
	}
	wall := func() float64 {
		r := e.do("GET", "/v1/sandboxes/"+id+"/usage", e.keyA, nil)
		want(t, r, http.StatusOK, "")
		return r.json(t)["sandbox_seconds"].(float64)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/resume", e.keyA, nil), http.StatusOK, "")

	r := e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if st := state(r); st != "paused" {
		t.Fatalf("pause answered state %q", st)
	}
	paused := time.Now()
	before := wall()
	if st := state(e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)); st != "paused" {
		t.Fatalf("GET says %q", st)
	}
	if got := listed(""); len(got) != 1 || got[0] != id+":paused" {
		t.Errorf("list: %v", got)
	}
	if got := listed("?state=paused"); len(got) != 1 || got[0] != id+":paused" {
		t.Errorf("list ?state=paused: %v", got)
	}
	if got := listed("?state=running"); len(got) != 0 {
		t.Errorf("list ?state=running: %v", got)
	}
	want(t, e.do("GET", "/v1/sandboxes?state=sleeping", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	// Metering stands still while it is paused: half a second passes.
	for ; time.Since(paused) < 500*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if st := state(e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)); st != "paused" {
			t.Fatalf("GET says %q while paused", st)
		}
	}
	if after := wall(); after-before > 0.05 {
		t.Errorf("sandbox_seconds went from %.3f to %.3f while the sandbox was paused", before, after)
	}

	// An execution resumes it (E2B's connect semantics).
	if got := exec("print(x)"); got != "42\n" {
		t.Fatalf("after the resume x is %q", got)
	}
	if st := state(e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)); st != "running" {
		t.Fatalf("GET says %q after the execution", st)
	}
	// Metering runs again.
	resumed := wall()
	for deadline := time.Now().Add(10 * time.Second); wall() <= resumed; {
		if time.Now().After(deadline) {
			t.Fatal("sandbox_seconds does not grow after the resume")
		}
	}
	r = e.do("GET", "/v1/sandboxes/"+id+"/events", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if b := string(r.body); strings.Count(b, `"sandbox.paused"`) != 1 || strings.Count(b, `"sandbox.resumed"`) != 1 {
		t.Errorf("events: want one sandbox.paused and one sandbox.resumed: %s", b)
	}
	// memory "keep" freezes it: paused, and resumed the same ways.
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, map[string]any{"memory": "lost"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	if st := state(e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, map[string]any{"memory": "keep"})); st != "paused" {
		t.Fatalf("a freeze answered state %q", st)
	}
	if got := exec("print(x + 1)"); got != "43\n" {
		t.Fatalf("after the freeze x + 1 is %q", got)
	}

	// The Go SDK's calls; a paused sandbox is killed as a running one is.
	c := client.New(e.url, e.keyA)
	ctx := context.Background()
	if sb, err := c.PauseSandbox(ctx, id); err != nil || sb.State != "paused" {
		t.Fatalf("PauseSandbox = %+v, %v", sb, err)
	}
	if l, err := c.ListSandboxesIn(ctx, "paused"); err != nil || len(l) != 1 || l[0].ID != id {
		t.Fatalf("ListSandboxesIn(paused) = %+v, %v", l, err)
	}
	if sb, err := c.ResumeSandbox(ctx, id); err != nil || sb.State != "running" {
		t.Fatalf("ResumeSandbox = %+v, %v", sb, err)
	}
	if sb, err := c.FreezeSandbox(ctx, id); err != nil || sb.State != "paused" {
		t.Fatalf("FreezeSandbox = %+v, %v", sb, err)
	}
	if sb, err := c.ResumeSandbox(ctx, id); err != nil || sb.State != "running" {
		t.Fatalf("ResumeSandbox after FreezeSandbox = %+v, %v", sb, err)
	}
	if l, err := c.ListSandboxesIn(ctx, "running"); err != nil || len(l) != 1 || l[0].ID != id {
		t.Fatalf("ListSandboxesIn(running) = %+v, %v", l, err)
	}
	if _, err := client.New(e.url, e.keyB).PauseSandbox(ctx, id); !errors.Is(err, client.ErrSandboxNotFound) {
		t.Fatalf("another owner's PauseSandbox: %v", err)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil), http.StatusOK, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	if st := state(e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil)); st != "stopped" {
		t.Fatalf("GET says %q after the delete", st)
	}
}

// TestPauseNotSupportedAPI: the fake runtime cannot checkpoint: a pause
// is 501 ERR_NOT_SUPPORTED and the sandbox runs on.
func TestPauseNotSupportedAPI(t *testing.T) {
	e := newEnv(t, server.Config{})
	id := e.create(e.keyA, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/pause", e.keyA, nil), http.StatusNotImplemented, "ERR_NOT_SUPPORTED")
	if _, err := client.New(e.url, e.keyA).PauseSandbox(context.Background(), id); !errors.Is(err, client.ErrNotSupported) {
		t.Fatalf("PauseSandbox: %v, want ErrNotSupported", err)
	}
	if st := e.do("GET", "/v1/sandboxes/"+id, e.keyA, nil).json(t)["state"]; st != "running" {
		t.Fatalf("state %v after a refused pause", st)
	}
}

// TestE2BPauseConnect: E2B's pause pauses (204, then 409 as E2B answers
// a sandbox already paused), the sandbox is listed and described as
// paused (and filtered by state), connect resumes it with its variables,
// and a data-plane request (envd) to a paused sandbox resumes it too.
func TestE2BPauseConnect(t *testing.T) {
	e := runcEnv(t)
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "timeout": 120})
	exec := func(code string) string {
		r := e.do("POST", "/v1/sandboxes/"+sb.ID+"/execute", e.keyA, map[string]any{"code": code})
		want(t, r, http.StatusOK, "")
		return r.json(t)["stdout"].(string)
	}
	exec("y = 'kept'\nopen('/home/user/e2b.txt', 'w').write('on disk')")
	list := func(q string) []string {
		r := e.e2bDo("GET", "/v2/sandboxes"+q, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		var out []string
		var l []map[string]any
		if err := json.Unmarshal(r.body, &l); err != nil {
			t.Fatal(err)
		}
		for _, s := range l {
			out = append(out, s["sandboxID"].(string)+":"+s["state"].(string))
		}
		return out
	}
	state := func() string {
		r := e.e2bDo("GET", "/sandboxes/"+sb.ID, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		return r.json(t)["state"].(string)
	}

	if r := e.e2bDo("POST", "/sandboxes/"+sb.ID+"/pause", e.keyA, map[string]any{"memory": false}); r.status != http.StatusNotImplemented {
		t.Fatalf("a pause without memory: %d %s, want 501", r.status, r.body)
	}
	want(t, e.e2bDo("POST", "/sandboxes/"+sb.ID+"/pause", e.keyA, map[string]any{"memory": true}), http.StatusNoContent, "")
	if r := e.e2bDo("POST", "/sandboxes/"+sb.ID+"/pause", e.keyA, nil); r.status != http.StatusConflict {
		t.Fatalf("a second pause: %d %s, want 409", r.status, r.body)
	}
	if st := state(); st != "paused" {
		t.Fatalf("GET /sandboxes/{id} says %q", st)
	}
	if got := list("?state=paused"); len(got) != 1 || got[0] != sb.ID+":paused" {
		t.Errorf("state=paused lists %v", got)
	}
	if got := list("?state=running"); len(got) != 0 {
		t.Errorf("state=running lists %v", got)
	}
	if got := list(""); len(got) != 1 || got[0] != sb.ID+":paused" {
		t.Errorf("the default list is %v", got)
	}

	r := e.e2bDo("POST", "/v2/sandboxes/"+sb.ID+"/connect", e.keyA, map[string]any{"timeout": 60})
	if r.status != http.StatusOK && r.status != http.StatusCreated {
		t.Fatalf("connect: %d %s", r.status, r.body)
	}
	if st := state(); st != "running" {
		t.Fatalf("after connect the state is %q", st)
	}
	if got := exec("print(y)"); got != "kept\n" {
		t.Fatalf("after connect y is %q", got)
	}

	// envd's file read resumes a paused sandbox.
	want(t, e.e2bDo("POST", "/sandboxes/"+sb.ID+"/pause", e.keyA, nil), http.StatusNoContent, "")
	if r := e.envd(sb, "GET", "/files?path=/home/user/e2b.txt", nil); r.status != http.StatusOK || string(r.body) != "on disk" {
		t.Fatalf("envd read of a paused sandbox: %d %s", r.status, r.body)
	}
	if st := state(); st != "running" {
		t.Fatalf("after the envd read the state is %q", st)
	}
	want(t, e.e2bDo("DELETE", "/sandboxes/"+sb.ID, e.keyA, nil), http.StatusNoContent, "")
}

// TestPausedSandboxAfterServerRestart: a sandbox paused through /v1 is
// recorded paused, survives the server's shutdown and start over the same
// database and data dir, is shown and listed paused by the new server,
// and resumes with its variable, its file and its background process,
// recorded running again. A second paused sandbox whose checkpoint broke
// meanwhile is shown stopped, its stop_reason saying why; nothing of
// either is left at the end.
func TestPausedSandboxAfterServerRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs, st, key := restartStore(t)
	state := traversableDir(t)
	rcfg := oci.Config{RuntimePath: testutil.Runc(t), StateDir: state, AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: testInstance("srvrestart")}
	// Beside the runtime's state dir, as DATA_DIR/checkpoints is beside
	// DATA_DIR/run (the runtime sweeps what is in its own).
	data := traversableDir(t)
	checkpoints := filepath.Join(data, "checkpoints")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// start runs a server as `sheepfold serve` does, and returns its stop.
	start := func() (*env, func()) {
		return serveOn(t, st, key, rcfg, sandbox.Config{CheckpointDir: checkpoints, KeepPaused: true,
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}, log, true)
	}
	e, stop := start()
	exec := func(e *env, id, code string) string {
		t.Helper()
		r := e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": code})
		want(t, r, http.StatusOK, "")
		if errv := r.json(t)["error"]; errv != nil {
			t.Fatalf("execution failed: %v", errv)
		}
		return r.json(t)["stdout"].(string)
	}
	id := e.create(key, map[string]any{})
	broken := e.create(key, map[string]any{})
	pid := exec(e, id, `
import subprocess
x = 6 * 7
open("/home/user/kept.txt", "w").write("kept")
loop = subprocess.Popen(["sh", "-c", "while true; do echo tick >> /tmp/ticks; sleep 0.05; done"], start_new_session=True)
print(loop.pid, end="")`)
	for _, sb := range []string{id, broken} {
		r := e.do("POST", "/v1/sandboxes/"+sb+"/pause", key, nil)
		want(t, r, http.StatusOK, "")
		if rec, err := st.GetSandbox(ctx, sb); err != nil || rec.State != store.SandboxPaused {
			t.Fatalf("record of a paused sandbox: %+v, %v", rec, err)
		}
	}
	stop()
	if err := os.Remove(filepath.Join(checkpoints, broken, "inventory.img")); err != nil {
		t.Fatal(err)
	}

	e, stop = start()
	defer func() {
		stop()
		if _, err := os.Stat(filepath.Join(state, rcfg.Instance)); err == nil {
			t.Errorf("the runtime's instance is left: %s", filepath.Join(state, rcfg.Instance))
		}
		if left, _ := os.ReadDir(checkpoints); len(left) != 0 {
			t.Errorf("checkpoints left: %v", left)
		}
	}()
	r := e.do("GET", "/v1/sandboxes", key, nil)
	want(t, r, http.StatusOK, "")
	var listed []string
	for _, s := range r.json(t)["sandboxes"].([]any) {
		listed = append(listed, s.(map[string]any)["id"].(string)+":"+s.(map[string]any)["state"].(string))
	}
	if len(listed) != 1 || listed[0] != id+":paused" {
		t.Fatalf("listed after the restart: %v, want %s paused alone", listed, id)
	}
	r = e.do("GET", "/v1/sandboxes/"+broken, key, nil)
	want(t, r, http.StatusOK, "")
	if j := r.json(t); j["state"] != "stopped" || j["stop_reason"] != "its checkpoint did not survive the server's restart (its checkpoint is missing or incomplete)" {
		t.Errorf("the sandbox whose checkpoint broke: %v", j)
	}
	r = e.do("POST", "/v1/sandboxes/"+id+"/resume", key, nil)
	want(t, r, http.StatusOK, "")
	if s := r.json(t)["state"]; s != "running" {
		t.Fatalf("resume answered state %v", s)
	}
	if rec, _ := st.GetSandbox(ctx, id); rec.State != store.SandboxRunning {
		t.Errorf("record after the resume: %+v", rec)
	}
	got := exec(e, id, `
import os, time
os.kill(`+pid+`, 0)
n = len(open("/tmp/ticks").readlines())
for _ in range(200):
    if len(open("/tmp/ticks").readlines()) > n:
        break
    time.sleep(0.05)
print(x, open("/home/user/kept.txt").read(), len(open("/tmp/ticks").readlines()) > n)`)
	if got != "42 kept True\n" {
		t.Fatalf("after the restart and resume: %q, want the variable, the file and the loop writing on", got)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, key, nil), http.StatusNoContent, "")
}

// TestPausedPerAccountBound: with --max-paused-per-account 1 an account's
// second pause is refused (429 ERR_SESSION_QUOTA_EXCEEDED) and that
// sandbox runs on with its variable; once the first is resumed, the
// second pauses; another account is not held back by the first's.
func TestPausedPerAccountBound(t *testing.T) {
	e := runcEnvWith(t, server.Config{MaxPausedPerAccount: 1})
	first := e.create(e.keyA, map[string]any{})
	second := e.create(e.keyA, map[string]any{})
	other := e.create(e.keyB, map[string]any{})
	r := e.do("POST", "/v1/sandboxes/"+second+"/execute", e.keyA, map[string]any{"code": "y = 7"})
	want(t, r, http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+first+"/pause", e.keyA, nil), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+second+"/pause", e.keyA, nil), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	if st := e.do("GET", "/v1/sandboxes/"+second, e.keyA, nil).json(t)["state"]; st != "running" {
		t.Fatalf("the refused sandbox is %v, want running", st)
	}
	r = e.do("POST", "/v1/sandboxes/"+second+"/execute", e.keyA, map[string]any{"code": "print(y)"})
	want(t, r, http.StatusOK, "")
	if out := r.json(t)["stdout"]; out != "7\n" {
		t.Fatalf("after the refused pause y is %q", out)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+other+"/pause", e.keyB, nil), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+first+"/resume", e.keyA, nil), http.StatusOK, "")
	want(t, e.do("POST", "/v1/sandboxes/"+second+"/pause", e.keyA, nil), http.StatusOK, "")
	for _, id := range []string{first, second} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+other, e.keyB, nil), http.StatusNoContent, "")
}
