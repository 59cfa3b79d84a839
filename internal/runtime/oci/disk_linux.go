package oci

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// A sandbox's disk.
//
// The writable layer of a sandbox (the overlay's upper and work dirs, and
// the writable paths' contents) is an ext4 filesystem of its own: a file
// in its bundle (disk.img, on the data dir's filesystem), attached to a
// loop device and mounted at the bundle's rw. Its size bounds what the
// sandbox can write, by files from code, commands and uploads alike: a
// write past it fails with ENOSPC and nothing else happens. Its pages are
// the page cache of a disk-backed filesystem, charged to the sandbox's
// memory cgroup but written back and reclaimed under its limit, so a full
// disk is never an OOM kill. (A tmpfs, which this replaces, keeps its
// pages in memory that nothing reclaims without swap: a disk larger than
// the memory limit filled the memory first, and the OOM killer ended the
// sandbox with every file in it.)
//
// Each image is made from a blank of its size: an ext4 formatted once per
// disk limit (no journal: an image never outlives its sandbox, and a
// crash discards it; no resize inode; the inode tables left to be read
// as zeros), sized so that the free space a fresh mount reports is at
// least the limit (ext4's metadata and its reserve for delayed
// allocation come on top: about 5 %, 3 % at 8 GiB), and kept under the
// instance's dir.
// A create allocates the whole image first (fallocate: the host's disk is
// reserved for the sandbox, so a full data dir refuses the create with
// ErrCapacity and never fails a write of a running sandbox), then copies
// the blank's few written blocks into it (the rest are holes) and mounts
// it. The loop device is set to clear itself when the filesystem is
// unmounted (LO_FLAGS_AUTOCLEAR) and reads and writes the image with
// direct I/O, so that what the sandbox writes is cached once, in its own
// filesystem's page cache, and not a second time in the image's (with
// both, the sandbox's memory limit held twice its dirty pages, and
// filling 384 MiB under 128 MiB took eight times as long). The blank's
// blocks are copied with direct I/O too: left dirty in the host's page
// cache, each would be written back synchronously at the device's first
// read of it (about 80 ms more per create under load, measured paired;
// copying them buffered and switching the device to direct I/O after the
// start cost about 10 ms more than this). Its number
// is written to the bundle (loop) before it is attached: a destroy, and
// the sweep of a dead instance's sandboxes, detach it even if the process
// that attached it died at any point.

const (
	diskImage = "disk.img" // the image, in the bundle
	diskLoop  = "loop"     // the number of the loop device it is attached to, in the bundle
	diskBlock = 4096       // the filesystem's and the loop device's block size
	// maxBlanks bounds the blanks kept (the least recently used goes).
	maxBlanks = 16
	loopMajor = 7
)

// inodesFor is the number of inodes of a disk of limit bytes: one per 8
// KiB, at least 4096 (as the tmpfs it replaces had).
func inodesFor(limit int64) int64 { return max(limit/8192, 4096) }

// disks makes and attaches sandboxes' disks. A nil *disks keeps writable
// layers in memory (Config.DiskInMemory, or a host without loop devices
// or mkfs.ext4).
type disks struct {
	dir     string // the instance's blanks
	mkfs    string
	reserve int64 // free bytes the data dir keeps after a sandbox's image
	log     *slog.Logger

	// mu guards blanks, by the disk limit each was made for.
	mu     sync.Mutex
	blanks map[int64]*blank
}

// blank is a formatted image for one disk limit.
type blank struct {
	ready chan struct{} // closed once made, or failed
	path  string
	size  int64 // the image's size: at least the limit
	err   error
	used  time.Time // last handed out; guarded by disks.mu
}

// newDisks checks that this host can give sandboxes disks of their own
// (mkfs.ext4, and a loop device that this process may attach) and returns
// their maker; the error says what is missing.
func newDisks(dir string, reserve int64, log *slog.Logger) (*disks, error) {
	mkfs, err := findMkfs()
	if err != nil {
		return nil, err
	}
	if err := probeLoop(); err != nil {
		return nil, err
	}
	if err := mkdirs(0o700, dir); err != nil {
		return nil, err
	}
	return &disks{dir: dir, mkfs: mkfs, reserve: reserve, log: log, blanks: map[int64]*blank{}}, nil
}

