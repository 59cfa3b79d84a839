package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/volume"
)

// Volumes: an account's named persistent filesystems, each of a size of
// its own, which its sandboxes mount when they start (volume_mounts on
// create, E2B's volumeMounts) and which outlive them and the server. The
// store keeps each account's volumes (owner, name, the runtime's id for
// it, its size); the engine's runtime keeps their contents
// (runtime.Volumes: on this host, an ext4 image of the volume's size
// under the data dir, internal/runtime/oci volume_linux.go). A name is
// looked up within the caller's account only: another account's volume
// is not found (404 ERR_VOLUME_NOT_FOUND), whatever the call.

// VolumeLimits bound the accounts' volumes; zero fields take
// DefaultVolumeLimits'.
type VolumeLimits struct {
	MaxPerAccount int   // volumes per account
	MaxAccountMB  int64 // the sum of an account's volumes' sizes
	MaxVolumeMB   int64 // one volume's size
	DefaultMB     int64 // a volume's size when the request names none
}

// DefaultVolumeLimits are VolumeLimits' defaults.
var DefaultVolumeLimits = VolumeLimits{MaxPerAccount: 16, MaxAccountMB: 20 << 10, MaxVolumeMB: 10 << 10, DefaultMB: 1 << 10}

func (l VolumeLimits) withDefaults() VolumeLimits {
	d := DefaultVolumeLimits
	if l.MaxPerAccount <= 0 {
		l.MaxPerAccount = d.MaxPerAccount
	}
	if l.MaxAccountMB <= 0 {
		l.MaxAccountMB = d.MaxAccountMB
	}
	if l.MaxVolumeMB <= 0 {
		l.MaxVolumeMB = d.MaxVolumeMB
	}
	if l.DefaultMB <= 0 {
		l.DefaultMB = min(d.DefaultMB, l.MaxVolumeMB)
	}
	return l
}

// minVolumeMB is the smallest volume (its filesystem's own needs).
const minVolumeMB = 4

func (s *Server) volumeRoutes(add addFunc) {
	add("POST /v1/volumes", true, s.createVolume)
	add("GET /v1/volumes", true, s.listVolumes)
	add("GET /v1/volumes/{name}", true, s.getVolume)
	add("DELETE /v1/volumes/{name}", true, s.deleteVolume)
	add("GET /v1/volumes/{name}/files", true, s.readVolumeFile)
	add("PUT /v1/volumes/{name}/files", true, s.writeVolumeFile)
	add("DELETE /v1/volumes/{name}/files", true, s.removeVolumeFile)
	add("GET /v1/volumes/{name}/files/list", true, s.listVolumeFiles)
}

// errNoVolumes answers on a server without a store (tests of routes).
var errNoVolumes = apierr.New(apierr.StorageUnavailable, "this server keeps no volumes: it has no store")

func volumeOut(v store.Volume) api.Volume {
	return api.Volume{Name: v.Name, SizeMB: v.SizeBytes >> 20, CreatedAt: v.CreatedAt}
}

func volumeMounts(in []api.VolumeMount) []sandbox.VolumeMount {
	var out []sandbox.VolumeMount
	for _, m := range in {
		out = append(out, sandbox.VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly, Shared: m.Shared})
	}
	return out
}

// apiVolumeMounts is the inverse of volumeMounts, for answers.
func apiVolumeMounts(in []sandbox.VolumeMount) []api.VolumeMount {
	var out []api.VolumeMount
	for _, m := range in {
		out = append(out, api.VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly, Shared: m.Shared})
	}
	return out
}

// checkVolumeName accepts 1 to 64 letters, digits, '.', '_' and '-',
// starting with a letter or digit.
func checkVolumeName(name string) error {
	ok := len(name) >= 1 && len(name) <= 64
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || r != '.' && r != '_' && r != '-') {
			ok = false
		}
	}
	if !ok {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "name"},
			Message: fmt.Sprintf("volume name %q: 1 to 64 letters, digits, '.', '_' and '-', starting with a letter or digit", name)}
	}
	return nil
}

func volumeNotFound(name string) error {
	return apierr.New(apierr.VolumeNotFound, "volume %q not found", name)
}

// volume looks up the caller's volume name.
func (s *Server) volume(ctx context.Context, own, name string) (store.Volume, error) {
	if s.store == nil {
		return store.Volume{}, errNoVolumes
	}
	v, err := s.store.GetVolume(ctx, own, name)
	if errors.Is(err, store.ErrNotFound) {
		return v, volumeNotFound(name)
	}
	return v, err
}

// resolveVolumes gives each of a create's mounts its volume's id, looked
// up in own's volumes.
func (s *Server) resolveVolumes(ctx context.Context, own string, mounts []sandbox.VolumeMount) error {
	for i := range mounts {
		if err := checkVolumeName(mounts[i].Name); err != nil {
			return err
		}
		v, err := s.volume(ctx, own, mounts[i].Name)
		if err != nil {
			return err
		}
		mounts[i].ID = v.ID
		if err := s.overVolume(v, mounts[i]); err != nil {
			return err
		}
	}
	return nil
}

