package oci

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Snapshots and clones (runtime.Snapshotter).
//
// A snapshot is a checkpoint that leaves the sandbox running, plus a copy
// of its writable layer, in one directory:
//
//	images/                   CRIU's images and checkpointMeta
//	rw/                       the writable layer: the overlay's upper dir and the writable paths' contents
//	sheepfold-snapshot.json   snapshotInfo: whose, and its host id range
//
// Snapshot freezes the sandbox (runc pause: the cgroup freezer) for the
// whole of it, so that the images and the files are of one moment: CRIU
// dumps the frozen processes and leaves them frozen (--leave-running
// restores the freezer's state it found), the files are copied, and the
// sandbox is thawed. What a snapshot needs of the sandbox is what a
// checkpoint needs (checkpoint_linux.go): no connection to its agent
// open, its network (if any) detached.
//
// A clone is a new sandbox made from a snapshot: a bundle, host id range,
// disk, cgroups and agent socket of its own, as Create makes them, with
// the snapshot's files copied into its writable layer (their owners moved
// from the snapshotted sandbox's range to the clone's) and its processes
// restored from the images. CRIU makes the clone's user namespace from
// the maps it dumped, which name the snapshotted sandbox's host ids: the
// clone restores from a copy of the images (hard links, in its bundle)
// whose user-namespace image maps the clone's own range instead, so that
// no id of the clone is another sandbox's. The images hold no host id
// besides those maps: CRIU records credentials and file owners as the
// sandbox's namespace sees them.
//
// A snapshot of a sandbox with a network (its gateway detached for the
// dump) says so (snapshotInfo.Network): its images hold the resolv.conf
// mount that goes with one. Its clones must be given a network
// (Spec.Network; one without is refused, and a networked clone of a
// snapshot without one): Clone binds the new resolv.conf, restores the
// processes and calls Network.Attach with the restored init's pid, so
// that each clone has a TUN and a gateway of its own. The processes run
// for that moment as a restored sandbox's do (checkpoint_linux.go): with
// no route out.

// Files of a snapshot's directory, and of a clone's bundle.
const (
	snapshotMeta   = "sheepfold-snapshot.json"
	snapshotImages = "images"
	snapshotFiles  = "rw"
	cloneImages    = "clone-images" // in a clone's bundle, while it is restored
)

// snapshotInfo is the record of a snapshot.
type snapshotInfo struct {
	Version int    `json:"version"`           // snapshotVersion
	Sandbox string `json:"sandbox"`           // the snapshotted sandbox's id
	Base    uint32 `json:"base"`              // the host id of its uid 0
	Size    uint32 `json:"size"`              // its range's size
	Taken   string `json:"taken"`             // RFC 3339
	Network bool   `json:"network,omitempty"` // the snapshotted sandbox had a network (detached for the dump)
}

// snapshotVersion changes when a snapshot's layout does.
const snapshotVersion = 1

var _ runtime.Snapshotter = (*OCI)(nil)