// CheckDisks says whether this host lets the engine give sandboxes disks
// of their own: mkfs.ext4, and a loop device this process may attach
// (sheepfold doctor).
func CheckDisks() error {
	if _, err := findMkfs(); err != nil {
		return err
	}
	return probeLoop()
}

// findMkfs finds e2fsprogs' mkfs.ext4.
func findMkfs() (string, error) {
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	return "", errors.New("no mkfs.ext4 (install e2fsprogs)")
}

// probeLoop opens the loop control device and a free loop device, as an
// attach does, and attaches nothing.
func probeLoop() error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("no loop devices (modprobe loop): %w", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return fmt.Errorf("find a free loop device: %w", err)
	}
	dev, err := openLoop(n)
	if err != nil {
		return err
	}
	return dev.Close()
}

// openLoop opens /dev/loopN, making its node where /dev lacks it (a
// container's /dev holds only the devices it was started with).
func openLoop(n int) (*os.File, error) {
	p := "/dev/loop" + strconv.Itoa(n)
	f, err := os.OpenFile(p, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("make %s: %w", p, err)
		}
		f, err = os.OpenFile(p, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open loop device: %w", err)
	}
	return f, nil
}

// attach attaches img to a free loop device, calling record with its
// number first, and returns the device, open: the caller mounts it and
// closes it (the device detaches itself when its last user goes).
func attach(img *os.File, record func(n int) error) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop control: %w", err)
	}
	defer ctl.Close()
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		if record != nil {
			if err := record(n); err != nil {
				return nil, err
			}
		}
		dev, err := openLoop(n)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: diskBlock}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], img.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach %s to loop%d: %w", img.Name(), n, err)
		}
		// Another attach took it between our look and ours.
	}
	return nil, errors.New("attach a loop device: every free one was taken first")
}

// detachLoop detaches the loop device recorded in bundle b if it is still
// attached to b's image (it detaches itself once unmounted; this is for
// one whose process died before it was mounted, or that is still held
// elsewhere, which then detaches when released). Nothing recorded,
// nothing attached, or a device attached to another file: nothing to do.
func detachLoop(b string) error {
	raw, err := os.ReadFile(filepath.Join(b, diskLoop))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || n < 0 {
		return nil // a record cut short by a crash: nothing was attached after it
	}
	img := filepath.Join(b, diskImage)
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return nil
	}
	dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // gone, or never made
	}
	defer dev.Close()
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if err != nil {
		return nil // ENXIO: attached to nothing
	}
	name := string(bytes.TrimRight(info.File_name[:], "\x00"))
	if info.Inode != st.Ino || !strings.HasPrefix(img, name) {
		return nil // another image's now
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach loop%d from %s: %w", n, img, err)
	}
	return nil
}

