package sandbox

import (
	"context"
	"errors"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/volume"
)

// Volumes in sandboxes.
//
// A sandbox mounts persistent volumes (runtime.Volumes) when it starts,
// each at a path of its own, read-write or read-only; it never gets one
// later. A warm pool member started before anyone asked cannot carry
// them, so a create with volumes always starts a sandbox of its own (the
// pool's miss path).
//
// One writer at a time: a volume mounted read-write by a live sandbox
// (starting, running or paused) is refused to a second read-write mount
// (ERR_VOLUME_IN_USE) unless both asked to share it (VolumeMount.Shared:
// then their writes interleave as two processes' on one filesystem do,
// with no locking beyond the filesystem's own). Readers are never
// refused. A volume mounted by a live sandbox cannot be removed
// (RemoveVolume, ERR_VOLUME_IN_USE). Both are checked by this engine,
// among its own sandboxes: servers sharing a store each keep their
// volumes on their own host.

// MaxVolumeMounts is the most volumes one sandbox mounts.
const MaxVolumeMounts = 8

// VolumeMount is a volume to mount in a sandbox (CreateOptions.Volumes).
type VolumeMount struct {
	Name     string // the caller's name for it, for messages
	ID       string // its runtime id (runtime.VolumeMount.ID)
	Path     string // absolute, clean, not over a system directory (CheckVolumePath)
	ReadOnly bool
	// Shared lets other sandboxes that ask so too mount it read-write
	// at the same time.
	Shared bool
}

// systemDirs may not hold a volume, at or below them: a volume would hide
// the sandbox's programs, its devices and kernel interfaces, or the
// agent (/.sheepfold, /usr/local/bin/sudo).
var systemDirs = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
	"/run", "/sbin", "/sys", "/usr", "/var", "/.sheepfold"}

// wholeDirs may hold a volume below them but not be one: the user's
// homes and the temporary directory.
var wholeDirs = []string{"/", "/home", "/home/user", "/root", "/tmp", "/opt", "/mnt", "/srv", "/media"}

// CheckVolumePath says why p cannot be where a volume is mounted; nil
// when it can: an absolute, clean path of at most 256 bytes, with no ".."
// and no control characters, not a system directory nor below one, not
// one of wholeDirs.
func CheckVolumePath(p string) error {
	switch {
	case p == "":
		return errors.New("the path is empty")
	case len(p) > 256:
		return errors.New("the path is longer than 256 bytes")
	case !strings.HasPrefix(p, "/"):
		return errors.New("the path is not absolute")
	case slices.Contains(strings.Split(p, "/"), ".."):
		return errors.New(`the path holds ".."`)
	case path.Clean(p) != p:
		return errors.New("the path is not clean (a trailing slash, \"//\" or \".\")")
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ',' || r == ':' }):
		return errors.New("the path holds a control character, a comma or a colon")
	case slices.Contains(wholeDirs, p):
		return errors.New("a volume cannot hide this whole directory; mount it below, e.g. " + path.Join(p, "data"))
	}
	for _, d := range systemDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return errors.New("the path is in the system directory " + d)
		}
	}
	return nil
}

// checkVolumes checks a create's volumes: each path (CheckVolumePath),
// none at or below another's, each volume once, at most
// MaxVolumeMounts; and that the runtime keeps volumes.
func (m *Manager) checkVolumes(vols []VolumeMount) error {
	if len(vols) == 0 {
		return nil
	}
	if _, ok := m.cfg.Runtime.(runtime.Volumes); !ok {
		return apierr.New(apierr.NotSupported, "this server's runtime (%s) cannot mount volumes", m.cfg.Runtime.Name())
	}
	if len(vols) > MaxVolumeMounts {
		return apierr.New(apierr.BadRequest, "%d volume mounts; a sandbox mounts at most %d", len(vols), MaxVolumeMounts)
	}
	for i, v := range vols {
		if err := CheckVolumePath(v.Path); err != nil {
			return apierr.New(apierr.BadRequest, "volume %q at %q: %v", v.Name, v.Path, err)
		}
		for _, w := range vols[:i] {
			if w.ID == v.ID {
				return apierr.New(apierr.BadRequest, "volume %q is mounted twice", v.Name)
			}
			if w.Path == v.Path || strings.HasPrefix(v.Path, w.Path+"/") || strings.HasPrefix(w.Path, v.Path+"/") {
				return apierr.New(apierr.BadRequest, "volume mounts at %q and %q overlap", w.Path, v.Path)
			}
		}
	}
	return nil
}

