package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/osthread"
)

const noFollow = unix.O_NOFOLLOW

// hostAptDir is where Build looks for the host's apt sources.
const hostAptDir = "/etc/apt"

// debianKeyring is the keyring debootstrap checks the archive's Release file
// against (--force-check-gpg: no signature, no build).
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// warmPythonScript runs once in the rootfs at build time so the first
// import in a sandbox finds matplotlib's font cache and the bytecode ready.
const warmPythonScript = `import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot, pandas, numpy
`

// Build builds the template def into opt.DataDir, or returns the built one
// unchanged if it is there and opt.Force is false (an existing template
// built with another UIDShift, suite or package list is an ErrStale error).
// On any failure or cancellation nothing of the build is left behind; a
// failed step is a *BuildError carrying the last lines of output.
func Build(ctx context.Context, def Definition, opt BuildOptions) (Info, error) {
	if err := def.validate(); err != nil {
		return Info{}, err
	}
	if opt.DataDir == "" {
		return Info{}, errors.New("build template: no data dir")
	}
	if opt.UIDShift > math.MaxUint32-maxMappedID-1 {
		return Info{}, fmt.Errorf("build template %s: uid shift %d too large", def.Name, opt.UIDShift)
	}
	mirror := opt.Mirror
	if mirror == "" {
		mirror = defaultMirror(hostAptDir, def.Suite)
	}
	if err := validMirror(mirror); err != nil {
		return Info{}, fmt.Errorf("build template %s: %w", def.Name, err)
	}
	dataDir, err := filepath.Abs(opt.DataDir)
	if err != nil {
		return Info{}, fmt.Errorf("build template %s: %w", def.Name, err)
	}
	dir := templatesDir(dataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Info{}, fmt.Errorf("build template %s: %w", def.Name, err)
	}
	unlock, err := lockTemplate(ctx, dir, def.Name)
	if err != nil {
		return Info{}, fmt.Errorf("build template %s: %w", def.Name, err)
	}
	defer unlock()

	if !opt.Force {
		info, err := Get(dataDir, def.Name)
		if err == nil {
			if why := info.mismatch(def, opt.UIDShift); why != "" {
				return Info{}, fmt.Errorf("%w: %s: %s; rebuild it with --force", ErrStale, def.Name, why)
			}
			return info, nil
		}
		if !errors.Is(err, ErrNotBuilt) {
			return Info{}, err
		}
	}

	b := &builder{
		def:    def,
		opt:    opt,
		mirror: mirror,
		dir:    dir,
		log:    newBuildLog(opt.Log),
		prog:   &progress{fn: opt.Progress},
	}
	b.removeLeftovers()
	return b.build(ctx)
}

// builder is one run of Build, after the checks and under the lock.
type builder struct {
	def    Definition
	opt    BuildOptions
	mirror string
	dir    string // <DataDir>/templates
	log    *buildLog
	prog   *progress
}

// fail makes the BuildError of a failed step. A failure caused by the
// context's end wraps the context's error.
func (b *builder) fail(ctx context.Context, step string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return &BuildError{Template: b.def.Name, Step: step, Err: err, Output: b.log.Tail()}
}