// Snapshot implements runtime.Snapshotter. dir must not exist; it is
// removed again when the snapshot fails, and the sandbox runs on either
// way.
func (o *OCI) Snapshot(ctx context.Context, id, dir string) (err error) {
	if !validID(id) {
		return runtime.ErrNotFound
	}
	if err := o.claim(id); err != nil {
		return err
	}
	defer o.release(id)
	b, spec, gid, err := o.dumpable(id, "snapshot")
	if err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if rerr := os.RemoveAll(dir); rerr != nil {
				o.cfg.Logger.Error("remove a failed snapshot", "id", id, "dir", dir, "err", rerr)
			}
		}
	}()
	imgs := filepath.Join(dir, snapshotImages)
	if err := os.Mkdir(imgs, 0o700); err != nil {
		return err
	}
	info, err := o.dumpExternals(id, b, spec)
	if err != nil {
		return err
	}
	// The options name the externals for this dump alone: a bundle with
	// them and no runc state is a checkpointed sandbox's (checkpointed).
	defer os.Remove(filepath.Join(b, criuConfig))

	began := time.Now()
	if _, err := o.quiesce(ctx, id); err != nil { // frozen with no task in a vfork (checkpoint_linux.go)
		return err
	}
	defer func() {
		if out, rerr := o.runc(context.WithoutCancel(ctx), "resume", id).CombinedOutput(); rerr != nil {
			rerr = fmt.Errorf("%s resume: %w: %s", o.Name(), rerr, tail(out))
			o.cfg.Logger.Error("thaw a snapshotted sandbox", "id", id, "err", rerr)
			if err == nil {
				err = rerr
			}
		}
	}()
	if err := o.cutDetached(id, b, spec); err != nil {
		return err
	}
	frozen := time.Now()
	cmd := o.runcCriu(ctx, "checkpoint", "--leave-running", "--image-path", imgs, "--work-path", imgs, "--tcp-established", "--file-locks", id)
	out, err := cmd.CombinedOutput()
	// Nothing CRIU mounted in its work dir may stay (criuRestore).
	if uerr := unmountUnder(imgs); uerr != nil {
		return fmt.Errorf("unmount what CRIU left in %s: %w", imgs, uerr)
	}
	if err != nil {
		return fmt.Errorf("%s checkpoint: %w: %s%s", o.Name(), err, tail(out), criuErrors(filepath.Join(imgs, "dump.log")))
	}
	dumped := time.Now()
	if err := copyLayer(filepath.Join(b, "rw"), filepath.Join(dir, snapshotFiles)); err != nil {
		return fmt.Errorf("snapshot %s: copy its files: %w", id, err)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	info.Checkpointed = now
	if err := writeJSON(filepath.Join(imgs, checkpointMeta), info); err != nil {
		return err
	}
	si := snapshotInfo{Version: snapshotVersion, Sandbox: id, Base: gid, Size: o.cfg.IDMap.Size, Taken: now, Network: hasNetwork(spec)}
	if err := writeJSON(filepath.Join(dir, snapshotMeta), si); err != nil {
		return err
	}
	const r = 10 * time.Microsecond
	o.cfg.Logger.Debug("sandbox snapshotted", "id", id, "dir", dir, "freeze", frozen.Sub(began).Round(r),
		"dump", dumped.Sub(frozen).Round(r), "files", time.Since(dumped).Round(r))
	return nil
}

// Clone implements runtime.Snapshotter. A clone that fails leaves
// nothing behind: no process, mount, cgroup, bundle or id range.
func (o *OCI) Clone(ctx context.Context, s runtime.Spec, dir string) (inst *runtime.Instance, err error) {
	if !validID(s.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", s.ID)
	}
	if s.Network != nil && (s.Network.Proxy || s.Network.Attach == nil) {
		return nil, fmt.Errorf("%w: a clone with a proxied network", runtime.ErrUnsupported)
	}
	if err := o.criuReady(); err != nil {
		return nil, err
	}
	si, info, err := readSnapshot(dir)
	if err != nil {
		return nil, err
	}
	if si.Network != (s.Network != nil) {
		// The images name the resolv.conf mount a network brings, or
		// do not: the clone's spec must be as the snapshotted one's.
		return nil, fmt.Errorf("%w: a clone with a network of a snapshot without one, or without one of a snapshot with one (a policy's network set to none after the sandbox started with one)",
			runtime.ErrUnsupported)
	}
	if si.Size != o.cfg.IDMap.Size {
		return nil, fmt.Errorf("snapshot %s has id ranges of %d ids, this runtime %d", dir, si.Size, o.cfg.IDMap.Size)
	}
	if fi, err := os.Stat(filepath.Join(s.RootFS, "usr")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("template root %s is not a root filesystem", s.RootFS)
	}
	if err := o.claim(s.ID); err != nil {
		return nil, err
	}
	defer o.release(s.ID)
	defer o.kickSpares()

	b := o.bundle(s.ID)
	if err := os.Mkdir(b, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %s already exists", s.ID)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			if derr := o.destroy(context.WithoutCancel(ctx), s.ID); derr != nil {
				o.cfg.Logger.Error("undo failed clone", "id", s.ID, "err", derr)
			}
		}
	}()
	base, err := o.ids.allocate(b)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(b, 0, int(base)); err != nil {
		return nil, err
	}
	if err := os.Chmod(b, 0o710); err != nil {
		return nil, err
	}
	began := time.Now()
	shift := idShift{from: si.Base, to: base, size: si.Size}
	rootfs, err := o.mountRoot(b, s, base, func(rw string) error {
		return fillLayer(rw, filepath.Join(dir, snapshotFiles), shift)
	})
	if err != nil {
		return nil, err
	}
	filled := time.Now()
	in := specInput{Spec: s, RootFS: rootfs, AgentBin: o.cfg.AgentBin, Writable: filepath.Join(b, "rw"), CgroupDir: o.cg.path(s.ID),
		Userns: "restored", CriuConfig: filepath.Join(b, criuConfig)}
	if o.disk == nil && canWrite(s) {
		in.DiskInMemory = diskSize(s)
	}
	if s.Network != nil {
		in.ResolvConf = filepath.Join(b, "resolv.conf")
		if err := os.WriteFile(in.ResolvConf, []byte(s.Network.ResolvConf), 0o644); err != nil {
			return nil, err
		}
	}
	sock, lnFile, err := listenAgent(b)
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()
	if in.AgentSocket, err = socketKey(lnFile); err != nil {
		return nil, err
	}
	spec, err := buildSpec(in)
	if err != nil {
		return nil, err
	}
	// CRIU makes the user namespace (Restore): the spec maps the
	// clone's range rather than naming a namespace to join.
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			spec.Linux.Namespaces[i].Path = ""
		}
	}
	ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: o.cfg.IDMap.Size}}
	spec.Linux.UIDMappings, spec.Linux.GIDMappings = ids, ids
	if err := writeSpec(b, spec); err != nil {
		return nil, err
	}
	imgs := filepath.Join(b, cloneImages)
	if err := linkImages(imgs, filepath.Join(dir, snapshotImages), shift); err != nil {
		return nil, err
	}
	if err := os.Chown(imgs, 0, int(base)); err != nil {
		return nil, err
	}
	if err := os.Chmod(imgs, 0o710); err != nil {
		return nil, err
	}
	pid, err := o.criuRestore(ctx, s.ID, "clone", b, spec, imgs, imgs, info, lnFile, base)
	if err != nil {
		return nil, err
	}
	if s.Network != nil {
		if err := s.Network.Attach(ctx, pid); err != nil {
			return nil, fmt.Errorf("attach the clone's network: %w", err)
		}
	}
	if err := os.RemoveAll(imgs); err != nil {
		o.cfg.Logger.Warn("remove a clone's images", "id", s.ID, "err", err)
	}
	const r = 10 * time.Microsecond
	o.cfg.Logger.Info("sandbox cloned", "id", s.ID, "from", si.Sandbox, "files", filled.Sub(began).Round(r), "restore", time.Since(filled).Round(r))
	return &runtime.Instance{ID: s.ID, Socket: sock, PID: pid}, nil
}