func runtimeVolumes(vols []VolumeMount) []runtime.VolumeMount {
	var out []runtime.VolumeMount
	for _, v := range vols {
		out = append(out, runtime.VolumeMount{ID: v.ID, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}

// volumesFree refuses s's volumes when one is being removed, or mounted
// read-write by a live sandbox while s would write it too and either of
// them did not ask to share it. m.mu is held.
func (m *Manager) volumesFree(s *Sandbox) error {
	for _, v := range s.volumes {
		if m.removing[v.ID] {
			return apierr.New(apierr.VolumeNotFound, "volume %q is being deleted", v.Name)
		}
		if v.ReadOnly {
			continue
		}
		for _, o := range m.sandboxes {
			if o == s {
				continue
			}
			for _, w := range o.volumes {
				if w.ID == v.ID && !w.ReadOnly && !(w.Shared && v.Shared) {
					return apierr.New(apierr.VolumeInUse,
						"volume %q is mounted read-write by sandbox %s: one writer at a time, unless both mount it with shared", v.Name, o.ID)
				}
			}
		}
	}
	return nil
}

// VolumeMounts returns the volumes mounted in the sandbox.
func (s *Sandbox) VolumeMounts() []VolumeMount { return slices.Clone(s.volumes) }

// VolumeUsers lists the live sandboxes that mount volume id.
func (m *Manager) VolumeUsers(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.volumeUsers(id)
}

func (m *Manager) volumeUsers(id string) []string {
	var out []string
	for _, s := range m.sandboxes {
		if slices.ContainsFunc(s.volumes, func(v VolumeMount) bool { return v.ID == id }) {
			out = append(out, s.ID)
		}
	}
	slices.Sort(out)
	return out
}

func (m *Manager) volumes() (runtime.Volumes, error) {
	v, ok := m.cfg.Runtime.(runtime.Volumes)
	if !ok {
		return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) keeps no volumes", m.cfg.Runtime.Name())
	}
	return v, nil
}

// MakeVolume makes volume id of size bytes in the runtime.
func (m *Manager) MakeVolume(ctx context.Context, id string, size int64) error {
	v, err := m.volumes()
	if err != nil {
		return err
	}
	switch err := v.MakeVolume(ctx, id, size); {
	case errors.Is(err, runtime.ErrCapacity):
		return apierr.Wrap(err, apierr.Capacity, "this host has no room for a volume of %d MiB", size>>20)
	case errors.Is(err, runtime.ErrUnsupported):
		return apierr.Wrap(err, apierr.NotSupported, "this server keeps no volumes: %v", err)
	case err != nil:
		return apierr.Wrap(err, apierr.Internal, "could not make the volume")
	}
	return nil
}

// RemoveVolume removes volume id (name is the caller's name for it)
// unless a live sandbox mounts it (ERR_VOLUME_IN_USE); no create mounts
// it while it goes.
func (m *Manager) RemoveVolume(ctx context.Context, id, name string) error {
	v, err := m.volumes()
	if err != nil {
		return err
	}
	m.mu.Lock()
	if users := m.volumeUsers(id); len(users) > 0 {
		m.mu.Unlock()
		return apierr.New(apierr.VolumeInUse, "volume %q is mounted by sandbox %s: kill it first", name, strings.Join(users, ", "))
	}
	if m.removing == nil {
		m.removing = map[string]bool{}
	}
	m.removing[id] = true
	m.mu.Unlock()
	m.stopAttendants(ctx, id)
	defer func() {
		m.mu.Lock()
		delete(m.removing, id)
		m.mu.Unlock()
	}()
	if err := v.RemoveVolume(ctx, id); err != nil {
		return apierr.Wrap(err, apierr.Internal, "could not remove the volume")
	}
	return nil
}

// VolumeUsage reads what volume id holds and can hold, in bytes; size
// is the volume's. A runtime that cannot measure its volumes itself (a
// Kubernetes claim) has them measured by their attendant (attendant.go:
// du, at most usageFresh old; total is then size); ERR_NOT_SUPPORTED
// where neither can.
func (m *Manager) VolumeUsage(ctx context.Context, id string, size int64) (used, total int64, err error) {
	v, err := m.volumes()
	if err != nil {
		return 0, 0, err
	}
	used, total, err = v.VolumeUsage(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrVolumeNotFound):
		return 0, 0, apierr.Wrap(err, apierr.VolumeNotFound, "the volume's storage is gone")
	case errors.Is(err, runtime.ErrUnsupported) && m.attends():
		used, err := m.measure(ctx, id, usageFresh)
		return used, size, err
	case errors.Is(err, runtime.ErrUnsupported):
		return 0, 0, apierr.Wrap(err, apierr.NotSupported, "this server's runtime (%s) does not measure its volumes", m.cfg.Runtime.Name())
	}
	return used, total, err
}

// VolumeFiles are a volume's files without a sandbox: paths from the
// volume's root, regular files and directories only. The host's
// (internal/volume) on a runtime whose host holds its volumes, an
// attendant's (attendant.go) otherwise.
type VolumeFiles interface {
	// Open opens the file at p for reading; its Entry has its size.
	Open(p string) (io.ReadCloser, volume.Entry, error)
	// Write writes r to p whole, at most max bytes (volume.ErrFileTooLong).
	Write(p string, r io.Reader, max int64) (volume.Entry, error)
	// List lists the directory at p, at most max entries (volume.ErrTooMany).
	List(p string, max int) ([]volume.Entry, error)
	// Remove removes the file, symlink or empty directory at p.
	Remove(p string) error
	Close() error
}

// hostFiles are the host's (volume.FS) as VolumeFiles.
type hostFiles struct{ *volume.FS }

func (h hostFiles) Open(p string) (io.ReadCloser, volume.Entry, error) {
	f, e, err := h.FS.Open(p)
	if err != nil {
		return nil, e, err
	}
	return f, e, nil
}

// OpenVolume opens volume id's files (size is its size), from the host on
// a runtime whose host holds its volumes, through its attendant on one
// whose host does not (attendant.go); the caller closes them.
func (m *Manager) OpenVolume(ctx context.Context, id string, size int64) (VolumeFiles, error) {
	if m.attends() {
		return &attendedFiles{m: m, ctx: ctx, vol: id, size: size}, nil
	}
	o, ok := m.cfg.Runtime.(runtime.VolumeOpener)
	if !ok {
		return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) keeps no volumes it can reach", m.cfg.Runtime.Name())
	}
	root, uid, gid, err := o.OpenVolume(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrVolumeNotFound):
		return nil, apierr.Wrap(err, apierr.VolumeNotFound, "the volume's storage is gone")
	case errors.Is(err, runtime.ErrUnsupported):
		return nil, apierr.Wrap(err, apierr.NotSupported, "this server keeps no volumes: %v", err)
	case err != nil:
		return nil, apierr.Wrap(err, apierr.Internal, "could not open the volume")
	}
	return hostFiles{volume.New(root, uid, gid)}, nil
}

// VolumeWriters lists the live sandboxes that mount volume id read-write
// and did not ask to share it.
func (m *Manager) VolumeWriters(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, s := range m.sandboxes {
		if slices.ContainsFunc(s.volumes, func(v VolumeMount) bool { return v.ID == id && !v.ReadOnly && !v.Shared }) {
			out = append(out, s.ID)
		}
	}
	slices.Sort(out)
	return out
}
