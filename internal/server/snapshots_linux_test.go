package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// execIn runs code in sandbox id for key and returns its stdout.
func (e *env) execIn(key, id, code string) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes/"+id+"/execute", key, map[string]any{"code": code})
	want(e.t, r, http.StatusOK, "")
	if errv := r.json(e.t)["error"]; errv != nil {
		e.t.Fatalf("execution of %q failed: %v", code, errv)
	}
	return r.json(e.t)["stdout"].(string)
}

// TestSnapshotAPI takes a snapshot of a running sandbox through /v1 and
// starts a new sandbox from it: the new one has the variable and the
// file of the moment of the snapshot, a new id, and the same template
// and resources; the original runs on with what it did since. Listing,
// getting and deleting snapshots; the account's bound; names taken; a
// snapshot in use is not deleted; bad input gets its codes.
func TestSnapshotAPI(t *testing.T) {
	e := runcEnvWith(t, server.Config{MaxSnapshotsPerAccount: 2})
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 64}})
	e.execIn(e.keyA, id, `x = 42; open("/home/user/wool.txt", "w").write("wool")`)

	r := e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "s1"})
	want(t, r, http.StatusCreated, "")
	if j := r.json(t); j["name"] != "s1" || j["sandbox_id"] != id || j["size_bytes"].(float64) <= 0 {
		t.Fatalf("snapshot: %s", r.body)
	}
	if got := e.execIn(e.keyA, id, `x = 43; print(x)`); got != "43\n" {
		t.Fatalf("the original after the snapshot: %q", got)
	}
	r = e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"snapshot": "s1", "metadata": map[string]string{"from": "s1"}})
	want(t, r, http.StatusCreated, "")
	j := r.json(t)
	clone := j["id"].(string)
	if clone == id || j["resources"].(map[string]any)["memory_mb"].(float64) != 256 {
		t.Fatalf("started from the snapshot: %s", r.body)
	}
	if got := e.execIn(e.keyA, clone, `print(x, open("/home/user/wool.txt").read())`); got != "42 wool\n" {
		t.Fatalf("started from the snapshot: %q, want the variable and the file of the snapshot", got)
	}
	if got := e.execIn(e.keyA, id, `print(x)`); got != "43\n" {
		t.Fatalf("the original after a sandbox started from its snapshot: %q", got)
	}
	// A sandbox started from a snapshot pauses and resumes as any.
	want(t, e.do("POST", "/v1/sandboxes/"+clone+"/pause", e.keyA, nil), http.StatusOK, "")
	if got := e.execIn(e.keyA, clone, `print(x)`); got != "42\n" {
		t.Fatalf("started from the snapshot, after a pause and resume: %q", got)
	}

	// Bad input.
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "Bad Name"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "s1"}), http.StatusConflict, "ERR_CONFLICT")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"snapshot": "nope"}), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"snapshot": "../s1"}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"snapshot": "s1", "template": "python"}), http.StatusBadRequest, "ERR_BAD_REQUEST")

	// The bound: two per account here.
	want(t, e.do("POST", "/v1/sandboxes/"+clone+"/snapshots", e.keyA, map[string]any{"name": "s2"}), http.StatusCreated, "")
	// A snapshot of a sandbox started from a snapshot starts sandboxes too.
	second := e.create(e.keyA, map[string]any{"snapshot": "s2"})
	if got := e.execIn(e.keyA, second, `print(x)`); got != "42\n" {
		t.Fatalf("from a snapshot of a sandbox started from a snapshot: %q", got)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+second, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "s3"}), http.StatusTooManyRequests, "ERR_SESSION_QUOTA_EXCEEDED")
	r = e.do("GET", "/v1/snapshots", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var names []string
	for _, s := range r.json(t)["snapshots"].([]any) {
		names = append(names, s.(map[string]any)["name"].(string))
	}
	if len(names) != 2 || names[0] != "s1" || names[1] != "s2" {
		t.Fatalf("listed %v, want [s1 s2]", names)
	}
	r = e.do("GET", "/v1/snapshots/s2", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if r.json(t)["sandbox_id"] != clone {
		t.Errorf("get: %s", r.body)
	}

	// In use: a create starting from it holds it.
	release := e.srv.HoldSnapshotFor(id, "s2")
	want(t, e.do("DELETE", "/v1/snapshots/s2", e.keyA, nil), http.StatusConflict, "ERR_CONFLICT")
	release()
	want(t, e.do("DELETE", "/v1/snapshots/s2", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/snapshots/s2", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/snapshots/s2", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "s3"}), http.StatusCreated, "")
	for _, sb := range []string{id, clone} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, e.keyA, nil), http.StatusNoContent, "")
	}
	for _, n := range []string{"s1", "s3"} {
		want(t, e.do("DELETE", "/v1/snapshots/"+n, e.keyA, nil), http.StatusNoContent, "")
	}
	if left := filesUnder(t, e.engine.SnapshotDir()); len(left) != 0 {
		t.Errorf("files left in the snapshot dir: %v", left)
	}
}

