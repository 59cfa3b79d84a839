package oci

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// inventory builds an inventory image of entry.
func inventory(entry []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0x58313116)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

// lockOf returns the network_lock_method of an inventory image, and
// whether it has one (more than one is an error).
func lockOf(t *testing.T, img []byte) (uint64, bool) {
	t.Helper()
	var method uint64
	seen := 0
	for rest := img[8:]; len(rest) > 0; {
		num, typ, l := protowire.ConsumeTag(rest)
		vl := protowire.ConsumeFieldValue(num, typ, rest[l:])
		if l < 0 || vl < 0 {
			t.Fatalf("a broken entry: %x", img)
		}
		if num == inventoryLockField {
			method, _ = protowire.ConsumeVarint(rest[l:])
			seen++
		}
		rest = rest[l+vl:]
	}
	if seen > 1 {
		t.Fatalf("network_lock_method %d times", seen)
	}
	return method, seen == 1
}

// TestInventoryWithLock: the rewrite sets network_lock_method, replacing
// the dumped one or adding one, and keeps every other field as it was;
// what is not an inventory image is refused.
func TestInventoryWithLock(t *testing.T) {
	var e []byte
	e = protowire.AppendTag(e, 1, protowire.VarintType)
	e = protowire.AppendVarint(e, 2)
	e = protowire.AppendTag(e, 3, protowire.BytesType)
	e = protowire.AppendBytes(e, []byte{8, 1, 16, 1})
	others := bytes.Clone(e)
	withLock := protowire.AppendTag(bytes.Clone(e), inventoryLockField, protowire.VarintType)
	withLock = protowire.AppendVarint(withLock, 0) // iptables
	withLock = protowire.AppendTag(withLock, 13, protowire.BytesType)
	withLock = protowire.AppendBytes(withLock, []byte("run-id"))
	for name, entry := range map[string][]byte{"dumped iptables": withLock, "none": others} {
		out, err := inventoryWithLock(inventory(entry), criuNetworkLockSkip)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m, ok := lockOf(t, out); !ok || m != criuNetworkLockSkip {
			t.Errorf("%s: network_lock_method %d (%v), want %d", name, m, ok, criuNetworkLockSkip)
		}
		if !bytes.HasPrefix(out[8:], others) || (name == "dumped iptables" && !bytes.Contains(out, []byte("run-id"))) {
			t.Errorf("%s: the other fields changed: %x", name, out)
		}
		if n := binary.LittleEndian.Uint32(out[4:8]); int(n) != len(out)-8 {
			t.Errorf("%s: length %d for an entry of %d bytes", name, n, len(out)-8)
		}
	}
	bad := inventory(others)
	bad[0] = 0
	if _, err := inventoryWithLock(bad, criuNetworkLockSkip); err == nil {
		t.Error("an image of another magic was rewritten")
	}
	if _, err := inventoryWithLock(inventory(others)[:10], criuNetworkLockSkip); err == nil {
		t.Error("a truncated image was rewritten")
	}
}

// TestSkipNetworkLockKeepsNftables: skipNetworkLock rewrites a dump's
// iptables lock (recorded, or CRIU's default when none is) to none, and
// leaves an inventory that records the nftables lock as it is, whose
// unlock at restore takes the dumped lock's table out of the ruleset.
func TestSkipNetworkLockKeepsNftables(t *testing.T) {
	var e []byte
	e = protowire.AppendTag(e, 1, protowire.VarintType)
	e = protowire.AppendVarint(e, 2)
	lock := func(m uint64) []byte {
		return inventory(protowire.AppendVarint(protowire.AppendTag(bytes.Clone(e), inventoryLockField, protowire.VarintType), m))
	}
	for name, c := range map[string]struct {
		img  []byte
		want uint64
	}{
		"iptables": {lock(0), criuNetworkLockSkip},
		"none":     {inventory(e), criuNetworkLockSkip},
		"nftables": {lock(criuNetworkLockNftables), criuNetworkLockNftables},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, inventoryImage)
		if err := os.WriteFile(path, c.img, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := skipNetworkLock(dir); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := inventoryLock(out); err != nil || m != c.want {
			t.Errorf("%s: the restore's lock method %d (%v), want %d", name, m, err, c.want)
		}
		if c.want == criuNetworkLockNftables && !bytes.Equal(out, c.img) {
			t.Errorf("%s: the image was rewritten: %x, was %x", name, out, c.img)
		}
	}
	if err := skipNetworkLock(t.TempDir()); err == nil {
		t.Error("a directory without an inventory passed")
	}
}

