package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

var (
	_ runtime.Runtime    = (*OCI)(nil)
	_ runtime.CPUCounter = (*OCI)(nil)
	_ runtime.Resizer    = (*OCI)(nil)
	_ runtime.Devices    = (*OCI)(nil)
	_ runtime.Chooser    = (*OCI)(nil)
)

// OCI runs sandboxes with an OCI runtime binary: runc, or gVisor's runsc
// for those that choose it (runsc_linux.go).
type OCI struct {
	cfg      Config
	cg       *cgroups
	ids      *idRanges
	ns       nsTools
	disk     *disks   // nil: writable layers in memory (Config.DiskInMemory)
	dir      string   // StateDir/Instance
	bundles  string   // dir/sandboxes
	runcDir  string   // dir/runc: the runtime's own --root
	runscDir string   // dir/runsc: runsc's --root (runsc_linux.go)
	lock     *os.File // holds an flock on dir/lock while the instance lives

	quit    chan struct{} // closed by Close: stops the background sweep
	sweeper sync.WaitGroup

	// mu serialises Create and Destroy of the same id.
	mu      sync.Mutex
	pending map[string]bool

	// nsMu guards idmaps: per id range, a user namespace mapping the
	// template's owners (IDMap) to the range, for idmapped template mounts.
	// They are made once per range and kept while the runtime lives.
	nsMu   sync.Mutex
	idmaps map[uint32]*os.File

	cdi      *cdi.Cache // the host's CDI specs (cdi_linux.go)
	kdatOnce sync.Once  // gives CRIU its kernel cache before its first run (kdat_linux.go)
	nftLock  bool       // CRIU locks a dump's network with nftables (netlock_linux.go); set under kdatOnce

	spareKick chan struct{} // capacity 1: "look at the next free slot"
	spareWG   sync.WaitGroup
	// spareMu guards spares (user namespaces made in advance, by the
	// base of their range: spare_linux.go) and the one being made: for
	// the range at making, until madeCh is closed.
	spareMu sync.Mutex
	spares  map[uint32]*nsHolder
	making  uint32
	madeCh  chan struct{}
}

// New checks the configuration and the host, takes the instance's lock,
// sweeps dead instances, and returns a runtime.
func New(cfg Config) (*OCI, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the OCI runtime needs root", runtime.ErrUnsupported)
	}
	for _, p := range []string{cfg.RuntimePath, cfg.AgentBin, cfg.RunscPath} {
		if p == "" {
			continue // no runsc
		}
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%w: %s is not an executable file", runtime.ErrUnsupported, p)
		}
	}
	// runc's init, as the sandbox's root (an unprivileged host uid), must
	// traverse the state dirs to reach its rootfs: 0711 lets it pass
	// through without listing anything. Each bundle is 0710 with the
	// sandbox's own group, so no other host user gets further.
	if err := mkdirs(0o711, cfg.StateDir); err != nil {
		return nil, err
	}
	if err := traversable(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	ids, err := newIDRanges(cfg.IDsDir, cfg.IDMap, cfg.Slots)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	ns, err := findNSTools()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	raiseHostLimits(cfg.Logger)
	o, err := open(cfg, ids, ns)
	if err != nil {
		return nil, err
	}
	if !cfg.DiskInMemory {
		o.disk, err = newDisks(filepath.Join(o.dir, "blanks"), cfg.MinFreeDiskBytes, cfg.Logger)
		if err != nil {
			cfg.Logger.Warn("sandboxes' disks are kept in memory (their memory limit holds memory plus disk)", "err", err)
		}
	}
	o.sweep()
	if err := ids.reclaim(); err != nil {
		cfg.Logger.Warn("reclaim id ranges", "err", err)
	}
	o.spareWG.Go(o.makeSpares)
	o.kickSpares()
	cfg.Logger.Debug("oci runtime ready", "runtime", cfg.RuntimePath, "cgroups", o.cg.mode(), "state", o.dir)
	return o, nil
}