// overVolume refuses a read-write mount of a volume whose last measured
// use is at or past its size. Only a runtime whose storage does not bound
// its volumes lets one get there (a Kubernetes claim of a provisioner
// that does not enforce its request: a hostPath or local volume); the
// figure is the engine's last measurement (sandbox attendant.go: after
// each read-write sandbox stops, each file-API write, each GET of the
// volume). A read-only mount is always let in, so that the data can be
// read, and files are removed through the file API.
func (s *Server) overVolume(v store.Volume, m sandbox.VolumeMount) error {
	if m.ReadOnly {
		return nil
	}
	used, at, ok := s.engine.LastVolumeUse(v.ID)
	if !ok || used < v.SizeBytes {
		return nil
	}
	return &apierr.Error{Code: apierr.DiskFull,
		Details: map[string]any{"volume": v.Name, "used_bytes": used, "size_bytes": v.SizeBytes, "measured_at": at.UTC()},
		Message: fmt.Sprintf("volume %q is full (%d of %d bytes used, measured %s): mount it read-only, or remove files through /v1/volumes/%s/files",
			v.Name, used, v.SizeBytes, at.UTC().Format(time.RFC3339), v.Name)}
}

func newVolumeID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "vol-" + hex.EncodeToString(b)
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	if s.store == nil {
		return errNoVolumes
	}
	var req api.VolumeRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	size := s.cfg.Volumes.DefaultMB
	if req.SizeMB != nil {
		size = *req.SizeMB
	}
	v, err := s.makeVolume(r.Context(), owner(r), req.Name, size)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeOut(v))
	return nil
}