// TestSnapshotOtherAccount is the attack of one account on another's
// snapshot: B cannot see, list, start from or delete A's snapshot (404
// ERR_NOT_FOUND, as a snapshot that does not exist), nor snapshot A's
// sandbox (404 ERR_SANDBOX_NOT_FOUND), nor take A's name from A; the
// control is A doing each of these.
func TestSnapshotOtherAccount(t *testing.T) {
	e := runcEnv(t)
	id := e.create(e.keyA, map[string]any{})
	e.execIn(e.keyA, id, `secret_of_a = "a's"`)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyB, map[string]any{"name": "mine"}), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "mine"}), http.StatusCreated, "")

	want(t, e.do("GET", "/v1/snapshots/mine", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("GET", "/v1/snapshots/mine", e.keyA, nil), http.StatusOK, "")
	if l := e.do("GET", "/v1/snapshots", e.keyB, nil).json(t)["snapshots"].([]any); len(l) != 0 {
		t.Errorf("B lists A's snapshots: %v", l)
	}
	if l := e.do("GET", "/v1/snapshots", e.keyA, nil).json(t)["snapshots"].([]any); len(l) != 1 {
		t.Errorf("A lists %v, want its snapshot", l)
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyB, map[string]any{"snapshot": "mine"}), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/snapshots/mine", e.keyB, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	// B's own sandbox may take the same name in B's account: another
	// snapshot, which does not replace A's.
	idB := e.create(e.keyB, map[string]any{})
	want(t, e.do("POST", "/v1/sandboxes/"+idB+"/snapshots", e.keyB, map[string]any{"name": "mine"}), http.StatusCreated, "")
	fromB := e.create(e.keyB, map[string]any{"snapshot": "mine"})
	if got := e.execIn(e.keyB, fromB, `print("secret_of_a" in globals())`); got != "False\n" {
		t.Errorf("B's sandbox from B's snapshot named as A's has A's variable: %q", got)
	}
	fromA := e.create(e.keyA, map[string]any{"snapshot": "mine"})
	if got := e.execIn(e.keyA, fromA, `print(secret_of_a)`); got != "a's\n" {
		t.Errorf("A's sandbox from A's snapshot: %q", got)
	}
	want(t, e.do("GET", "/v1/sandboxes/"+fromA, e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	for key, ids := range map[string][]string{e.keyA: {id, fromA}, e.keyB: {idB, fromB}} {
		for _, sb := range ids {
			want(t, e.do("DELETE", "/v1/sandboxes/"+sb, key, nil), http.StatusNoContent, "")
		}
		want(t, e.do("DELETE", "/v1/snapshots/mine", key, nil), http.StatusNoContent, "")
	}
}

// TestSnapshotHoldsNoSecretValue: a sandbox given a secret (an env
// placeholder the egress gateway would fill) is snapshotted, and no file
// of the snapshot holds the secret's value. The control: a value the
// sandbox's code does hold in memory is found in a snapshot's images the
// same way.
func TestSnapshotHoldsNoSecretValue(t *testing.T) {
	e := runcEnv(t)
	const value = "sk-live-9f3b7c1e5a2d4868"
	want(t, e.do("POST", "/v1/secrets", e.keyA, map[string]any{"name": "api_key", "value": value}), http.StatusCreated, "")
	id := e.create(e.keyA, map[string]any{"env": map[string]string{"API_KEY": "${secrets.api_key}"}})
	if got := e.execIn(e.keyA, id, `import os; print(os.environ["API_KEY"])`); got != "${secrets.api_key}\n" {
		t.Fatalf("the sandbox's env: %q", got)
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "s"}), http.StatusCreated, "")
	if hits := filesHolding(t, e.engine.SnapshotDir(), value); len(hits) != 0 {
		t.Errorf("the secret's value is in the snapshot: %v", hits)
	}
	// Control: the same value, held in the sandbox's memory by its code.
	e.execIn(e.keyA, id, `held = "sk-live-" + "9f3b7c1e5a2d4868"`)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "control"}), http.StatusCreated, "")
	if hits := filesHolding(t, e.engine.SnapshotDir(), value); len(hits) == 0 {
		t.Error("control: a value in the sandbox's memory is not found in its snapshot; the search proves nothing")
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	for _, n := range []string{"s", "control"} {
		want(t, e.do("DELETE", "/v1/snapshots/"+n, e.keyA, nil), http.StatusNoContent, "")
	}
}