// open locks one instance's directory and returns a runtime for it. A
// concurrent sweep may remove the directory between our mkdir and our
// lock; then the locked file is no longer the one at the path, and we
// start over.
func open(cfg Config, ids *idRanges, ns nsTools) (*OCI, error) {
	root, err := cgroupRoot(cfg.CgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	cg, err := detectCgroups(path.Join(root, cfg.CgroupParent, cfg.Instance)[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrUnsupported, err)
	}
	dir := filepath.Join(cfg.StateDir, cfg.Instance)
	o := &OCI{
		cfg: cfg, cg: cg, ids: ids, ns: ns, dir: dir,
		bundles:  filepath.Join(dir, "sandboxes"),
		runcDir:  filepath.Join(dir, "runc"),
		runscDir: filepath.Join(dir, "runsc"),
		pending:  map[string]bool{}, cdi: cdiCache(cfg.CDISpecDirs),
		idmaps: map[uint32]*os.File{},
		quit:   make(chan struct{}),

		spareKick: make(chan struct{}, 1),
		spares:    map[uint32]*nsHolder{},
	}
	for attempt := 0; ; attempt++ {
		lock, err := lockDir(dir)
		if err != nil {
			if errors.Is(err, ErrLocked) || attempt == 4 {
				return nil, err
			}
			continue
		}
		if err := mkdirs(0o711, o.bundles); err != nil {
			lock.Close()
			return nil, err
		}
		if err := mkdirs(0o700, o.runcDir, o.runscDir); err != nil {
			lock.Close()
			return nil, err
		}
		for _, err := range cg.makeParent() {
			cfg.Logger.Warn("make the instance's cgroup", "err", err)
		}
		o.lock = lock
		return o, nil
	}
}

// lockDir creates dir and takes an exclusive lock on dir/lock.
func lockDir(dir string) (*os.File, error) {
	if err := mkdirs(0o711, dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "lock")
	lock, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%w: state dir %s is in use by another sheepfold process", ErrLocked, dir)
	}
	var held, now unix.Stat_t
	if unix.Fstat(int(lock.Fd()), &held) != nil || unix.Stat(path, &now) != nil || held.Ino != now.Ino {
		lock.Close()
		return nil, errors.New("instance directory was swept while locking")
	}
	return lock, nil
}

// ErrLocked reports an instance directory held by a live process.
var ErrLocked = errors.New("instance locked")

// Bounds of the sweep of dead instances: New waits sweepWait for it at
// most; what is left then, or cannot be destroyed, is swept again in the
// background after sweepRetry, doubling up to a minute (jittered:
// internal/backoff), until nothing is left or Close. Variables, so that
// tests can shorten them.
var (
	sweepWait  = 5 * time.Second
	sweepRetry = 5 * time.Second
)

// sweep destroys what dead instances left behind: every sibling directory
// whose lock can be taken. A crash never keeps New from returning: the
// sweep goes on in the background while anything is left.
func (o *OCI) sweep() {
	first := make(chan struct{})
	o.sweeper.Go(func() {
		left := o.sweepOnce()
		close(first)
		retry := backoff.Backoff{Base: sweepRetry, Max: time.Minute}
		for left > 0 {
			wait := retry.Next()
			o.cfg.Logger.Warn("sandboxes of dead sheepfold processes are left; sweeping again later", "count", left, "retry_in", wait)
			select {
			case <-o.quit:
				return
			case <-time.After(wait):
			}
			left = o.sweepOnce()
		}
	})
	select {
	case <-first:
	case <-time.After(sweepWait):
		o.cfg.Logger.Warn("still sweeping sandboxes of dead sheepfold processes; starting meanwhile")
	}
}

