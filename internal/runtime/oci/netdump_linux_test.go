package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// interfacesOf lists the interfaces of pid's network namespace.
func interfacesOf(t *testing.T, pid int) []string {
	t.Helper()
	var names []string
	err := inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestCheckpointNeedsNetworkDetached: a sandbox with a network whose
// namespace still holds an interface besides lo (a TUN device, as its
// egress gateway makes, which CRIU could not dump) is not checkpointed
// (errNetworkAttached) and runs on; once the device is gone (its
// descriptor closed, as the gateway's Detach does: the control) it is checkpointed, and its restore brings the
// namespace back with lo alone and the resolv.conf the network bound.
func TestCheckpointNeedsNetworkDetached(t *testing.T) {
	ctx := context.Background()
	const id = "netdump"
	o, err := New(testConfig(t, "netdump"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	if err := o.criuReady(); err != nil {
		t.Fatalf("%v: run `make setup`", err)
	}
	// A TUN device, as the egress gateway makes, whose descriptor the
	// test holds: closing it takes the device away.
	tun := -1
	attach := func(_ context.Context, pid int) error {
		return inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), func() error {
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			ifr, err := unix.NewIfreq("tun0")
			if err != nil {
				return err
			}
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				unix.Close(fd)
				return err
			}
			tun = fd
			return nil
		})
	}
	inst, err := o.Create(ctx, runtime.Spec{ID: id, RootFS: testutil.TemplateRootFS(t, "python"), Limits: runtime.Limits{MemoryBytes: 128 << 20, Pids: 32, DiskBytes: 16 << 20},
		Network: &runtime.Network{ResolvConf: "nameserver 10.255.255.1\n", Attach: attach}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyChecked(t, o, id)
	execPython(t, inst.Socket, "x = 41")

	dir := filepath.Join(checkpointsDir(t), "checkpoint")
	if err := o.Checkpoint(ctx, id, dir); !errors.Is(err, errNetworkAttached) {
		t.Fatalf("checkpoint with its network attached: %v, want errNetworkAttached", err)
	}
	if got := execPython(t, inst.Socket, "print(x + 1)"); got != "42\n" {
		t.Fatalf("after the refused checkpoint the kernel says %q", got)
	}

	// The control: detached, it is checkpointed and restored.
	if err := unix.Close(tun); err != nil {
		t.Fatal(err)
	}
	if err := o.Checkpoint(ctx, id, dir); err != nil {
		t.Fatalf("checkpoint with its network detached: %v", err)
	}
	inst, err = o.Restore(ctx, id, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := interfacesOf(t, inst.PID); len(got) != 1 || got[0] != "lo" {
		t.Errorf("the restored namespace holds %v, want lo alone", got)
	}
	if got := execPython(t, inst.Socket, "print(x + 1, open('/etc/resolv.conf').read().split())"); got != "42 ['nameserver', '10.255.255.1']\n" {
		t.Fatalf("after the restore: %q", got)
	}
}
