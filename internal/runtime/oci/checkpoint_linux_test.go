package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// execPython runs code in the sandbox's default Python context over a
// new connection to the agent and returns what it printed.
func execPython(t *testing.T, sock, code string) string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial the agent: %v", err)
	}
	defer c.Close()
	var out, errs strings.Builder
	done, err := agentproto.Call(c, agentproto.Request{Op: agentproto.OpExecute,
		Execute: &agentproto.ExecuteSpec{Language: "python", Code: code, TimeoutMS: 60_000}}, nil,
		agentproto.Handlers{Event: func(ev agentproto.Event) error {
			switch ev.Type {
			case agentproto.EventStdout:
				out.Write(ev.Data)
			case agentproto.EventStderr:
				errs.Write(ev.Data)
			case agentproto.EventError:
				errs.WriteString(ev.Error.Name + ": " + ev.Error.Value + "\n" + ev.Error.Traceback)
			}
			return nil
		}})
	if err != nil || done.Status != agentproto.StatusOK {
		t.Fatalf("execute %q: %v, status %q %s: %s", code, err, done.Status, done.Message, errs.String())
	}
	return out.String()
}

// checkpointsDir is a directory for checkpoints: others may pass
// through it (a restore reads the images as the sandbox's own host uid).
func checkpointsDir(t *testing.T) string {
	d := testutil.ShortTempDir(t)
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

// checkpointable starts sandbox id of a Python template on a runtime of
// its own (instance name), which must have the set-up's CRIU; the runtime
// is closed when the test ends. The caller defers destroyChecked, so that
// the sandbox goes before the test's own directories (its checkpoints).
func checkpointable(t *testing.T, name, id string, lim runtime.Limits) (*OCI, *runtime.Instance) {
	t.Helper()
	o, err := New(testConfig(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	if err := o.criuReady(); err != nil {
		t.Fatalf("%v: run `make setup`", err) // root: CI has it
	}
	inst, err := o.Create(context.Background(), runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	return o, inst
}

// destroyChecked destroys sandbox id and checks that nothing of it is left.
func destroyChecked(t *testing.T, o *OCI, id string) {
	if err := o.Destroy(context.Background(), id); err != nil {
		t.Error(err)
	}
	assertGone(t, o, id)
}

// nsOwner is the host uid owning the user namespace of pid.
func nsOwner(pid int) (uint32, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return unix.IoctlGetUint32(int(f.Fd()), unix.NS_GET_OWNER_UID)
}

// memoryCharged is what the instance's memory cgroup (the parent of its
// sandboxes') holds now, its children's included.
func memoryCharged(t *testing.T, o *OCI) int64 {
	t.Helper()
	var f string
	if o.cg.v2 {
		f = filepath.Join(o.cg.mounts[0], o.cg.parent, "memory.current")
	} else {
		f = filepath.Join(filepath.Dir(o.cg.controller("x", "memory")), "memory.usage_in_bytes")
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCheckpointRestore checkpoints a sandbox whose Python kernel holds a
// variable (and 32 MiB of random bytes), which runs a background server
// and has a file in its writable layer: its processes end, the memory
// they held is freed, and a restore brings all of it back, reached through
// the agent's new socket. Twice, since a restore gives the agent new host
// objects that the second checkpoint must find; then a checkpointed
// sandbox is destroyed.
func TestCheckpointRestore(t *testing.T) {
	ctx := context.Background()
	const id = "ckpt"
	o, inst := checkpointable(t, "ckpt", id, runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20})
	defer destroyChecked(t, o, id)
	out := execPython(t, inst.Socket, `
import hashlib, os, socket, subprocess, time
marker = "baa"
blob = os.urandom(32 << 20)
digest = hashlib.sha256(blob).hexdigest()
srv = subprocess.Popen(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
for _ in range(500):
    try:
        socket.create_connection(("127.0.0.1", 8765)).close()
        break
    except OSError:
        time.sleep(0.02)
with open("/home/user/note.txt", "w") as f:
    f.write("kept")
print(srv.pid)
`)
	serverPID := strings.TrimSpace(out)
	dir := filepath.Join(checkpointsDir(t), "checkpoint")
	for round := 1; round <= 2; round++ {
		before, err := o.Usage(ctx, id)
		if err != nil || before.MemoryBytes < 32<<20 {
			t.Fatalf("round %d: usage before the checkpoint %+v %v: want the 32 MiB the kernel holds", round, before, err)
		}
		charged := memoryCharged(t, o)
		initStat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", inst.PID))
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if err := o.Checkpoint(ctx, id, dir); err != nil {
			t.Fatalf("round %d: checkpoint: %v", round, err)
		}
		t.Logf("round %d: checkpoint took %v (sandbox memory %d MiB)", round, time.Since(began).Round(time.Millisecond), before.MemoryBytes>>20)

		// Its processes are gone, its cgroups too, and the memory they
		// held with them; its files stay.
		// (Its pid may be another process's by now: the same stat line,
		// start time included, would be the same process.)
		if now, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", inst.PID)); err == nil && string(now) == string(initStat) {
			t.Errorf("round %d: the sandbox's init %d is still there after the checkpoint", round, inst.PID)
		}
		if d := o.cg.dirs(id); len(d) > 0 {
			t.Errorf("round %d: cgroups left by the checkpoint: %v", round, d)
		}
		if _, err := o.Usage(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("round %d: usage of a checkpointed sandbox: %v, want ErrNotFound", round, err)
		}
		if after := memoryCharged(t, o); charged-after < 32<<20 {
			t.Errorf("round %d: the instance's memory cgroup held %d MiB before the checkpoint and %d MiB after: want 32 MiB or more freed",
				round, charged>>20, after>>20)
		}
		if c, err := net.Dial("unix", inst.Socket); err == nil {
			c.Close()
			t.Errorf("round %d: the agent's socket still answers after the checkpoint", round)
		}
		if ids, _ := o.List(ctx); len(ids) != 1 || ids[0] != id {
			t.Errorf("round %d: List = %v: a checkpointed sandbox is still the runtime's", round, ids)
		}
		if err := o.Checkpoint(ctx, id, dir); !errors.Is(err, ErrCheckpointed) {
			t.Errorf("round %d: a second checkpoint: %v, want ErrCheckpointed", round, err)
		}

		if round == 1 {
			// A restore that fails half-way (CRIU has started the
			// processes when it finds no memory to give them) leaves
			// the sandbox checkpointed, and restorable.
			broken := dir + "-broken"
			if out, err := exec.Command("cp", "-a", dir, broken).CombinedOutput(); err != nil {
				t.Fatalf("copy the checkpoint: %v %s", err, out)
			}
			pages, _ := filepath.Glob(filepath.Join(broken, "pages-*.img"))
			for _, p := range pages {
				os.Remove(p)
			}
			if len(pages) == 0 {
				t.Fatal("the checkpoint has no pages-*.img")
			}
			if _, err := o.Restore(ctx, id, broken); err == nil {
				t.Fatal("a restore without the memory's images succeeded")
			} else {
				t.Logf("restore without memory: %v", err)
			}
			if d := o.cg.dirs(id); len(d) > 0 || o.running(id) {
				t.Errorf("a failed restore left cgroups %v or runc's state (%v)", d, o.running(id))
			}
			os.RemoveAll(broken)
		}
		began = time.Now()
		inst, err = o.Restore(ctx, id, dir)
		if err != nil {
			t.Fatalf("round %d: restore: %v", round, err)
		}
		t.Logf("round %d: restore took %v", round, time.Since(began).Round(time.Millisecond))
		if _, err := o.Restore(ctx, id, dir); !errors.Is(err, ErrRunning) {
			t.Errorf("round %d: a second restore: %v, want ErrRunning", round, err)
		}
		got := execPython(t, inst.Socket, `
import urllib.request
print(marker, hashlib.sha256(blob).hexdigest() == digest, srv.pid, srv.poll() is None,
      urllib.request.urlopen("http://127.0.0.1:8765/").status, open("/home/user/note.txt").read(),
      open("/proc/sys/user/max_user_namespaces").read().strip(), open("/proc/sys/user/max_inotify_instances").read().strip(),
      os.getuid(), *[l.split(":")[1].strip() for l in open("/proc/self/status") if l.split(":")[0] in ("Seccomp", "NoNewPrivs", "CapEff", "CapBnd")])
`)
		// The isolation is the original's: the sandbox's namespace
		// limits, the kernel's uid, no capabilities, no_new_privs and a
		// seccomp filter.
		if want := "baa True " + serverPID + " True 200 kept 0 128 1000 0000000000000000 0000000000000000 1 2\n"; got != want {
			t.Fatalf("round %d: after the restore the sandbox says %q, want %q", round, got, want)
		}
		// Its user namespace is owned by its own host uid, as Create's.
		var bundle syscall.Stat_t
		if err := syscall.Stat(o.bundle(id), &bundle); err != nil {
			t.Fatal(err)
		}
		if owner, err := nsOwner(inst.PID); err != nil || owner != bundle.Gid {
			t.Errorf("round %d: the restored user namespace is owned by %d (%v), want the sandbox's %d", round, owner, err, bundle.Gid)
		}
		u, err := o.Usage(ctx, id)
		if err != nil || u.MemoryBytes < 32<<20 || u.Pids < 2 || u.MemoryLimit != 256<<20 {
			t.Errorf("round %d: usage after the restore %+v %v: want its memory back, the kernel and the server counted, the same limit", round, u, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	// A checkpointed sandbox is destroyed as a running one is (the
	// deferred Destroy and assertGone).
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatalf("last checkpoint: %v", err)
	}
}

// TestCheckpointNeedsClosedConnections: a connection to the agent left
// open fails the checkpoint (a socket of the host's network namespace,
// which CRIU cannot dump), and the sandbox runs on as it was.
func TestCheckpointNeedsClosedConnections(t *testing.T) {
	ctx := context.Background()
	const id = "conn"
	o, inst := checkpointable(t, "ckptconn", id, runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20})
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, "x = 41")
	// A command streaming its output keeps its connection open (a
	// connection carries one request, and the agent closes it after the
	// Done).
	c, err := net.Dial("unix", inst.Socket)
	if err != nil {
		t.Fatal(err)
	}
	conn := agentproto.NewConn(c)
	if err := conn.WriteJSON(agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"600"}}}); err != nil {
		t.Fatal(err)
	}
	var ev agentproto.Event
	if err := conn.ReadJSON(&ev); err != nil || ev.Type != agentproto.EventStart {
		t.Fatalf("process.start: %+v %v", ev, err)
	}
	err = o.Checkpoint(ctx, id, filepath.Join(checkpointsDir(t), "checkpoint"))
	c.Close()
	if err == nil {
		t.Fatal("a sandbox with an open connection to its agent was checkpointed")
	}
	t.Logf("checkpoint with a connection open: %v", err)
	if got := execPython(t, inst.Socket, "print(x + 1)"); got != "42\n" {
		t.Fatalf("after the failed checkpoint the kernel says %q, want 42", got)
	}
}