// sweepOnce destroys what every dead instance holds and removes the
// instances it emptied. It returns how many sandboxes are left.
func (o *OCI) sweepOnce() (left int) {
	entries, _ := os.ReadDir(o.cfg.StateDir)
	for _, e := range entries {
		if !e.IsDir() || e.Name() == o.cfg.Instance || !validID(e.Name()) {
			continue
		}
		cfg := o.cfg
		cfg.Instance = e.Name()
		dead, err := open(cfg, o.ids, o.ns)
		if err != nil {
			continue // alive, or not ours
		}
		ids, _ := dead.List(context.Background()) // each destroy also detaches the sandbox's disk
		failed := 0
		for _, id := range ids {
			o.leftover(dead, id)
			o.cfg.Logger.Warn("destroying sandbox left by a dead sheepfold process", "instance", cfg.Instance, "sandbox", id)
			ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
			err := dead.Destroy(ctx, id)
			cancel()
			if err != nil {
				o.cfg.Logger.Error("destroy leftover sandbox", "instance", cfg.Instance, "sandbox", id, "err", err)
				failed++
			}
		}
		left += failed
		// Close leaves a checkpointed sandbox whose destroy failed:
		// then the directory stays too, for the next sweep.
		if err := dead.Close(); err == nil && failed == 0 {
			_ = os.RemoveAll(dead.dir)
		}
	}
	return left
}

// destroyTimeout bounds one destroy of the sweep.
const destroyTimeout = time.Minute

// leftoverTimeout bounds reading a dead instance's sandbox's usage and
// Config.Leftover.
const leftoverTimeout = 10 * time.Second

// leftover tells Config.Leftover of a dead instance's sandbox before the
// sweep destroys it (again at each retry of a destroy that failed: the
// hook charges a sandbox once).
func (o *OCI) leftover(dead *OCI, id string) {
	if o.cfg.Leftover == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), leftoverTimeout)
	defer cancel()
	u, err := dead.Usage(ctx, id)
	o.cfg.Leftover(ctx, id, u, err)
}

// traversable checks that every directory above dir lets other users pass
// through (the x bit for others): runc's init runs as the sandbox's own
// host user and must reach the bundle under dir. Without it every create
// would fail; a server refuses to start instead, saying what to change.
func traversable(dir string) error {
	for d := filepath.Dir(filepath.Clean(dir)); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("sandboxes cannot reach their files under %s: %s (mode %04o) does not let other users pass through; "+
				"make it 0711 (chmod o+x %s) or use another data dir", dir, d, fi.Mode().Perm(), d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

func mkdirs(mode os.FileMode, dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, mode); err != nil {
			return err
		}
		if err := os.Chmod(d, mode); err != nil {
			return err
		}
	}
	return nil
}

// Name implements runtime.Runtime.
func (o *OCI) Name() string { return filepath.Base(o.cfg.RuntimePath) }

// CgroupMode says "v1" or "v2".
func (o *OCI) CgroupMode() string { return o.cg.mode() }

// CgroupPath is the cgroup (a path in each hierarchy) under which this
// instance makes one per sandbox, e.g.
// /system.slice/sheepfold.service/sheepfold/server-1a2b3c4d.
func (o *OCI) CgroupPath() string { return "/" + o.cg.parent }

func (o *OCI) bundle(id string) string { return filepath.Join(o.bundles, id) }