func (b *builder) build(ctx context.Context) (info Info, err error) {
	var cu cleanup
	defer func() {
		if cerr := cu.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after build of template %s: %w", b.def.Name, cerr))
		}
	}()
	start := time.Now()

	staging, err := os.MkdirTemp(b.dir, "."+b.def.Name+".build-")
	if err != nil {
		return Info{}, b.fail(ctx, "staging", err)
	}
	cu.add(func() error { return removeStaging(staging) })
	if err := os.Chmod(staging, 0o755); err != nil { // the runtime's users must traverse it
		return Info{}, b.fail(ctx, "staging", err)
	}
	rootfs := filepath.Join(staging, rootfsDir)

	// 1. debootstrap
	b.prog.report("debootstrap", progressDebootstrap)
	b.log.Printf("debootstrap %s (%s) from %s into %s", b.def.Suite, strings.Join(b.def.Packages, ","), b.mirror, rootfs)
	if err := b.debootstrap(ctx, rootfs); err != nil {
		return Info{}, b.fail(ctx, "debootstrap", err)
	}
	// Mounts end with debootstrap's private mount namespace; this is a
	// second line for a debootstrap run without one.
	if err := unmountUnder(staging); err != nil {
		return Info{}, b.fail(ctx, "debootstrap", err)
	}
	b.log.Printf("debootstrap done in %s", time.Since(start).Round(time.Second))
	if err := ctx.Err(); err != nil {
		return Info{}, b.fail(ctx, "configure", err)
	}

	// 2. configure
	b.prog.report("configure", progressConfigure)
	now := time.Now().UTC()
	if err := configureRootfs(rootfs, b.def.Suite, now); err != nil {
		return Info{}, b.fail(ctx, "configure", err)
	}
	if slices.Contains(b.def.Packages, "python3-matplotlib") {
		b.prog.report("warm python caches", progressPython)
		t := time.Now()
		if err := b.warmPython(ctx, rootfs); err != nil {
			return Info{}, b.fail(ctx, "warm python caches", err)
		}
		b.log.Printf("python caches warmed in %s", time.Since(t).Round(time.Millisecond))
	}
	if err := chownTree(filepath.Join(rootfs, sandboxHome), sandboxUID, sandboxGID); err != nil {
		return Info{}, b.fail(ctx, "configure", err)
	}
	b.prog.report("strip setuid bits", progressStrip)
	n, err := stripSetid(rootfs)
	if err != nil {
		return Info{}, b.fail(ctx, "strip setuid bits", err)
	}
	b.log.Printf("removed setuid/setgid bits from %d files", n)

	// 3. shift ownership
	b.prog.report("shift ownership", progressShift)
	t := time.Now()
	size, err := shiftOwnership(ctx, rootfs, b.opt.UIDShift)
	if err != nil {
		return Info{}, b.fail(ctx, "shift ownership", err)
	}
	b.log.Printf("owners shifted by %d in %s; rootfs uses %d MiB", b.opt.UIDShift, time.Since(t).Round(time.Millisecond), size>>20)

	// 4. template.json, then into place
	b.prog.report("install", progressFinish)
	final := filepath.Join(b.dir, b.def.Name)
	info = Info{
		Name:      b.def.Name,
		Path:      filepath.Join(final, rootfsDir),
		Suite:     b.def.Suite,
		Packages:  slices.Clone(b.def.Packages),
		Created:   now,
		SizeBytes: size,
		UIDShift:  b.opt.UIDShift,
		Version:   FormatVersion,
	}
	if err := writeInfo(staging, info); err != nil {
		return Info{}, b.fail(ctx, "install", err)
	}
	if err := syncfs(staging); err != nil {
		return Info{}, b.fail(ctx, "install", err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, b.fail(ctx, "install", err)
	}
	if err := b.install(staging, final); err != nil {
		return Info{}, b.fail(ctx, "install", err)
	}
	cu.release()
	b.prog.report("done", progressTotal)
	b.log.Printf("template %s built in %s", b.def.Name, time.Since(start).Round(time.Second))
	return info, nil
}

// install renames staging to final. An old final is renamed aside first and
// removed once the new one is in place (or renamed back if that fails).
// Once the new template is in place, install does not fail: what is left
// to do is logged.
func (b *builder) install(staging, final string) error {
	aside := ""
	if _, err := os.Lstat(final); err == nil {
		aside = asideName(b.dir, b.def.Name)
		if err := os.Rename(final, aside); err != nil {
			return err
		}
	}
	if err := os.Rename(staging, final); err != nil {
		if aside != "" {
			if rerr := os.Rename(aside, final); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restore old template from %s: %w", aside, rerr))
			}
		}
		return err
	}
	if err := syncDir(b.dir); err != nil {
		b.log.Printf("sync %s: %v", b.dir, err)
	}
	if aside != "" {
		// Sandboxes running on the old tree hold it: the last one's
		// release removes it (hold_linux.go).
		if _, err := removeIfUnused(aside, func() bool { return true }); err != nil {
			b.log.Printf("remove old template %s (the next build retries): %v", aside, err)
		}
	}
	return nil
}

