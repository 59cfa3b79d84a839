package oci

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// loopsLeft lists the loop devices still attached to a file under dir
// after up to 5 s: a device that clears itself at its unmount does so
// asynchronously.
func loopsLeft(t *testing.T, dir string) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l := loopsUnder(t, dir)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// loopsUnder lists the loop devices attached to a file under dir, as
// /sys/block shows them.
func loopsUnder(t *testing.T, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			out = append(out, strings.Split(f, "/")[3]+": "+strings.TrimSpace(string(b)))
		}
	}
	return out
}

func requireDisks(t *testing.T, o *OCI) {
	t.Helper()
	if o.DiskInMemory() {
		t.Fatal("this host gives sandboxes no disks of their own (no loop devices or mkfs.ext4): see the engine's warning")
	}
}

// TestDiskOfItsOwn: a sandbox's writable layer is an ext4 of its own on a
// loop device, holding at least its disk limit and barely more, its whole
// size allocated on the host; its memory limit is its memory alone; and a
// destroy leaves no loop device, image or mount behind.
func TestDiskOfItsOwn(t *testing.T) {
	cfg := testConfig(t, "disk")
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	requireDisks(t, o)
	const limit = 96 << 20
	spec := runtime.Spec{ID: "disk", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 32 << 20, Pids: 16, DiskBytes: limit}}
	began := time.Now()
	if _, err := o.Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("first create at this size (formats the blank) %s", time.Since(began))
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(o.bundle("disk"), "rw"), &st); err != nil || st.Type != unix.EXT4_SUPER_MAGIC {
		t.Fatalf("writable layer: statfs type %#x, %v; want ext4", st.Type, err)
	}
	u, err := o.Usage(context.Background(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	if u.DiskTotalBytes < limit || u.DiskTotalBytes > limit+limit/1000+256<<10 {
		t.Errorf("the disk holds %d bytes, want %d to %d", u.DiskTotalBytes, limit, limit+limit/1000+256<<10)
	}
	if u.MemoryLimit != 32<<20 {
		t.Errorf("memory limit %d, want %d: the disk is not memory", u.MemoryLimit, 32<<20)
	}
	img := filepath.Join(o.bundle("disk"), diskImage)
	var ist unix.Stat_t
	if err := unix.Stat(img, &ist); err != nil || ist.Blocks*512 < ist.Size || ist.Size < limit {
		t.Errorf("image %s: %d bytes, %d allocated (%v); want all of it allocated", img, ist.Size, ist.Blocks*512, err)
	}
	l := loopsUnder(t, o.bundle("disk"))
	if len(l) != 1 {
		t.Fatalf("loop devices of the sandbox: %v, want one", l)
	}
	// Once started, the device reads and writes the image directly.
	dio := filepath.Join("/sys/block", strings.Split(l[0], ":")[0], "loop/dio")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(dio); strings.TrimSpace(string(b)) == "1" {
			break
		}
		if time.Now().After(deadline) {
			b, err := os.ReadFile(dio)
			t.Fatalf("%s: %q %v, want 1 (direct I/O)", dio, b, err)
		}
	}
	// A second create of the same size copies the blank.
	spec.ID = "again"
	began = time.Now()
	if _, err := o.Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("second create %s", time.Since(began))
	for _, id := range []string{"disk", "again"} {
		if err := o.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		assertGone(t, o, id)
	}
	if l := loopsLeft(t, cfg.StateDir); len(l) > 0 {
		t.Errorf("loop devices left: %v", l)
	}
}

// TestDiskInMemory: with Config.DiskInMemory the writable layer is a
// tmpfs, and the memory limit holds memory plus disk, so that filling
// the disk cannot reach the memory limit.
func TestDiskInMemory(t *testing.T) {
	cfg := testConfig(t, "memdisk")
	cfg.DiskInMemory = true
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if !o.DiskInMemory() {
		t.Fatal("DiskInMemory() = false")
	}
	if _, err := o.Create(context.Background(), runtime.Spec{ID: "mem", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 32 << 20, Pids: 16, DiskBytes: 64 << 20}}); err != nil {
		t.Fatal(err)
	}
	defer o.Destroy(context.Background(), "mem")
	u, err := o.Usage(context.Background(), "mem")
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryLimit != 96<<20 || u.DiskTotalBytes != 64<<20 {
		t.Fatalf("memory limit %d, disk %d; want %d and %d", u.MemoryLimit, u.DiskTotalBytes, 96<<20, 64<<20)
	}
}