// Create implements runtime.Runtime.
func (o *OCI) Create(ctx context.Context, s runtime.Spec) (inst *runtime.Instance, err error) {
	if !validID(s.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", s.ID)
	}
	flavour, err := o.flavour(s.Runtime)
	if err != nil {
		return nil, err
	}
	if flavour == RuntimeGVisor && len(s.Devices) > 0 {
		// gVisor's Sentry answers the sandbox's system calls: a host
		// device node bound in would reach no driver (docs/security.md §19).
		return nil, fmt.Errorf("%w: a gVisor sandbox is given no devices", runtime.ErrUnsupported)
	}
	if fi, err := os.Stat(filepath.Join(s.RootFS, "usr")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("template root %s is not a root filesystem", s.RootFS)
	}
	if err := o.claim(s.ID); err != nil {
		return nil, err
	}
	defer o.release(s.ID)
	defer o.kickSpares() // a spare may have been taken

	b := o.bundle(s.ID)
	if err := os.Mkdir(b, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %s already exists", s.ID)
		}
		return nil, err
	}
	// Undo everything on failure: destroy knows how to take down a partly
	// built sandbox, in reverse order.
	defer func() {
		if err != nil {
			if derr := o.destroy(context.WithoutCancel(ctx), s.ID); derr != nil {
				o.cfg.Logger.Error("undo failed create", "id", s.ID, "err", derr)
			}
		}
	}()
	if flavour == RuntimeGVisor {
		if err := os.WriteFile(filepath.Join(b, gvisorMarker), nil, 0o600); err != nil {
			return nil, err
		}
	}

	// The sandbox's own host ids, then its bundle opened to them alone:
	// runc's init, as the sandbox's root, passes through to the rootfs.
	base, err := o.ids.allocate(b, o.readySpares()...)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(b, 0, int(base)); err != nil {
		return nil, err
	}
	if err := os.Chmod(b, 0o710); err != nil {
		return nil, err
	}
	if flavour == RuntimeGVisor {
		return o.createRunsc(ctx, s, b, base)
	}
	// The range's namespace first: one made in advance for it is the
	// sandbox's only while nothing else takes it (makeOneSpare drops the
	// spares of ranges no longer free), and mounting the disk takes a
	// while.
	began := time.Now()
	userns, err := o.userns(base)
	if err != nil {
		return nil, err
	}
	defer userns.close()
	nsReady := time.Now()
	rootfs, err := o.mountRoot(b, s, base, nil)
	if err != nil {
		return nil, err
	}
	mounted := time.Now()
	in := specInput{Spec: s, RootFS: rootfs, AgentBin: o.cfg.AgentBin, Writable: filepath.Join(b, "rw"), CgroupDir: o.cg.path(s.ID), Userns: userns.path()}
	if in.Volumes, err = o.attachVolumes(b, s, base); err != nil {
		return nil, err
	}
	if o.disk == nil && canWrite(s) {
		in.DiskInMemory = diskSize(s)
	}
	if s.Network != nil {
		in.ResolvConf = filepath.Join(b, "resolv.conf")
		if err := os.WriteFile(in.ResolvConf, []byte(s.Network.ResolvConf), 0o644); err != nil {
			return nil, err
		}
	}
	// The agent's listening socket, before the spec: the spec names it
	// (a restore hands the restored agent a new one in its place).
	sock, lnFile, err := listenAgent(b)
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()
	in.AgentSocket, err = socketKey(lnFile)
	if err != nil {
		return nil, err
	}
	in.CriuConfig = filepath.Join(b, criuConfig)
	spec, err := buildSpec(in)
	if err != nil {
		return nil, err
	}
	if err := o.injectDevices(spec, s.Devices); err != nil {
		return nil, err
	}
	logf, err := writeBundle(b, spec, base)
	if err != nil {
		return nil, err
	}
	defer logf.Close()

	// The detached sandbox inherits runc's stdio, so all three must be
	// files: a pipe would stay open as long as the sandbox lives. runc's
	// own errors land in the same log. Stdin is the log too (the agent
	// reads none), so that a checkpoint has one host file to stand in
	// for, not two (checkpoint_linux.go).
	// A sandbox with a network is created stopped, given its interface
	// and only then started; one without is run in one step (one runc
	// process fewer).
	extra := []*os.File{lnFile}
	if s.Limits.Pids > 0 {
		pidsDir, err := o.cg.openPids(s.ID)
		if err != nil {
			return nil, err
		}
		defer pidsDir.Close()
		extra = append(extra, pidsDir) // PidsCgroupFD
	}
	pidFile := filepath.Join(b, "init.pid")
	verb := "run"
	args := []string{"--bundle", b, "--pid-file", pidFile, "--preserve-fds", strconv.Itoa(len(extra)), s.ID}
	if s.Network != nil {
		verb = "create"
	} else {
		args = append([]string{"--detach"}, args...)
	}
	cmd := o.runc(ctx, append([]string{verb}, args...)...)
	cmd.ExtraFiles = extra
	cmd.Stdin = logf
	cmd.Stdout = logf
	cmd.Stderr = logf
	ran := time.Now()
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%s %s: %w: %s", o.Name(), verb, err, tail(log))
	}
	const r = 10 * time.Microsecond
	o.cfg.Logger.Debug("sandbox container started", "id", s.ID, "userns", nsReady.Sub(began).Round(r),
		"root", mounted.Sub(nsReady).Round(r), "spec", ran.Sub(mounted).Round(r), "runc", time.Since(ran).Round(r))
	pid, err := readPid(pidFile)
	if err != nil {
		return nil, err
	}
	if s.Network != nil {
		if err := s.Network.Attach(ctx, pid); err != nil {
			return nil, fmt.Errorf("attach the sandbox's network: %w", err)
		}
		if out, err := o.runc(ctx, "start", s.ID).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s start: %w: %s", o.Name(), err, tail(out))
		}
	}
	// Before anyone asks the agent to start a process: it starts none
	// until the tenant's cgroup is there.
	if s.Limits.Pids > 0 {
		if err := o.cg.makeTenant(s.ID, s.Limits.Pids, int(base)); err != nil {
			return nil, err
		}
	}
	return &runtime.Instance{ID: s.ID, Socket: sock, PID: pid}, nil
}