// readSnapshot reads a snapshot's records.
func readSnapshot(dir string) (snapshotInfo, checkpointInfo, error) {
	var si snapshotInfo
	var ci checkpointInfo
	if err := readJSON(filepath.Join(dir, snapshotMeta), &si); err != nil {
		return si, ci, fmt.Errorf("%s is not a complete snapshot: %w", dir, err)
	}
	if si.Version != snapshotVersion {
		return si, ci, fmt.Errorf("snapshot %s has version %d, not %d", dir, si.Version, snapshotVersion)
	}
	if err := readJSON(filepath.Join(dir, snapshotImages, checkpointMeta), &ci); err != nil {
		return si, ci, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	if err := checkpointOf(si.Sandbox, filepath.Join(dir, snapshotImages)); err != nil {
		return si, ci, err
	}
	return si, ci, nil
}

func writeJSON(path string, v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, j, 0o600)
}

func readJSON(path string, v any) error {
	j, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}

// copyLayer copies a sandbox's writable layer (rw: the overlay's upper
// dir, the writable paths' contents) to dst, owners, modes, times,
// extended attributes (the overlay's own: opaque dirs, redirects) and
// whiteouts (0:0 character devices) kept, holes kept. The overlay's work
// dir and the filesystem's lost+found are not the sandbox's files.
func copyLayer(rw, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(rw)
	if err != nil {
		return err
	}
	args := []string{"-a", "--sparse=always", "--"}
	for _, e := range ents {
		if e.Name() == "work" || e.Name() == "lost+found" {
			continue
		}
		args = append(args, filepath.Join(rw, e.Name()))
	}
	if len(args) == 3 {
		return nil
	}
	args = append(args, dst+"/")
	return runCp(args...)
}

func runCp(args ...string) error {
	cmd := exec.Command("cp", args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %w: %s", err, tail(out))
	}
	return nil
}

// idShift moves host ids from one sandbox's range to another's.
type idShift struct{ from, to, size uint32 }

// id returns id moved, and whether it was in the range moved from.
func (s idShift) id(id uint32) (uint32, bool) {
	if id < s.from || id-s.from >= s.size {
		return id, false
	}
	return id - s.from + s.to, true
}

