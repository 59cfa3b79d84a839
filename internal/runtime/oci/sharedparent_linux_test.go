package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestCreateWhileOthersClose: instances share the top cgroup
// (CgroupParent), which an instance that closes (or a sweep that closes
// a dead one) removes when it is empty. A create of another instance
// meanwhile keeps its cgroup. It did not when runc made the instance's
// cgroup at its first create: a removal between runc's mkdir of the top
// cgroup and of the instance's failed the create ("mkdir
// /sys/fs/cgroup/cpu/sheepfold-test/t…: no such file or directory";
// TestPolicyNetworkWithoutTheHook under load, with other packages'
// tests closing instances). Here the closing instances are a loop of
// removeParent over a top cgroup of the test's own, and each create is
// the first of a new instance.
func TestCreateWhileOthersClose(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	var b [4]byte
	rand.Read(b[:])
	top := "sheepfold-test-" + hex.EncodeToString(b[:])
	closing, err := detectCgroups(top + "/closing")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				closing.removeParent()
			}
		}
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		closing.removeParent()
		for _, m := range closing.mounts {
			if err := unix.Access(filepath.Join(m, top), unix.F_OK); err == nil {
				t.Errorf("cgroup left: %s", filepath.Join(m, top))
			}
		}
	})

	for i := range 8 {
		cfg := testConfig(t, fmt.Sprintf("i%d", i))
		cfg.CgroupParent = top
		o, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Create(context.Background(), runtime.Spec{ID: "one", RootFS: rootfs,
			Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 1 << 20}})
		if err == nil {
			if err := o.Destroy(context.Background(), "one"); err != nil {
				t.Error(err)
			}
		}
		if cerr := o.Close(); cerr != nil {
			t.Error(cerr)
		}
		if err != nil {
			t.Fatalf("create %d, the first of its instance, while others close: %v", i, err)
		}
	}
}