// mountRoot builds the sandbox's root: its disk (disk_linux.go) or, kept
// in memory, a tmpfs of the disk size, holding the overlay's upper and
// work dirs, and the overlay of it over the template, which appears
// through an idmapped mount owned by the sandbox's ids. fill, when set,
// fills the writable layer (rw) before the overlay is mounted over it
// (a clone's files: snapshot_linux.go).
func (o *OCI) mountRoot(b string, s runtime.Spec, base uint32, fill func(rw string) error) (string, error) {
	rw, rootfs := filepath.Join(b, "rw"), filepath.Join(b, "rootfs")
	for _, d := range []string{rw, rootfs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", err
		}
	}
	size := diskSize(s)
	if o.disk != nil && canWrite(s) {
		if err := o.disk.mount(b, rw, size); err != nil {
			return "", err
		}
	} else {
		// Nothing the sandbox can write (only the runtime's own mount
		// points land here), or a disk kept in memory.
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodesFor(size))
		if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return "", fmt.Errorf("mount writable layer: %w", err)
		}
	}
	upper, work := filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	// The upper dir's owner and mode become those of the sandbox's "/":
	// the template root's, shifted into the sandbox's range.
	var st unix.Stat_t
	if err := unix.Stat(s.RootFS, &st); err != nil {
		return "", err
	}
	t := o.cfg.IDMap
	if st.Uid-t.HostID >= t.Size || st.Gid-t.HostID >= t.Size || st.Uid < t.HostID || st.Gid < t.HostID {
		return "", fmt.Errorf("template root %s is owned by %d:%d, outside the template ids %d..%d", s.RootFS, st.Uid, st.Gid, t.HostID, t.HostID+t.Size-1)
	}
	if err := os.Chown(upper, int(base+st.Uid-t.HostID), int(base+st.Gid-t.HostID)); err != nil {
		return "", err
	}
	if err := os.Chmod(upper, os.FileMode(st.Mode&0o7777)); err != nil {
		return "", err
	}
	// The writable paths' contents live beside the overlay on the same
	// disk, so that together they stay within the disk limit. Each is
	// like /tmp: the sandbox's root owns it, anyone may create in it.
	for i := range s.WritablePaths {
		d := writableDir(rw, i)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Chown(d, int(base), int(base)); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o777|os.ModeSticky); err != nil {
			return "", err
		}
	}
	if fill != nil {
		if err := fill(rw); err != nil {
			return "", err
		}
	}
	userns, err := o.idmapUserns(base)
	if err != nil {
		return "", err
	}
	lower, err := idmappedTree(s.RootFS, userns)
	if err != nil {
		return "", err
	}
	defer unix.Close(lower)
	// Kernels before 6.15 refuse a detached mount as an overlay layer
	// (overlayfs clones each layer, and cloning wants a mount of our own
	// namespace: "failed to clone lowerpath"). So the idmapped tree is
	// attached at b/lower while the overlay is mounted; the overlay keeps
	// its own private clone, and the attachment goes again at once.
	at := filepath.Join(b, "lower")
	if err := os.Mkdir(at, 0o700); err != nil {
		return "", err
	}
	if err := unix.MoveMount(lower, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", fmt.Errorf("attach the template's idmapped mount: %w", err)
	}
	// volatile (Linux 5.10): no fsync or syncfs reaches the upper layer,
	// as none reached the tmpfs it replaced. A sandbox's disk never
	// outlives it, so what a sync would keep is thrown away anyway; code
	// that syncs in a loop does not make the host's disk flush, and the
	// overlay's own copy-ups (which sync each file) cost nothing.
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", at, upper, work)
	err = unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl+",volatile")
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl) // before 5.10
	}
	if uerr := unix.Unmount(at, unix.MNT_DETACH); uerr != nil && err == nil {
		err = uerr
	}
	if err != nil {
		return "", fmt.Errorf("mount overlay: %w", err)
	}
	return rootfs, os.Remove(at)
}