// fillLayer fills a new writable layer (rw, whose upper dir Create's
// mountRoot has made) with a snapshot's copy (src), every owner moved
// into the new range.
func fillLayer(rw, src string, shift idShift) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		args := []string{"-a", "--sparse=always", "--"}
		for _, e := range ents {
			args = append(args, filepath.Join(src, e.Name()))
		}
		if err := runCp(append(args, rw+"/")...); err != nil {
			return err
		}
	}
	return filepath.WalkDir(rw, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == rw {
			return nil
		}
		if d.IsDir() && (d.Name() == "work" || d.Name() == "lost+found") && filepath.Dir(path) == rw {
			return fs.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		uid, uok := shift.id(st.Uid)
		gid, gok := shift.id(st.Gid)
		if !uok && !gok {
			return nil
		}
		// lchown clears set-user-ID and set-group-ID bits: they are
		// put back.
		if err := unix.Lchown(path, int(uid), int(gid)); err != nil {
			return fmt.Errorf("chown %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(path, st.Mode&0o7777); err != nil {
				return err
			}
		}
		return nil
	})
}

// linkImages makes dst a copy of a snapshot's images (src) for a clone:
// hard links (copies across filesystems), but for the user-namespace
// images, rewritten with shift (userns).
func linkImages(dst, src string, shift idShift) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	rewrote := 0
	for _, e := range ents {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if !e.Type().IsRegular() {
			continue
		}
		if strings.HasPrefix(e.Name(), "userns-") && strings.HasSuffix(e.Name(), ".img") {
			if err := shiftUserns(to, from, shift); err != nil {
				return fmt.Errorf("%s: %w", e.Name(), err)
			}
			rewrote++
			continue
		}
		if err := os.Link(from, to); err != nil {
			if err := copyFile(to, from); err != nil {
				return err
			}
		}
	}
	if rewrote == 0 {
		return fmt.Errorf("snapshot images %s hold no user namespace", src)
	}
	return nil
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// shiftUserns writes to dst CRIU's user-namespace image src with every
// host id of its maps moved by shift. The image is two magic words and
// one entry: its length (little-endian 32 bits) and a UsernsEntry
// (criu/images/userns.proto: repeated UidGidExtent uid_map = 1, gid_map
// = 2; UidGidExtent: first = 1, lower_first = 2, count = 3), whose
// lower_first is the host id. A map of an id outside the range moved
// from is refused: a clone would share it.
func shiftUserns(dst, src string, shift idShift) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if len(b) < 12 {
		return errors.New("too short")
	}
	n := binary.LittleEndian.Uint32(b[8:12])
	if int(n) != len(b)-12 {
		return fmt.Errorf("an entry of %d bytes in %d", n, len(b)-12)
	}
	var entry []byte
	extents := 0
	for rest := b[12:]; len(rest) > 0; {
		num, typ, l := protowire.ConsumeTag(rest)
		if l < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return fmt.Errorf("unexpected field %d (type %d)", num, typ)
		}
		rest = rest[l:]
		ext, l := protowire.ConsumeBytes(rest)
		if l < 0 {
			return protowire.ParseError(l)
		}
		rest = rest[l:]
		moved, err := shiftExtent(ext, shift)
		if err != nil {
			return err
		}
		entry = protowire.AppendTag(entry, num, protowire.BytesType)
		entry = protowire.AppendBytes(entry, moved)
		extents++
	}
	if extents == 0 {
		return errors.New("no id maps")
	}
	out := append([]byte(nil), b[:8]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
	return os.WriteFile(dst, append(out, entry...), 0o600)
}

// shiftExtent moves one UidGidExtent's host id.
func shiftExtent(ext []byte, shift idShift) ([]byte, error) {
	var out []byte
	var lower, count uint64
	seen := 0
	for len(ext) > 0 {
		num, typ, l := protowire.ConsumeTag(ext)
		if l < 0 || typ != protowire.VarintType {
			return nil, fmt.Errorf("unexpected extent field %d (type %d)", num, typ)
		}
		ext = ext[l:]
		v, l := protowire.ConsumeVarint(ext)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		ext = ext[l:]
		switch num {
		case 2:
			lower = v
			seen++
		case 3:
			count = v
		}
		out = protowire.AppendTag(out, num, protowire.VarintType)
		if num == 2 {
			moved, ok := shift.id(uint32(v))
			if !ok {
				return nil, fmt.Errorf("host id %d is outside the snapshotted sandbox's range", v)
			}
			v = uint64(moved)
		}
		out = protowire.AppendVarint(out, v)
	}
	if seen != 1 || lower+count > uint64(shift.from)+uint64(shift.size) {
		return nil, fmt.Errorf("an id map of %d ids from %d leaves the snapshotted sandbox's range", count, lower)
	}
	return out, nil
}