// TestSweepDetachesDisks: a process that died leaves its sandboxes'
// disks attached and mounted, one attached but never mounted and not
// set to clear itself (as a crash between attach and mount of a kernel
// that would not clear it leaves it), and a blank being measured; the
// next engine's sweep detaches every loop device and removes every image.
func TestSweepDetachesDisks(t *testing.T) {
	cfg := testConfig(t, "crashdisk")
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	requireDisks(t, crashed)
	// Should the test fail before the survivor swept, one more instance
	// sweeps, and what is still attached is detached.
	t.Cleanup(func() {
		if _, err := os.Stat(crashed.dir); err == nil {
			die(crashed)
			c := cfg
			c.Instance = "sweeper"
			if o, err := New(c); err == nil {
				o.Close()
			}
		}
		unmountUnder(cfg.StateDir)
		for _, l := range loopsUnder(t, cfg.StateDir) {
			if dev, err := os.OpenFile("/dev/"+strings.Split(l, ":")[0], os.O_RDWR, 0); err == nil {
				unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
				dev.Close()
			}
		}
	})
	if _, err := crashed.Create(context.Background(), runtime.Spec{ID: "orphan", RootFS: testutil.TemplateRootFS(t, "python"),
		Limits: runtime.Limits{MemoryBytes: 64 << 20, Pids: 16, DiskBytes: 8 << 20}}); err != nil {
		t.Fatal(err)
	}
	// A half-built sandbox: its image attached, with no autoclear.
	half := crashed.bundle("half")
	if err := os.Mkdir(half, 0o700); err != nil {
		t.Fatal(err)
	}
	img, err := os.Create(filepath.Join(half, diskImage))
	if err != nil {
		t.Fatal(err)
	}
	if err := img.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	dev, err := attach(img, func(n int) error {
		return os.WriteFile(filepath.Join(half, diskLoop), []byte(strconv.Itoa(n)), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), info); err != nil {
		t.Fatal(err)
	}
	img.Close()
	dev.Close()
	// A blank being measured: mounted under the instance's dir.
	measure, err := os.MkdirTemp(crashed.disk.dir, "measure-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.disk.format(filepath.Join(crashed.disk.dir, "x.img"), 8<<20, 4096); err != nil {
		t.Fatal(err)
	}
	mimg, err := os.OpenFile(filepath.Join(crashed.disk.dir, "x.img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mdev, err := attach(mimg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mountExt4(mdev.Name(), measure); err != nil {
		t.Fatal(err)
	}
	mdev.Close()
	mimg.Close()
	// The blank's formatting used a loop device of its own, which the
	// kernel clears after its last close, in its own time: wait for it.
	l := loopsUnder(t, crashed.dir)
	for deadline := time.Now().Add(10 * time.Second); len(l) > 3 && time.Now().Before(deadline); l = loopsUnder(t, crashed.dir) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(l) != 3 {
		t.Fatalf("before the crash: loop devices %v, want 3: the test proves nothing", l)
	}
	die(crashed)

	cfg.Instance = "survivor"
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	assertGone(t, crashed, "orphan")
	assertGone(t, crashed, "half")
	if l := loopsLeft(t, crashed.dir); len(l) > 0 {
		t.Errorf("loop devices left by the dead instance: %v", l)
	}
	if _, err := os.Stat(crashed.dir); err == nil {
		t.Errorf("dead instance dir %s left", crashed.dir)
	}
}

// BenchmarkCreateDisk measures what a disk of its own adds to a create
// and a destroy (a pool miss pays the create): two engines, one keeping
// disks in memory, create and destroy a sandbox of the default limits in
// turn, so that both see the same load. It reports the medians of each
// and of the paired differences (ms).
func BenchmarkCreateDisk(b *testing.B) {
	testutil.RequireRoot(b)
	engines := map[bool]*OCI{}
	for _, inMemory := range []bool{false, true} {
		o, err := New(Config{RuntimePath: testutil.Runc(b), StateDir: testutil.ShortTempDir(b), AgentBin: testutil.AgentBin(b),
			CgroupParent: "sheepfold-test", Instance: "benchdisk", DiskInMemory: inMemory})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { o.Close() })
		engines[inMemory] = o
	}
	if engines[false].DiskInMemory() {
		b.Fatal("no disks of their own on this host")
	}
	spec := runtime.Spec{ID: "bench", RootFS: testutil.TemplateRootFS(b, "python"),
		Limits: runtime.Limits{MemoryBytes: 512 << 20, Pids: 256, DiskBytes: 256 << 20}}
	once := func(o *OCI) (create, destroy float64) {
		began := time.Now()
		if _, err := o.Create(context.Background(), spec); err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		if err := o.Destroy(context.Background(), spec.ID); err != nil {
			b.Fatal(err)
		}
		return float64(created.Sub(began)) / 1e6, float64(time.Since(created)) / 1e6
	}
	once(engines[false]) // the blank
	var own, mem, diff, ownD, memD []float64
	for b.Loop() {
		c1, d1 := once(engines[false])
		c2, d2 := once(engines[true])
		own, mem, diff = append(own, c1), append(mem, c2), append(diff, c1-c2)
		ownD, memD = append(ownD, d1), append(memD, d2)
	}
	b.ReportMetric(median(own), "own-create-ms")
	b.ReportMetric(median(mem), "memory-create-ms")
	b.ReportMetric(median(diff), "paired-diff-ms")
	b.ReportMetric(median(ownD), "own-destroy-ms")
	b.ReportMetric(median(memD), "memory-destroy-ms")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