// idmapUserns returns a user namespace that maps the template's owners
// (IDMap) onto the range at base, made on first use and kept.
func (o *OCI) idmapUserns(base uint32) (*os.File, error) {
	o.nsMu.Lock()
	defer o.nsMu.Unlock()
	if f := o.idmaps[base]; f != nil {
		return f, nil
	}
	h, err := o.ns.newUserns(0, idRange{Inside: o.cfg.IDMap.HostID, Host: base, Size: o.cfg.IDMap.Size})
	if err != nil {
		return nil, err
	}
	defer h.close()
	f, err := h.open()
	if err != nil {
		return nil, err
	}
	o.idmaps[base] = f
	return f, nil
}

// Destroy implements runtime.Runtime.
func (o *OCI) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return nil
	}
	// A checkpoint, snapshot or restore in flight ends first: what it
	// leaves, running or checkpointed, is destroyed after it.
	if err := o.claimWait(ctx, id); err != nil {
		return err
	}
	defer o.release(id)
	defer o.kickSpares() // a slot may be free
	return o.destroy(ctx, id)
}

// destroy tears a sandbox down in reverse order of creation. Each step
// tolerates the thing being absent, so it also removes half-built and
// orphaned sandboxes.
func (o *OCI) destroy(ctx context.Context, id string) error {
	var errs []error
	// Kill every process at once through the cgroup (see cgroups.kill),
	// then let runc forget the container, if it knows it: it has state
	// once `runc create` got far enough to write it.
	if err := o.cg.kill(id); err != nil {
		errs = append(errs, err)
	}
	// runsc's too, once its Sentry and gofer are dead (a live Sentry
	// busy at its limits can keep `runsc delete` waiting).
	if o.runscState(id) {
		if out, err := o.runsc(ctx, "delete", "--force", id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("runsc delete: %w: %s", err, tail(out)))
		}
	}
	if _, err := os.Stat(filepath.Join(o.runcDir, id, "state.json")); err == nil {
		if out, err := o.runc(ctx, "delete", "--force", id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s delete: %w: %s", o.Name(), err, tail(out)))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := o.cg.remove(id); err != nil {
		errs = append(errs, err)
	}
	// A runc killed in the middle of a restore leaves its bind of the
	// root (criu-root) mounted in its state dir: it would hold the
	// overlay, and the disk under it, after the bundle has gone.
	if err := unmountUnder(filepath.Join(o.runcDir, id)); err != nil {
		errs = append(errs, err)
	}
	b := o.bundle(id)
	// Volumes first: nothing below may remove the bundle over one.
	if err := detachVolumes(b); err != nil {
		errs = append(errs, err)
	}
	for _, m := range []string{filepath.Join(b, "rootfs"), filepath.Join(b, "rw"), filepath.Join(b, runscNetns)} {
		if err := unmount(m); err != nil {
			errs = append(errs, err)
		}
	}
	if err := detachLoop(b); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(filepath.Join(o.runcDir, id)); err != nil {
		errs = append(errs, err)
	}
	// The id range is given back only once nothing of the sandbox runs
	// or is mounted; the bundle goes after it (see ids_linux.go).
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := o.ids.release(b); err != nil {
		return err
	}
	return os.RemoveAll(b)
}