// removeLeftovers removes staging and old directories of this template that
// a builder killed before its cleanup left. Under the lock, any that exist
// are stale.
func (b *builder) removeLeftovers() {
	for _, pat := range []string{".build-*", ".old-*"} {
		dirs, _ := filepath.Glob(filepath.Join(b.dir, "."+b.def.Name+pat))
		for _, d := range dirs {
			var err error
			if pat == ".old-*" {
				_, err = removeIfUnused(d, func() bool { return true }) // a sandbox may run on it
			} else {
				err = removeStaging(d)
			}
			if err != nil {
				b.log.Printf("remove leftover %s: %v", d, err)
			}
		}
	}
}

// commandEnv is the whole environment of the commands a build runs: nothing
// of the server's own environment but a proxy setting.
func commandEnv(extra ...string) []string {
	env := []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C.UTF-8",
		"DEBIAN_FRONTEND=noninteractive",
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, extra...)
}

// commandAttrs puts a build command in its own process group, killed with
// it on cancellation, and (as root) in a private mount namespace, so no
// mount it makes outlives it or shows on the host. Its Pdeathsig needs it
// started through osthread.Kept. Without root nothing can
// mount anyway (and debootstrap refuses to run).
func commandAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS // Go makes / private in it
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
}

// debootstrapPath finds debootstrap, which is in /usr/sbin, often not on a
// user's PATH.
func (b *builder) debootstrapPath() (string, error) {
	if b.opt.debootstrap != "" {
		return b.opt.debootstrap, nil
	}
	if _, err := os.Stat("/usr/sbin/debootstrap"); err == nil {
		return "/usr/sbin/debootstrap", nil
	}
	p, err := exec.LookPath("debootstrap")
	if err != nil {
		return "", fmt.Errorf("debootstrap not found; install it (apt-get install debootstrap): %w", err)
	}
	return p, nil
}

// debootstrap runs debootstrap --variant=minbase into rootfs. It runs in
// --debian-installer mode: its full log comes on stdout/stderr and its
// messages and progress on file descriptor 3.
func (b *builder) debootstrap(ctx context.Context, rootfs string) error {
	exe, err := b.debootstrapPath()
	if err != nil {
		return err
	}
	args := []string{"--debian-installer", "--variant=minbase"}
	if b.opt.debootstrap == "" {
		if _, err := os.Stat(debianKeyring); err != nil {
			return fmt.Errorf("the Debian archive keyring is needed to check the mirror (apt-get install debian-archive-keyring): %w", err)
		}
		args = append(args, "--force-check-gpg", "--keyring="+debianKeyring)
	}
	if len(b.def.Packages) > 0 {
		args = append(args, "--include="+strings.Join(b.def.Packages, ","))
	}
	args = append(args, b.def.Suite, rootfs, b.mirror)

	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = commandEnv("HOME=/root", "TMPDIR=/tmp")
	cmd.Dir = "/"
	cmd.Stdout = b.log
	cmd.Stderr = b.log
	commandAttrs(cmd)
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	cmd.ExtraFiles = []*os.File{pw} // fd 3
	err = osthread.Kept(cmd.Start)  // its Pdeathsig: commandAttrs
	pw.Close()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		diReader(pr, b.prog, b.log)
	}()
	err = cmd.Wait()
	select {
	case <-done:
	case <-time.After(cmd.WaitDelay): // something still holds fd 3 open
		pr.Close()
		<-done
	}
	return err
}