// filesUnder lists the regular files under dir.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && p != filepath.Join(dir, ".disk") { // the dir's name among servers' disks
			out = append(out, p)
		}
		return nil
	})
	return out
}

// filesHolding lists the files under dir that hold s.
func filesHolding(t *testing.T, dir, s string) []string {
	t.Helper()
	var out []string
	for _, p := range filesUnder(t, dir) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(s)) {
			out = append(out, p)
		}
	}
	return out
}

// TestSnapshotAfterServerRestart: a snapshot survives the server's
// shutdown and start over the same database and data dir, is listed by
// the new server, and a sandbox starts from it with the variable it
// held; what a crash left half made in the snapshot dir is removed at
// the start.
func TestSnapshotAfterServerRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	rootfs, st, key := restartStore(t)
	data := traversableDir(t)
	rcfg := oci.Config{RuntimePath: testutil.Runc(t), StateDir: filepath.Join(data, "run"), AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: testInstance("srvsnaprestart")}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() (*env, func()) {
		return serveOn(t, st, key, rcfg, sandbox.Config{CheckpointDir: filepath.Join(data, "checkpoints"),
			Templates: sandbox.TemplatesFunc(func(string) (string, error) { return rootfs, nil })}, log, false)
	}
	e, stop := start()
	id := e.create(key, map[string]any{})
	e.execIn(key, id, `x = "kept"`)
	r := e.do("POST", "/v1/sandboxes/"+id+"/snapshots", key, map[string]any{"name": "keep"})
	want(t, r, http.StatusCreated, "")
	size := int64(r.json(t)["size_bytes"].(float64))
	snaps := e.engine.SnapshotDir()
	if snaps != filepath.Join(data, "snapshots") {
		t.Fatalf("snapshot dir %s, want beside the checkpoints", snaps)
	}
	stop()
	// A crash in the middle of a snapshot leaves its .new- directory.
	ents, _ := os.ReadDir(snaps)
	var accts []fs.DirEntry
	for _, d := range ents {
		if d.IsDir() {
			accts = append(accts, d)
		}
	}
	if len(accts) != 1 {
		t.Fatalf("account dirs %v", ents)
	}
	// The store forgets this disk's snapshots: the start counts them again.
	disk, err := os.ReadFile(filepath.Join(snaps, ".disk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ClearSnapshotBytes(ctx, strings.TrimSpace(string(disk))); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(snaps, accts[0].Name(), ".new-123")
	if err := os.MkdirAll(filepath.Join(half, "state"), 0o700); err != nil {
		t.Fatal(err)
	}

	e, stop = start()
	defer stop()
	if _, err := os.Stat(half); err == nil {
		t.Error("a half-made snapshot is left after the start")
	}
	snapshotBytes := func() int64 {
		t.Helper()
		var n int64
		for _, at := range []time.Time{time.Now().Add(2 * time.Hour), time.Now().Add(3 * time.Hour)} {
			cs, err := st.MeterStorage(ctx, at)
			if err != nil {
				t.Fatal(err)
			}
			n = 0 // what the last metering saw
			for _, c := range cs {
				n += c.SnapshotBytes
			}
		}
		return n
	}
	if got := snapshotBytes(); got != size {
		t.Errorf("metered after the restart: snapshots of %d bytes, want %d", got, size)
	}
	r = e.do("GET", "/v1/snapshots", key, nil)
	want(t, r, http.StatusOK, "")
	if l := r.json(t)["snapshots"].([]any); len(l) != 1 || l[0].(map[string]any)["name"] != "keep" {
		t.Fatalf("listed after the restart: %s", r.body)
	}
	from := e.create(key, map[string]any{"snapshot": "keep"})
	if got := e.execIn(key, from, `print(x)`); got != "kept\n" {
		t.Fatalf("started from the snapshot after the restart: %q", got)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+from, key, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/snapshots/keep", key, nil), http.StatusNoContent, "")
}

// TestForkAndDiff forks a running sandbox into three: each fork has the
// parent's variable and files of the moment of the fork, its own id, and
// goes its own way (a variable set in one is in no other, nor in the
// parent, which runs on); the diff of a fork against its parent lists
// what the fork added, changed and deleted since, and nothing the parent
// did after the fork or had before it. Bad counts, another account's
// fork and a diff against a sandbox that is not the parent are refused.
func TestForkAndDiff(t *testing.T) {
	e := runcEnv(t)
	parent := e.create(e.keyA, map[string]any{})
	e.execIn(e.keyA, parent, `
import os
x = 7
os.makedirs("/home/user/work", exist_ok=True)
for n in ("keep", "edit", "drop"):
    open("/home/user/work/" + n + ".txt", "w").write(n)`)
	for _, c := range []any{0, server.MaxForks + 1, "two"} {
		want(t, e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": c}), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	want(t, e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyB, map[string]any{"count": 1}), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	r := e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": 3})
	want(t, r, http.StatusCreated, "")
	var forks []string
	for _, s := range r.json(t)["sandboxes"].([]any) {
		forks = append(forks, s.(map[string]any)["id"].(string))
	}
	if len(forks) != 3 || forks[0] == forks[1] || forks[1] == forks[2] || forks[0] == parent {
		t.Fatalf("forks %v", forks)
	}
	e.execIn(e.keyA, parent, `x = "parent"; open("/home/user/work/late.txt", "w").write("late")`)
	for i, f := range forks {
		if got := e.execIn(e.keyA, f, `print(x, sorted(os.listdir("/home/user/work")))`); got != "7 ['drop.txt', 'edit.txt', 'keep.txt']\n" {
			t.Fatalf("fork %d: %q, want the parent's variable and files at the fork", i, got)
		}
		e.execIn(e.keyA, f, fmt.Sprintf(`x = %d`, i))
	}
	for i, f := range forks {
		if got := e.execIn(e.keyA, f, `print(x)`); got != fmt.Sprintf("%d\n", i) {
			t.Errorf("fork %d's own variable: %q", i, got)
		}
	}
	if got := e.execIn(e.keyA, parent, `print(x)`); got != "parent\n" {
		t.Errorf("the parent's variable: %q", got)
	}

	e.execIn(e.keyA, forks[0], `
import os
open("/home/user/work/edit.txt", "w").write("edited")
os.remove("/home/user/work/drop.txt")
open("/home/user/work/new.txt", "w").write("new")
os.remove("/home/user/.bash_logout")`)
	r = e.do("GET", "/v1/sandboxes/"+forks[0]+"/diff?against="+parent, e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var d struct {
		Against                 string
		Added, Changed, Deleted []string
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	has := func(l []string, p string) bool { return slices.Contains(l, p) }
	if d.Against != parent || !has(d.Added, "/home/user/work/new.txt") || !has(d.Changed, "/home/user/work/edit.txt") ||
		!has(d.Deleted, "/home/user/work/drop.txt") || !has(d.Deleted, "/home/user/.bash_logout") {
		t.Errorf("diff: %s", r.body)
	}
	for _, p := range []string{"/home/user/work/keep.txt", "/home/user/work/late.txt", "/home/user/work"} {
		if has(d.Added, p) || has(d.Changed, p) || has(d.Deleted, p) {
			t.Errorf("diff lists %s, which the fork did not touch: %s", p, r.body)
		}
	}
	r = e.do("GET", "/v1/sandboxes/"+forks[1]+"/diff?against="+parent, e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range slices.Concat(d.Added, d.Changed, d.Deleted) {
		if strings.HasPrefix(p, "/home/user/work") || p == "/home/user/.bash_logout" {
			t.Errorf("an untouched fork's diff lists %s", p)
		}
	}
	want(t, e.do("GET", "/v1/sandboxes/"+forks[0]+"/diff?against="+forks[1], e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("GET", "/v1/sandboxes/"+forks[0]+"/diff", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", "/v1/sandboxes/"+forks[0]+"/diff?against="+parent, e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("GET", "/v1/sandboxes/"+forks[0], e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")

	for _, sb := range append(forks, parent) {
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, e.keyA, nil), http.StatusNoContent, "")
	}
	// The next fork prunes the groups of forks that are gone.
	other := e.create(e.keyA, map[string]any{})
	r = e.do("POST", "/v1/sandboxes/"+other+"/fork", e.keyA, nil)
	want(t, r, http.StatusCreated, "")
	groups, _ := os.ReadDir(filepath.Join(e.engine.SnapshotDir(), ".forks"))
	if len(groups) != 1 {
		t.Errorf("fork groups after the first's forks stopped: %v, want the second's alone", groups)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+r.json(t)["sandboxes"].([]any)[0].(map[string]any)["id"].(string), e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+other, e.keyA, nil), http.StatusNoContent, "")
}

// TestSnapshotForkClient drives snapshots, forks and diffs through the
// Go SDK.
func TestSnapshotForkClient(t *testing.T) {
	e := runcEnv(t)
	ctx := context.Background()
	c := client.New(e.url, e.keyA)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(id, code string) string {
		t.Helper()
		ex, err := c.Execute(ctx, id, client.ExecuteRequest{Code: code})
		if err != nil || ex.Error != nil {
			t.Fatalf("execute %q: %v %+v", code, err, ex)
		}
		return ex.Stdout
	}
	run(sb.ID, `y = "sdk"`)
	snap, err := c.CreateSnapshot(ctx, sb.ID, "sdk")
	if err != nil || snap.Name != "sdk" || snap.SandboxID != sb.ID {
		t.Fatalf("CreateSnapshot: %+v %v", snap, err)
	}
	if _, err := c.CreateSnapshot(ctx, sb.ID, "sdk"); !errors.Is(err, client.ErrConflict) {
		t.Errorf("a second snapshot of the same name: %v", err)
	}
	if l, err := c.ListSnapshots(ctx); err != nil || len(l) != 1 {
		t.Errorf("ListSnapshots: %+v %v", l, err)
	}
	from, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: "sdk"})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(from.ID, `print(y)`); got != "sdk\n" {
		t.Errorf("from the snapshot: %q", got)
	}
	forks, err := c.Fork(ctx, sb.ID, 2)
	if err != nil || len(forks) != 2 {
		t.Fatalf("Fork: %+v %v", forks, err)
	}
	run(forks[0].ID, `open("/home/user/f.txt", "w").write("f")`)
	d, err := c.DiffSandbox(ctx, forks[0].ID, sb.ID)
	if err != nil || !slices.Contains(d.Added, "/home/user/f.txt") {
		t.Errorf("DiffSandbox: %+v %v", d, err)
	}
	if a, err := c.AdoptFork(ctx, forks[0].ID); err != nil || a.Parent != sb.ID || !slices.Contains(a.Copied, "/home/user/f.txt") {
		t.Errorf("AdoptFork: %+v %v", a, err)
	}
	if got := run(sb.ID, `print(open("/home/user/f.txt").read())`); got != "f\n" {
		t.Errorf("the parent after AdoptFork: %q", got)
	}
	if err := c.DeleteSnapshot(ctx, "sdk"); err != nil {
		t.Error(err)
	}
	if _, err := c.GetSnapshot(ctx, "sdk"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetSnapshot after the delete: %v", err)
	}
	for _, id := range []string{sb.ID, from.ID, forks[0].ID, forks[1].ID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// TestAdopt copies a fork's changes back into its parent: a file added,
// a file changed and a file deleted in the fork are so in the parent
// after the adopt, files neither touched stay, and the parent's own
// process state is untouched (it is files only). Adopting a sandbox
// that is not a fork is ERR_NOT_FOUND; another account cannot adopt.
func TestAdopt(t *testing.T) {
	e := runcEnv(t)
	parent := e.create(e.keyA, map[string]any{})
	e.execIn(e.keyA, parent, `
import os
z = "parent"
os.makedirs("/home/user/p", exist_ok=True)
for n in ("keep", "edit", "drop"):
    open("/home/user/p/" + n, "w").write(n)`)
	r := e.do("POST", "/v1/sandboxes/"+parent+"/fork", e.keyA, map[string]any{"count": 1})
	want(t, r, http.StatusCreated, "")
	fork := r.json(t)["sandboxes"].([]any)[0].(map[string]any)["id"].(string)
	e.execIn(e.keyA, fork, `
import os
z = "fork"
open("/home/user/p/edit", "w").write("edited")
os.remove("/home/user/p/drop")
os.makedirs("/home/user/p/sub")
open("/home/user/p/sub/new", "w").write("new")
os.chmod("/home/user/p/sub/new", 0o600)`)
	want(t, e.do("POST", "/v1/sandboxes/"+fork+"/adopt", e.keyB, nil), http.StatusNotFound, "ERR_SANDBOX_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes/"+parent+"/adopt", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	// Control: before the adopt the parent has none of the fork's changes.
	if got := e.execIn(e.keyA, parent, `print(sorted(os.listdir("/home/user/p")), open("/home/user/p/edit").read())`); got != "['drop', 'edit', 'keep'] edit\n" {
		t.Fatalf("the parent before the adopt: %q", got)
	}
	r = e.do("POST", "/v1/sandboxes/"+fork+"/adopt", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var res struct {
		Parent          string
		Copied, Deleted []string
	}
	if err := json.Unmarshal(r.body, &res); err != nil {
		t.Fatal(err)
	}
	if res.Parent != parent || !slices.Contains(res.Copied, "/home/user/p/sub/new") || !slices.Contains(res.Deleted, "/home/user/p/drop") {
		t.Errorf("adopt: %s", r.body)
	}
	got := e.execIn(e.keyA, parent, `print(sorted(os.listdir("/home/user/p")), open("/home/user/p/edit").read(),
      open("/home/user/p/sub/new").read(), oct(os.stat("/home/user/p/sub/new").st_mode & 0o777), z)`)
	if got != "['edit', 'keep', 'sub'] edited new 0o600 parent\n" {
		t.Errorf("the parent after the adopt: %q", got)
	}
	for _, sb := range []string{fork, parent} {
		want(t, e.do("DELETE", "/v1/sandboxes/"+sb, e.keyA, nil), http.StatusNoContent, "")
	}
}

// TestE2BSnapshotAndFork drives E2B's snapshot and fork API: a snapshot
// named with E2B's namespace and tag is kept under its bare name, listed,
// started from by a create naming it as its template (with the variable
// of the moment, and tokens of its own), forked, and deleted as E2B
// deletes a template. Another account's create naming it does not start
// from it, nor can it delete it.
func TestE2BSnapshotAndFork(t *testing.T) {
	e := runcEnv(t)
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	e.execIn(e.keyA, sb.ID, `v = "e2b"`)
	r := e.e2bDo("POST", "/sandboxes/"+sb.ID+"/snapshots", e.keyA, map[string]any{"name": "team/warm:v1"})
	want(t, r, http.StatusCreated, "")
	if j := r.json(t); j["snapshotID"] != "warm" || len(j["names"].([]any)) != 1 {
		t.Fatalf("createSnapshot: %s", r.body)
	}
	r = e.e2bDo("GET", "/snapshots", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if !strings.Contains(string(r.body), `"snapshotID":"warm"`) {
		t.Errorf("listSnapshots: %s", r.body)
	}
	r = e.e2bDo("GET", "/snapshots?sandboxID=other", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if string(bytes.TrimSpace(r.body)) != "[]" {
		t.Errorf("listSnapshots of another sandbox: %s", r.body)
	}
	// B naming A's snapshot gets the template of that name (this test
	// server has one for any name), not A's snapshot.
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyB, map[string]any{"templateID": "warm"}); r.status == http.StatusCreated {
		idB := r.json(t)["sandboxID"].(string)
		if got := e.execIn(e.keyB, idB, `print("v" in globals())`); got != "False\n" {
			t.Errorf("another account's create naming A's snapshot has A's variable: %q", got)
		}
		want(t, e.e2bDo("DELETE", "/sandboxes/"+idB, e.keyB, nil), http.StatusNoContent, "")
	}
	from := e.e2bCreate(e.keyA, map[string]any{"templateID": "warm:v1"})
	if from.ID == sb.ID || from.Token == sb.Token {
		t.Fatalf("a sandbox from the snapshot shares the original's id or token")
	}
	if got := e.execIn(e.keyA, from.ID, `print(v)`); got != "e2b\n" {
		t.Errorf("from the snapshot: %q", got)
	}
	r = e.e2bDo("POST", "/sandboxes/"+sb.ID+"/fork", e.keyA, map[string]any{"count": 2})
	want(t, r, http.StatusCreated, "")
	var forks []struct {
		Sandbox struct {
			SandboxID       string `json:"sandboxID"`
			EnvdAccessToken string `json:"envdAccessToken"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(r.body, &forks); err != nil || len(forks) != 2 {
		t.Fatalf("fork: %s %v", r.body, err)
	}
	for _, f := range forks {
		if f.Sandbox.EnvdAccessToken == "" || f.Sandbox.EnvdAccessToken == sb.Token {
			t.Errorf("a fork's token: %q", f.Sandbox.EnvdAccessToken)
		}
		if got := e.execIn(e.keyA, f.Sandbox.SandboxID, `print(v)`); got != "e2b\n" {
			t.Errorf("fork: %q", got)
		}
	}
	want(t, e.e2bDo("DELETE", "/templates/warm", e.keyB, nil), http.StatusNotFound, "")
	want(t, e.e2bDo("DELETE", "/templates/team/warm:v1", e.keyA, nil), http.StatusNotFound, "")
	want(t, e.e2bDo("DELETE", "/templates/warm:v1", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.e2bDo("DELETE", "/templates/warm", e.keyA, nil), http.StatusNotFound, "")
	for _, id := range []string{sb.ID, from.ID, forks[0].Sandbox.SandboxID, forks[1].Sandbox.SandboxID} {
		want(t, e.e2bDo("DELETE", "/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
}

// TestSnapshotBytesBound is an account's attempt to keep more of the
// server's disk in snapshots than --max-snapshot-mb-per-account lets it:
// a snapshot of a sandbox holding a 64 MiB file, past the 48 MiB bound,
// is refused with ERR_STORAGE_QUOTA_EXCEEDED, nothing of it is kept and
// the sandbox runs on; it is refused with the account's other snapshot
// deleted too (it alone passes the bound). The controls are snapshots of
// the same sandbox without the file, taken under the bound.
func TestSnapshotBytesBound(t *testing.T) {
	const limit = 48 << 20
	e := runcEnvWith(t, server.Config{MaxSnapshotBytesPerAccount: limit})
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 256}})
	e.execIn(e.keyA, id, `x = 42`)

	// The control: under the bound.
	r := e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "small"})
	want(t, r, http.StatusCreated, "")
	small := int64(r.json(t)["size_bytes"].(float64))
	t.Logf("a snapshot of a fresh sandbox: %d bytes", small)
	if small <= 0 || small >= limit {
		t.Fatalf("the control snapshot holds %d bytes, want within (0, %d)", small, limit)
	}

	// The attack: 64 MiB of incompressible bytes in the sandbox's disk.
	e.execIn(e.keyA, id, `import os; f = open("/home/user/big", "wb"); [f.write(os.urandom(1 << 20)) for _ in range(64)]; f.close()`)
	r = e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "big"})
	want(t, r, http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	if got := e.execIn(e.keyA, id, `print(x, os.path.getsize("/home/user/big"))`); got != fmt.Sprintf("42 %d\n", 64<<20) {
		t.Fatalf("the sandbox after a refused snapshot: %q", got)
	}
	want(t, e.do("GET", "/v1/snapshots/big", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	// Nothing of the refused one is kept: only the control's files.
	want(t, e.do("DELETE", "/v1/snapshots/small", e.keyA, nil), http.StatusNoContent, "")
	if left := filesUnder(t, e.engine.SnapshotDir()); len(left) != 0 {
		t.Fatalf("files left in the snapshot dir after a refused snapshot: %v", left)
	}

	// Room made, the file's snapshot alone still passes the bound.
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "big"}), http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	// Without the file it fits again.
	e.execIn(e.keyA, id, `os.remove("/home/user/big")`)
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "again"}), http.StatusCreated, "")
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/snapshots/again", e.keyA, nil), http.StatusNoContent, "")
}

// TestSnapshotMetered: a snapshot's bytes are charged as the account's
// storage over time, its share shown as storage.snapshots_gb_seconds,
// within gb_seconds and charged; the control is the other account,
// without snapshots, charged none; a deleted snapshot is charged no
// more.
func TestSnapshotMetered(t *testing.T) {
	prices := metering.Prices{StorageGBSecond: 1e6}
	e := runcEnvWith(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}})
	id := e.create(e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 256, "disk_mb": 64}})
	r := e.do("POST", "/v1/sandboxes/"+id+"/snapshots", e.keyA, map[string]any{"name": "kept"})
	want(t, r, http.StatusCreated, "")
	start := time.Now()
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	size := r.json(t)["size_bytes"].(float64)
	second := size / (1 << 30) // GB-seconds of one second of it
	usage := func(key string) map[string]any {
		return e.do("GET", "/v1/account/usage", key, nil).json(t)["storage"].(map[string]any)
	}
	var storage map[string]any
	for deadline := start.Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if storage = usage(e.keyA); storage["snapshots_gb_seconds"].(float64) >= second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the snapshot of %v bytes was never metered a second: %v", size, storage)
		}
	}
	got := storage["snapshots_gb_seconds"].(float64)
	if most := second * time.Since(start.Add(-time.Second)).Seconds(); got > most || storage["gb_seconds"].(float64) < got ||
		storage["cost_micros"].(float64) < math.Floor(got*1e6) {
		t.Fatalf("storage %v after %v: at most %g snapshot GB-seconds, all within gb_seconds and charged", storage, time.Since(start), most)
	}
	if b := usage(e.keyB); b["snapshots_gb_seconds"] != 0.0 {
		t.Fatalf("B, without snapshots: %v", b)
	}
	// Deleted, it is charged no more: two flushes after the delete add nothing.
	want(t, e.do("DELETE", "/v1/snapshots/kept", e.keyA, nil), http.StatusNoContent, "")
	for n := e.srv.MeterFlushes() + 2; e.srv.MeterFlushes() < n; time.Sleep(20 * time.Millisecond) {
	}
	before := usage(e.keyA)["snapshots_gb_seconds"].(float64)
	for n := e.srv.MeterFlushes() + 2; e.srv.MeterFlushes() < n; time.Sleep(20 * time.Millisecond) {
	}
	if after := usage(e.keyA)["snapshots_gb_seconds"].(float64); after != before {
		t.Fatalf("a deleted snapshot charged on: %g, then %g", before, after)
	}
}