// makeVolume makes own's volume name of size MiB (/v1 and E2B's).
func (s *Server) makeVolume(ctx context.Context, own, name string, size int64) (store.Volume, error) {
	if s.store == nil {
		return store.Volume{}, errNoVolumes
	}
	if err := checkVolumeName(name); err != nil {
		return store.Volume{}, err
	}
	lim := s.cfg.Volumes
	if size < minVolumeMB || size > lim.MaxVolumeMB {
		return store.Volume{}, &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "size_mb"},
			Message: fmt.Sprintf("size_mb must be between %d and %d", minVolumeMB, lim.MaxVolumeMB)}
	}
	v := store.Volume{Owner: own, Name: name, ID: newVolumeID(), SizeBytes: size << 20, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	// The record first: it takes the name and the account's room in one
	// step; the storage after it, and the record goes again if that fails.
	ctx = context.WithoutCancel(ctx)
	switch err := s.store.CreateVolume(ctx, v, lim.MaxPerAccount, lim.MaxAccountMB<<20); {
	case errors.Is(err, store.ErrExists):
		return v, apierr.New(apierr.Conflict, "volume %q already exists", name)
	case errors.Is(err, store.ErrLimit):
		return v, apierr.New(apierr.StorageQuotaExceeded,
			"this account may keep %d volumes of %d MiB in all; delete one to make room", lim.MaxPerAccount, lim.MaxAccountMB)
	case err != nil:
		return v, err
	}
	if err := s.engine.MakeVolume(ctx, v.ID, v.SizeBytes); err != nil {
		if derr := s.store.DeleteVolume(ctx, own, v.Name); derr != nil {
			s.log.Error("forget a volume that could not be made", "volume", v.ID, "err", derr)
		}
		return v, err
	}
	s.log.Info("volume created", "owner", own, "volume", v.ID, "size_mb", size)
	return v, nil
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	if s.store == nil {
		return errNoVolumes
	}
	l, err := s.store.ListVolumes(r.Context(), owner(r))
	if err != nil {
		return err
	}
	out := make([]api.Volume, 0, len(l))
	for _, v := range l {
		out = append(out, volumeOut(v))
	}
	writeJSON(w, http.StatusOK, map[string]any{"volumes": out})
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r.Context(), owner(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	out := volumeOut(v)
	// A runtime that cannot measure its volumes (Kubernetes' claims)
	// leaves the figures out.
	switch used, total, err := s.engine.VolumeUsage(r.Context(), v.ID, v.SizeBytes); {
	case apierr.CodeOf(err) == apierr.NotSupported:
	case err != nil:
		return err
	default:
		out.UsedBytes, out.TotalBytes = &used, &total
	}
	out.MountedBy = s.engine.VolumeUsers(v.ID)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if err := s.removeVolume(r.Context(), owner(r), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// removeVolume deletes own's volume name and its contents (/v1 and
// E2B's).
func (s *Server) removeVolume(ctx context.Context, own, name string) error {
	v, err := s.volume(ctx, own, name)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	if err := s.engine.RemoveVolume(ctx, v.ID, v.Name); err != nil {
		return err
	}
	if err := s.store.DeleteVolume(ctx, own, v.Name); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	s.log.Info("volume deleted", "owner", own, "volume", v.ID)
	return nil
}

// E2B's Volume API (internal/e2b, volumes.go) over the same volumes: a
// volume's E2B id is its name.

var _ e2b.VolumeBackend = e2bBackend{}

// CreateVolume implements e2b.VolumeBackend, at the default size.
func (b e2bBackend) CreateVolume(ctx context.Context, owner, name string) error {
	_, err := b.s.makeVolume(ctx, owner, name, b.s.cfg.Volumes.DefaultMB)
	return err
}

// Volumes implements e2b.VolumeBackend.
func (b e2bBackend) Volumes(ctx context.Context, owner string) ([]string, error) {
	if b.s.store == nil {
		return nil, errNoVolumes
	}
	l, err := b.s.store.ListVolumes(ctx, owner)
	out := make([]string, 0, len(l))
	for _, v := range l {
		out = append(out, v.Name)
	}
	return out, err
}

// Volume implements e2b.VolumeBackend.
func (b e2bBackend) Volume(ctx context.Context, owner, name string) error {
	_, err := b.s.volume(ctx, owner, name)
	return err
}

// DeleteVolume implements e2b.VolumeBackend.
func (b e2bBackend) DeleteVolume(ctx context.Context, owner, name string) error {
	return b.s.removeVolume(ctx, owner, name)
}

// A volume's files without a sandbox: read, write, list and remove
// (sandbox.VolumeFiles). On a host that holds its volumes, by the server
// on the host, confined to the volume by the kernel (internal/volume:
// openat2 RESOLVE_IN_ROOT from the volume's root, no mount crossed,
// regular files only); on Kubernetes through the volume's attendant Pod
// (internal/sandbox attendant.go), whose agent acts as the sandboxes'
// "user". Paths are from the volume's root ("/data/a.csv"; "a.csv" is the
// same). A write is refused while a live sandbox writes the volume
// without sharing it (one writer at a time), and what it makes belongs to
// the sandboxes' "user".

// maxVolumeList bounds a listing of a volume's directory.
const maxVolumeList = 10000

// volumeFiles opens the caller's volume name's files.
func (s *Server) volumeFiles(r *http.Request) (sandbox.VolumeFiles, store.Volume, error) {
	v, err := s.volume(r.Context(), owner(r), r.PathValue("name"))
	if err != nil {
		return nil, v, err
	}
	fsys, err := s.engine.OpenVolume(r.Context(), v.ID, v.SizeBytes)
	return fsys, v, err
}

// volumeFileErr maps internal/volume's errors to the API's.
func volumeFileErr(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, volume.ErrNotFound):
		return apierr.New(apierr.NotFound, "%s: no such file or directory in the volume", p)
	case errors.Is(err, volume.ErrFull):
		return apierr.Wrap(err, apierr.DiskFull, "the volume is full")
	case errors.Is(err, volume.ErrNotEmpty):
		return apierr.New(apierr.Conflict, "%s: the directory is not empty", p)
	case errors.Is(err, volume.ErrIsDir), errors.Is(err, volume.ErrNotDir), errors.Is(err, volume.ErrNotRegular),
		errors.Is(err, volume.ErrBadPath), errors.Is(err, volume.ErrTooMany):
		return apierr.Wrap(err, apierr.BadRequest, "%s: %v", p, err)
	}
	return err
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	fsys, _, err := s.volumeFiles(r)
	if err != nil {
		return err
	}
	defer fsys.Close()
	f, e, err := fsys.Open(p)
	if err != nil {
		return volumeFileErr(p, err)
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
	w.WriteHeader(http.StatusOK)
	io.CopyN(w, f, e.Size)
	return nil
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return s.tooLarge()
	}
	fsys, v, err := s.volumeFiles(r)
	if err != nil {
		return err
	}
	defer fsys.Close()
	if ws := s.engine.VolumeWriters(v.ID); len(ws) > 0 {
		return apierr.New(apierr.VolumeInUse, "volume %q is written by sandbox %s: one writer at a time", v.Name, strings.Join(ws, ", "))
	}
	e, err := fsys.Write(p, r.Body, s.cfg.MaxUploadBytes)
	if errors.Is(err, volume.ErrFileTooLong) {
		return s.tooLarge()
	}
	if err != nil {
		return s.mapUploadErr(volumeFileErr(p, err))
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

func (s *Server) removeVolumeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	fsys, v, err := s.volumeFiles(r)
	if err != nil {
		return err
	}
	defer fsys.Close()
	if ws := s.engine.VolumeWriters(v.ID); len(ws) > 0 {
		return apierr.New(apierr.VolumeInUse, "volume %q is written by sandbox %s: one writer at a time", v.Name, strings.Join(ws, ", "))
	}
	if err := volumeFileErr(p, fsys.Remove(p)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listVolumeFiles(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		p = "/"
	}
	fsys, _, err := s.volumeFiles(r)
	if err != nil {
		return err
	}
	defer fsys.Close()
	l, err := fsys.List(p, maxVolumeList)
	if err != nil {
		return volumeFileErr(p, err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": l})
	return nil
}
