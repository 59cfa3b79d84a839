package oci

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func testConfig(t *testing.T, instance string) Config {
	t.Helper()
	testutil.RequireRoot(t)
	return Config{
		RuntimePath: testutil.Runc(t), StateDir: testutil.ShortTempDir(t), AgentBin: testutil.AgentBin(t),
		CgroupParent: "sheepfold-test", Instance: instance,
	}
}

func ping(t *testing.T, sock string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := agentproto.NewConn(c)
	if err := conn.WriteJSON(agentproto.Request{Op: agentproto.OpPing}); err != nil {
		t.Fatal(err)
	}
	var ev agentproto.Event
	if err := conn.ReadJSON(&ev); err != nil || ev.Agent == nil {
		t.Fatalf("ping: %v %+v", err, ev)
	}
}

func assertGone(t *testing.T, o *OCI, id string) {
	t.Helper()
	if d := o.cg.dirs(id); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), o.bundle(id)) {
		t.Errorf("mounts left under %s", o.bundle(id))
	}
	if _, err := os.Stat(o.bundle(id)); err == nil {
		t.Errorf("bundle left: %s", o.bundle(id))
	}
}

func TestCreateDestroy(t *testing.T) {
	o, err := New(testConfig(t, "cd"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	rootfs := testutil.TemplateRootFS(t, "python")
	inst, err := o.Create(context.Background(), runtime.Spec{ID: "one", RootFS: rootfs,
		Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20, CPUs: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	ping(t, inst.Socket)
	u, err := o.Usage(context.Background(), "one")
	if err != nil || u.MemoryLimit != 128<<20 || u.Pids == 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "one", RootFS: rootfs}); err == nil {
		t.Fatal("a second sandbox with the same id was created")
	}
	if ids, _ := o.List(context.Background()); len(ids) != 1 || ids[0] != "one" {
		t.Fatalf("List = %v", ids)
	}
	if err := o.Destroy(context.Background(), "one"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, o, "one")
	if err := o.Destroy(context.Background(), "one"); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	o, err := New(testConfig(t, "fail"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	// A root without the agent's mount point target parent still works,
	// but a rootfs that is a file makes runc fail after our mounts are up.
	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "usr"), 0o755)
	os.WriteFile(filepath.Join(bad, "proc"), []byte("not a dir"), 0o644)
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "bad", RootFS: bad,
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err == nil {
		t.Fatal("create with a broken rootfs succeeded")
	}
	assertGone(t, o, "bad")
	for _, id := range []string{"../x", "UPPER", ""} {
		if _, err := o.Create(context.Background(), runtime.Spec{ID: id, RootFS: bad}); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}

func TestSweepDeadInstance(t *testing.T) {
	cfg := testConfig(t, "dead")
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Create(context.Background(), runtime.Spec{ID: "orphan", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Fatal("a second process took a live instance's lock")
	}
	crashed.lock.Close() // the process "dies": its lock goes, its sandbox stays

	cfg.Instance = "survivor"
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	assertGone(t, crashed, "orphan")
	if _, err := os.Stat(crashed.dir); err == nil {
		t.Errorf("dead instance dir %s left", crashed.dir)
	}
}