// mount gives bundle b a disk of limit bytes, mounted at rw.
func (d *disks) mount(b, rw string, limit int64) error {
	src, size, err := d.blank(limit)
	if err != nil {
		return err
	}
	defer src.Close()
	var fs unix.Statfs_t
	if err := unix.Statfs(b, &fs); err != nil {
		return err
	}
	if free := int64(fs.Bavail) * fs.Bsize; free-size < d.reserve {
		return fmt.Errorf("%w: the data dir has %d MiB free; a disk of %d MiB would leave less than %d MiB",
			runtime.ErrCapacity, free>>20, size>>20, d.reserve>>20)
	}
	img, err := os.OpenFile(filepath.Join(b, diskImage), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer img.Close()
	switch err := unix.Fallocate(int(img.Fd()), 0, 0, size); {
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%w: no room on the data dir for a disk of %d MiB", runtime.ErrCapacity, size>>20)
	case errors.Is(err, unix.EOPNOTSUPP):
		// A filesystem that cannot allocate ahead: the image is sparse,
		// and the data dir's free space is checked above only.
		if err := img.Truncate(size); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("allocate the disk image: %w", err)
	}
	// The blank's blocks go straight to the disk (a filesystem without
	// direct I/O takes them through its page cache, and the loop device
	// reads it so too).
	dst, err := os.OpenFile(img.Name(), os.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		dst, err = os.OpenFile(img.Name(), os.O_WRONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return err
	}
	err = copyData(dst, src)
	dst.Close()
	if err != nil {
		return fmt.Errorf("copy the blank disk: %w", err)
	}
	dev, err := attach(img, func(n int) error {
		return os.WriteFile(filepath.Join(b, diskLoop), []byte(strconv.Itoa(n)), 0o600)
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := mountExt4(dev.Name(), rw); err != nil {
		return err
	}
	// As the tmpfs was: only the host's root enters; no lost+found.
	if err := os.Chmod(rw, 0o700); err != nil {
		return err
	}
	return os.Remove(filepath.Join(rw, "lost+found"))
}

// mountExt4 mounts the ext4 on dev at dir; the inode tables are not
// zeroed in the background (the image reads zeros where they lie).
func mountExt4(dev, dir string) error {
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
		return fmt.Errorf("mount the disk: %w", err)
	}
	return nil
}

// copyData copies src's data (not its holes) into dst at the same
// offsets.
func copyData(dst, src *os.File) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	var off int64
	for {
		start, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after off
		}
		if err != nil {
			return err
		}
		end, err := unix.Seek(sfd, start, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for in, out := start, start; in < end; {
			n, err := unix.CopyFileRange(sfd, &in, dfd, &out, int(end-in), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
		}
		off = end
	}
}

// blank returns the blank for limit, open, and the image size; it is
// made on first use.
func (d *disks) blank(limit int64) (*os.File, int64, error) {
	d.mu.Lock()
	bl := d.blanks[limit]
	if bl == nil {
		d.evict()
		bl = &blank{ready: make(chan struct{})}
		d.blanks[limit] = bl
		d.mu.Unlock()
		bl.path, bl.size, bl.err = d.make(limit)
		close(bl.ready)
		d.mu.Lock()
		if bl.err != nil {
			delete(d.blanks, limit) // the next create tries again
		}
	} else {
		d.mu.Unlock()
		<-bl.ready
		d.mu.Lock()
	}
	defer d.mu.Unlock()
	if bl.err != nil {
		return nil, 0, bl.err
	}
	bl.used = time.Now()
	// Opened under mu: an eviction removes the path, never an open file.
	f, err := os.Open(bl.path)
	if err != nil {
		return nil, 0, err
	}
	return f, bl.size, nil
}

// evict removes the least recently used ready blank while maxBlanks or
// more are kept. d.mu is held.
func (d *disks) evict() {
	for len(d.blanks) >= maxBlanks {
		var oldest int64 = -1
		for limit, bl := range d.blanks {
			select {
			case <-bl.ready:
			default:
				continue // being made
			}
			if oldest < 0 || bl.used.Before(d.blanks[oldest].used) {
				oldest = limit
			}
		}
		if oldest < 0 {
			return
		}
		os.Remove(d.blanks[oldest].path)
		delete(d.blanks, oldest)
	}
}

// make formats a blank for limit: an image whose fresh filesystem has at
// least limit bytes free, and at most a little more. Each try formats an
// image and mounts it to ask the kernel what is free (ext4's overhead
// grows with the size in steps: the first estimate is usually right,
// seldom a block group short).
func (d *disks) make(limit int64) (string, int64, error) {
	inodes := inodesFor(limit)
	// Inode tables, bitmaps and descriptors, and the kernel's reserve
	// for delayed allocation (2 %, at most 16 MiB).
	size := roundBlock(limit + inodes*256 + min(limit/50, 16<<20) + limit/64 + 1<<20)
	slack := max(limit/1000, 256<<10) // what more than the limit is kept
	path := filepath.Join(d.dir, strconv.FormatInt(limit, 10)+".img")
	tmp := path + ".tmp"
	best := int64(0)
	for range 6 {
		free, err := d.format(tmp, size, inodes)
		if err != nil {
			os.Remove(tmp)
			return "", 0, err
		}
		switch {
		case free >= limit && free-limit <= slack:
			return path, size, os.Rename(tmp, path)
		case free >= limit:
			if best == 0 || size < best {
				best = size
			}
			size = roundBlock(size - (free - limit) + slack/2)
		default:
			size = roundBlock(size + (limit - free) + diskBlock)
			if best != 0 && size >= best {
				size = best
			}
		}
	}
	// Close enough (a step of the overhead lies between): the smallest
	// that holds the limit.
	if best == 0 {
		os.Remove(tmp)
		return "", 0, fmt.Errorf("format a disk of %d MiB: no size held it", limit>>20)
	}
	if _, err := d.format(tmp, best, inodes); err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	return path, best, os.Rename(tmp, path)
}

func roundBlock(n int64) int64 { return (n + diskBlock - 1) / diskBlock * diskBlock }

// format makes an ext4 of size bytes in the file at path and returns the
// free space a fresh mount of it reports.
func (d *disks) format(path string, size, inodes int64) (int64, error) {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return 0, err
	}
	began := time.Now()
	cmd := exec.Command(d.mkfs, "-q", "-F", "-t", "ext4", "-b", strconv.Itoa(diskBlock), "-I", "256",
		"-N", strconv.FormatInt(inodes, 10), "-m", "0", "-O", "^has_journal,^resize_inode",
		"-E", "lazy_itable_init=1,nodiscard", "-L", "sandbox", path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("mkfs.ext4: %w: %s", err, tail(out))
	}
	formatted := time.Now()
	dev, err := attach(f, nil)
	if err != nil {
		return 0, err
	}
	defer dev.Close()
	at, err := os.MkdirTemp(d.dir, "measure-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(at)
	if err := mountExt4(dev.Name(), at); err != nil {
		return 0, err
	}
	var st unix.Statfs_t
	err = unix.Statfs(at, &st)
	if uerr := unix.Unmount(at, 0); uerr != nil && err == nil {
		err = uerr
	}
	if err != nil {
		return 0, err
	}
	free := int64(st.Bavail) * st.Bsize
	d.log.Debug("formatted a blank disk", "size", size, "free", free, "mkfs", formatted.Sub(began).Round(10*time.Microsecond),
		"measure", time.Since(formatted).Round(10*time.Microsecond))
	return free, nil
}

// diskUsage reads the use and size of a writable layer mounted at rw:
// for an ext4 disk, what its files hold and what they can hold (used plus
// available), the balloon of a lowered limit left out; for a tmpfs, its
// blocks.
func diskUsage(rw string) (used, total int64, ok bool) {
	var st unix.Statfs_t
	if unix.Statfs(rw, &st) != nil {
		return 0, 0, false
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		used = int64(st.Blocks-st.Bfree)*st.Bsize - balloonBytes(rw)
		return used, used + int64(st.Bavail)*st.Bsize, true
	case unix.TMPFS_MAGIC:
		return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Blocks) * st.Bsize, true
	}
	return 0, 0, false
}

// A disk's size while its sandbox runs.
//
// Lowering the limit fills the difference with a balloon: a file at the
// disk's root (rw/.balloon, which no mount shows the sandbox), allocated
// so that what is free is what the new limit leaves; raising it up to what
// the image holds shrinks the balloon again. Raising past the image grows
// the image, the loop device's capacity and then the filesystem online
// (EXT4_IOC_RESIZE_FS), which the kernel allows only to a process with
// CAP_SYS_RESOURCE: a host whose root lacks it (a container, some VMs)
// refuses that raise with runtime.ErrCannotGrow and nothing changes. The
// sandbox's use and size (diskUsage) leave the balloon out.

// diskBalloon is the balloon's name at the disk's root.
const diskBalloon = ".balloon"

// ext4ResizeFS is EXT4_IOC_RESIZE_FS: _IOW('f', 16, __u64), the new size
// in blocks.
const ext4ResizeFS = 0x40086610

// balloonBytes is what the balloon at rw takes (0 without one).
func balloonBytes(rw string) int64 {
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(rw, diskBalloon), &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// resize gives the sandbox of bundle b, whose disk is mounted at rw,
// limit bytes of room: refused with runtime.ErrTooSmall when it holds
// more, with runtime.ErrCannotGrow when the image must grow and the host
// cannot grow it online.
func (d *disks) resize(b, rw string, limit int64) error {
	room := func() (used, capacity int64, err error) {
		var st unix.Statfs_t
		if err := unix.Statfs(rw, &st); err != nil {
			return 0, 0, err
		}
		// What the sandbox holds, and could hold with no balloon.
		bal := balloonBytes(rw)
		used = int64(st.Blocks-st.Bfree)*st.Bsize - bal
		return used, used + bal + int64(st.Bavail)*st.Bsize, nil
	}
	used, capacity, err := room()
	if err != nil {
		return err
	}
	if used > limit {
		return fmt.Errorf("%w: the disk holds %d MiB, more than %d MiB", runtime.ErrTooSmall, used>>20, limit>>20)
	}
	if limit > capacity {
		if err := d.grow(b, rw, limit-capacity); err != nil {
			return err
		}
		if _, capacity, err = room(); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(rw, diskBalloon), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// The balloon is cut to nothing, then allocated to what the limit
	// leaves out: a write of the sandbox in between that takes the room
	// makes the allocation fail, which is ErrTooSmall.
	if err := f.Truncate(0); err != nil {
		return err
	}
	if size := roundBlock(capacity-limit) - diskBlock; size > 0 {
		switch err := unix.Fallocate(int(f.Fd()), 0, 0, size); {
		case errors.Is(err, unix.ENOSPC):
			return fmt.Errorf("%w: the disk filled while it was resized to %d MiB", runtime.ErrTooSmall, limit>>20)
		case err != nil:
			return fmt.Errorf("allocate the disk's balloon: %w", err)
		}
	}
	return nil
}

// grow adds at least more bytes of room to the disk of bundle b: the
// image and its loop device first, then the filesystem.
func (d *disks) grow(b, rw string, more int64) error {
	raw, err := os.ReadFile(filepath.Join(b, diskLoop))
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return fmt.Errorf("the disk's loop device %q: %w", raw, err)
	}
	img, err := os.OpenFile(filepath.Join(b, diskImage), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer img.Close()
	fi, err := img.Stat()
	if err != nil {
		return err
	}
	old := fi.Size()
	// The room and what ext4 keeps for itself on it (as make sizes a
	// blank: inode tables are not added, the inode count stays).
	size := roundBlock(old + more + more/50 + more/64 + 1<<20)
	var fs unix.Statfs_t
	if err := unix.Statfs(b, &fs); err != nil {
		return err
	}
	if free := int64(fs.Bavail) * fs.Bsize; free-(size-old) < d.reserve {
		return fmt.Errorf("%w: the data dir has %d MiB free; %d MiB more disk would leave less than %d MiB",
			runtime.ErrCapacity, free>>20, (size-old)>>20, d.reserve>>20)
	}
	dev, err := openLoop(n)
	if err != nil {
		return err
	}
	defer dev.Close()
	undo := func() {
		img.Truncate(old)
		unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0)
	}
	if err := unix.Fallocate(int(img.Fd()), 0, old, size-old); err != nil {
		img.Truncate(old)
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("%w: no room on the data dir for %d MiB more disk", runtime.ErrCapacity, (size-old)>>20)
		}
		return fmt.Errorf("grow the disk image: %w", err)
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		undo()
		return fmt.Errorf("grow the disk's loop device: %w", err)
	}
	root, err := os.Open(rw)
	if err != nil {
		undo()
		return err
	}
	defer root.Close()
	blocks := uint64(size / diskBlock)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, root.Fd(), ext4ResizeFS, uintptr(unsafe.Pointer(&blocks))); e != 0 {
		var err error = e
		undo()
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("%w: growing a mounted filesystem needs CAP_SYS_RESOURCE, which this server lacks", runtime.ErrCannotGrow)
		}
		return fmt.Errorf("grow the disk's filesystem: %w", err)
	}
	return nil
}