// TestRestoreLocksNoNetwork: a restore of a sandbox without a network
// runs no iptables (CRIU's network lock and unlock: about seven programs
// on the restore's path), and the sandbox's loopback carries TCP after
// it: a listening socket made before the checkpoint takes a connection
// and its data. CRIU runs through a directory whose iptables programs log
// each run: the dump's lock is seen there (the control: the log sees
// CRIU's iptables).
func TestRestoreLocksNoNetwork(t *testing.T) {
	ctx := context.Background()
	const id = "nlock"
	cfg := testConfig(t, "nlock")
	runs := logIptables(t, &cfg)
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	// The iptables lock, which a dump uses where CRIU has no nftables
	// lock (TestDumpLocksWithNftables): the wrappers see its programs.
	if err := o.criuReady(); err != nil {
		t.Fatal(err)
	}
	o.nftLock = false
	inst, err := o.Create(ctx, runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, `
import socket
ln = socket.create_server(("127.0.0.1", 0))`)
	dir := filepath.Join(checkpointsDir(t), "c")
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	dumped, _ := os.ReadFile(runs)
	if !strings.Contains(string(dumped), "iptables-restore") {
		t.Fatalf("the dump ran no iptables-restore through %s (%q): the log cannot see CRIU's network lock", filepath.Dir(runs), dumped)
	}
	if err := os.Remove(runs); err != nil {
		t.Fatal(err)
	}
	inst, err = o.Restore(ctx, id, dir)
	if err != nil {
		t.Fatal(err)
	}
	if restored, err := os.ReadFile(runs); err == nil {
		t.Errorf("the restore ran iptables: %q", restored)
	}
	got := execPython(t, inst.Socket, `
ln.settimeout(10)
client = socket.create_connection(ln.getsockname(), timeout=10)
server, _ = ln.accept()
client.sendall(b"after")
server.sendall(b"back")
print(server.recv(5).decode(), client.recv(4).decode())`)
	if strings.TrimSpace(got) != "after back" {
		t.Errorf("the loopback after the restore: %q, want %q", got, "after back")
	}
}

// TestDumpLocksWithNftables: where CRIU can lock with nftables, a dump
// does, from CRIU's own process: a checkpoint and a snapshot run no
// iptables program, the inventory records the nftables method, the
// snapshotted sandbox runs on with its loopback open (the lock taken out)
// and the restored one has its loopback connection back.
func TestDumpLocksWithNftables(t *testing.T) {
	ctx := context.Background()
	const id = "nftlock"
	cfg := testConfig(t, "nftlock")
	runs := logIptables(t, &cfg)
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	if err := o.criuReady(); err != nil {
		t.Fatal(err)
	}
	if !o.nftLock {
		t.Skip("this host's CRIU cannot lock with nftables (criu check --feature network_lock_nftables)")
	}
	inst, err := o.Create(ctx, runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, `
import socket
ln = socket.create_server(("127.0.0.1", 0))
ln.settimeout(10)
client = socket.create_connection(ln.getsockname(), timeout=10)
server, _ = ln.accept()`)
	snap := filepath.Join(checkpointsDir(t), "s")
	if err := o.Snapshot(ctx, id, snap); err != nil {
		t.Fatal(err)
	}
	inv, err := os.ReadFile(filepath.Join(snap, snapshotImages, inventoryImage))
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := lockOf(t, inv); !ok || m != 1 { // NETWORK_LOCK_NFTABLES
		t.Errorf("the snapshot's inventory records lock method %d (%v), want 1 (nftables)", m, ok)
	}
	loop := `
client.sendall(b"ping")
server.sendall(b"pong")
print(server.recv(4).decode(), client.recv(4).decode())`
	if got := strings.TrimSpace(execPython(t, inst.Socket, loop)); got != "ping pong" {
		t.Errorf("the loopback after the snapshot: %q, want %q", got, "ping pong")
	}
	dir := filepath.Join(checkpointsDir(t), "c")
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	if ran, err := os.ReadFile(runs); err == nil {
		t.Errorf("the dumps ran iptables: %q", ran)
	}
	inst, err = o.Restore(ctx, id, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(execPython(t, inst.Socket, loop)); got != "ping pong" {
		t.Errorf("the loopback after the restore: %q, want %q", got, "ping pong")
	}
}

// logIptables points cfg at a CRIU that finds, first on its PATH, the
// iptables programs its network lock runs, each wrapped to log its
// command line to the file it returns (which no run leaves missing).
func logIptables(t *testing.T, cfg *Config) (runs string) {
	t.Helper()
	bin := testutil.ShortTempDir(t)
	runs = filepath.Join(bin, "runs.log")
	if err := os.Symlink(filepath.Join(filepath.Dir(cfg.RuntimePath), "criu"), filepath.Join(bin, "criu")); err != nil {
		t.Fatal(err)
	}
	for _, prog := range []string{"iptables-restore", "ip6tables-restore", "iptables", "ip6tables"} {
		real, err := exec.LookPath(prog)
		if err != nil {
			t.Fatalf("%s: %v (CRIU's network lock needs it)", prog, err)
		}
		script := "#!/bin/sh\necho \"" + prog + " $*\" >> " + runs + "\nexec " + real + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(bin, prog), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg.CriuPath = filepath.Join(bin, "criu")
	return runs
}