// unmount removes every mount at or below dir; a busy mount is detached.
func unmount(dir string) error {
	for i := 0; i < 8; i++ {
		err := unix.Unmount(dir, 0)
		switch {
		case err == nil:
			continue // there may be a mount stacked under it
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
		default:
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return nil
}

// Usage implements runtime.Runtime.
func (o *OCI) Usage(_ context.Context, id string) (runtime.Usage, error) {
	if !validID(id) {
		return runtime.Usage{}, runtime.ErrNotFound
	}
	u, err := o.cg.usage(id)
	if err != nil {
		return u, err
	}
	if used, total, ok := diskUsage(filepath.Join(o.bundles, id, "rw")); ok {
		u.DiskBytes, u.DiskTotalBytes = used, total
	}
	return u, nil
}

// Resize implements runtime.Resizer: the memory limit through the
// sandbox's cgroup, the writable layer by remounting its tmpfs with the
// new size (the kernel refuses a size below what it holds).
func (o *OCI) Resize(_ context.Context, id string, l runtime.Limits) error {
	if !validID(id) {
		return runtime.ErrNotFound
	}
	b := o.bundle(id)
	rw := filepath.Join(b, "rw")
	var st unix.Statfs_t
	if err := unix.Statfs(rw, &st); err != nil {
		return runtime.ErrNotFound
	}
	// The disk first: it is the one that can be refused (ErrTooSmall,
	// ErrCannotGrow), and a refusal must leave the memory limit as it was.
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC: // a disk of its own (disk_linux.go)
		if l.DiskBytes > 0 {
			if err := o.disk.resize(b, rw, l.DiskBytes); err != nil {
				return err
			}
		}
		if l.MemoryBytes > 0 {
			if err := o.cg.setMemory(id, l.MemoryBytes); err != nil {
				return fmt.Errorf("set the memory limit: %w", err)
			}
		}
	case unix.TMPFS_MAGIC: // a disk in memory: the memory limit holds it too
		disk := int64(st.Blocks) * st.Bsize
		memory := l.MemoryBytes
		if memory <= 0 {
			limit, err := o.cg.memoryLimit(id)
			if err != nil {
				return err
			}
			memory = limit - disk
		}
		if l.DiskBytes > 0 {
			if used := int64(st.Blocks-st.Bfree) * st.Bsize; used > l.DiskBytes {
				return fmt.Errorf("%w: the writable layer holds %d MiB, more than %d MiB", runtime.ErrTooSmall, used>>20, l.DiskBytes>>20)
			}
			opts := fmt.Sprintf("size=%d", l.DiskBytes)
			if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
				return fmt.Errorf("resize the writable layer: %w", err)
			}
			disk = l.DiskBytes
		}
		if err := o.cg.setMemory(id, memory+disk); err != nil {
			return fmt.Errorf("set the memory limit: %w", err)
		}
	default:
		return runtime.ErrNotFound
	}
	return nil
}

// CPUTime implements runtime.CPUCounter.
func (o *OCI) CPUTime(id string) (time.Duration, error) {
	if !validID(id) {
		return 0, runtime.ErrNotFound
	}
	return o.cg.cpuTime(id)
}

// OOMKills implements runtime.OOMCounter.
func (o *OCI) OOMKills(id string) (uint64, error) {
	if !validID(id) {
		return 0, runtime.ErrNotFound
	}
	return o.cg.oomKills(id)
}