// warmPython imports matplotlib, pandas and numpy once in the rootfs (as
// root, chrooted, with the sandbox user's HOME), writing matplotlib's font
// cache into the user's home. chownTree gives it to the user afterwards.
func (b *builder) warmPython(ctx context.Context, rootfs string) error {
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-c", warmPythonScript)
	cmd.Env = commandEnv("HOME=/"+sandboxHome, "MPLCONFIGDIR=/"+sandboxHome+"/.config/matplotlib")
	cmd.Dir = "/"
	cmd.Stdout = b.log
	cmd.Stderr = b.log
	commandAttrs(cmd)
	cmd.SysProcAttr.Chroot = rootfs
	if err := osthread.Kept(cmd.Start); err != nil { // its Pdeathsig: commandAttrs
		return err
	}
	return cmd.Wait()
}

// chownTree gives dir and everything under it to uid:gid, not following
// symlinks.
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return unix.Lchown(p, uid, gid)
	})
}

// shiftOwnership adds shift to the uid and gid of root and every file under
// it (never following symlinks; hard-linked files once) and returns the
// disk usage of the tree, each inode counted once. chown clears setuid and
// setgid bits of executables; where a file had them, its mode is put back.
// Ids above maxMappedID are refused: the runtime could not map them.
func shiftOwnership(ctx context.Context, root string, shift uint32) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var size int64
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		size += st.Blocks * 512
		if shift == 0 {
			return nil
		}
		if st.Uid > maxMappedID || st.Gid > maxMappedID {
			return fmt.Errorf("%s: owner %d:%d is outside the ids 0..%d the runtime maps", p, st.Uid, st.Gid, maxMappedID)
		}
		if err := unix.Lchown(p, int(st.Uid+shift), int(st.Gid+shift)); err != nil {
			return &fs.PathError{Op: "lchown", Path: p, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK || st.Mode&(unix.S_ISUID|unix.S_ISGID) == 0 {
			return nil // chown changes no mode bits but these
		}
		var after unix.Stat_t
		if err := unix.Lstat(p, &after); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if after.Mode != st.Mode {
			if err := unix.Chmod(p, st.Mode&^unix.S_IFMT); err != nil {
				return &fs.PathError{Op: "chmod", Path: p, Err: err}
			}
		}
		return nil
	})
	return size, err
}

// lockTemplate takes the build lock of template name in dir (the templates
// directory), waiting for it until ctx ends.
func lockTemplate(ctx context.Context, dir, name string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "."+name+".lock"), os.O_RDWR|os.O_CREATE|noFollow, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock template %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another build of template %s: %w", name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// removeStaging unmounts whatever is mounted under dir and removes it. If a
// mount cannot be removed it leaves dir in place: removing through a mount
// (debootstrap can bind host device nodes) would delete host files.
// Use marks template name (or "NAME:TAG") in use by this process until
// release is called: Hold without the Info. Remove refuses a template
// that any process holds (ErrInUse).
func Use(dataDir, name string) (release func(), err error) {
	_, r, err := Hold(dataDir, name)
	if err != nil {
		return nil, err
	}
	return func() { r(true) }, nil
}

// claimUnused takes template name's directory in dir exclusively,
// without waiting: ErrInUse while a sandbox holds it (Hold).
func claimUnused(dir, name string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|unix.O_DIRECTORY, 0) // a link's tree is what Hold holds
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: a running engine (sheepfold serve or run) has sandboxes of it; stop them first", ErrInUse)
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}

func removeStaging(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := unmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// unmountUnder lazily unmounts every mount at or under dir, deepest first,
// and checks that none is left.
func unmountUnder(dir string) error {
	real, err := filepath.EvalSymlinks(dir) // mountinfo has real paths
	if err != nil {
		return err
	}
	mps, err := mountsUnder(real)
	if err != nil || len(mps) == 0 {
		return err
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		// EINVAL: gone already (a parent's detach took it along).
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	left, err := mountsUnder(real)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts remain under %s after unmounting: %s", dir, strings.Join(left, ", "))
	}
	return nil
}

// mountsUnder lists the mount points at or under dir in this process's
// mount namespace (moby's mountinfo parser, which undoes the octal escapes
// of /proc/self/mountinfo paths).
func mountsUnder(dir string) ([]string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}

// syncfs flushes the filesystem holding dir.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