// List implements runtime.Runtime: bundles, runtime state and cgroups all
// count, so that a crash between any two steps is still found.
func (o *OCI) List(_ context.Context) ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		if validID(id) && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, dir := range []string{o.bundles, o.runcDir} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			add(e.Name())
		}
	}
	for _, id := range o.cg.listIDs() {
		add(id)
	}
	return ids, nil
}

// Close releases the instance. With no sandbox left it also removes the
// instance's cgroups and directory; otherwise it keeps them for the next
// sweep and says how many sandboxes remain.
func (o *OCI) Close() error {
	defer o.lock.Close()
	o.stopBackground()
	all, err := o.List(context.Background())
	if err != nil {
		return err
	}
	ids := slices.Clone(all)
	// Checkpointed sandboxes (paused) are left to the next engine of
	// this instance, which takes them back (runtime.CheckpointKeeper):
	// their bundles, disks and id ranges stay, and so does the
	// instance's directory.
	ids = slices.DeleteFunc(ids, o.checkpointed)
	kept := len(ids) < len(all)
	if len(ids) > 0 {
		return fmt.Errorf("%d sandboxes still exist", len(ids))
	}
	o.cg.removeParent()
	if kept {
		o.cfg.Logger.Info("checkpointed sandboxes are left for the next start", "count", len(all))
		return nil
	}
	// A dead instance may have died measuring a blank disk.
	if err := unmountUnder(o.dir); err != nil {
		return err
	}
	return os.RemoveAll(o.dir)
}

// DiskInMemory says whether sandboxes' disks are kept in memory (a tmpfs
// charged to the sandbox's memory cgroup, whose limit then holds memory
// plus disk) rather than on disks of their own: admission counts them as
// memory then.
func (o *OCI) DiskInMemory() bool { return o.disk == nil }

// canWrite says whether s can write files: not a read-only root without
// writable paths.
func canWrite(s runtime.Spec) bool { return !s.ReadOnly || len(s.WritablePaths) > 0 }

// diskSize is the size of s's writable layer: its disk limit, or 1 MiB
// where it can write nothing or has no limit.
func diskSize(s runtime.Spec) int64 {
	if !canWrite(s) || s.Limits.DiskBytes <= 0 {
		return 1 << 20
	}
	return s.Limits.DiskBytes
}

// unmountUnder unmounts every mount below dir, deepest first.
func unmountUnder(dir string) error {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return err
	}
	slices.SortFunc(ms, func(a, b *mountinfo.Info) int { return strings.Compare(b.Mountpoint, a.Mountpoint) })
	for _, m := range ms {
		if m.Mountpoint == dir {
			continue
		}
		if err := unmount(m.Mountpoint); err != nil {
			return err
		}
	}
	return nil
}

// stopBackground ends what the runtime runs on its own (the sweep, the
// maker of spare user namespaces) and closes the spares and the idmapped
// template views; the sandboxes and the lock stay.
func (o *OCI) stopBackground() {
	o.stopSweep()
	o.spareWG.Wait()
	o.closeSpares()
	o.nsMu.Lock()
	for base, f := range o.idmaps {
		f.Close()
		delete(o.idmaps, base)
	}
	o.nsMu.Unlock()
}

// stopSweep ends the background sweep (Close; once).
func (o *OCI) stopSweep() {
	select {
	case <-o.quit:
	default:
		close(o.quit)
	}
	o.sweeper.Wait()
}

func (o *OCI) runc(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, o.cfg.RuntimePath, append([]string{"--root", o.runcDir}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

func (o *OCI) claim(id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[id] {
		return fmt.Errorf("sandbox %s is busy", id)
	}
	o.pending[id] = true
	return nil
}

func (o *OCI) release(id string) {
	o.mu.Lock()
	delete(o.pending, id)
	o.mu.Unlock()
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %q", b)
	}
	return pid, nil
}

// tail keeps the end of a runtime's error output for messages.
func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
