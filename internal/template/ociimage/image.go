package ociimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"runtime"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// AnnotationImageName is the index.json annotation containerd names an
// imported image by (the full reference).
const AnnotationImageName = "io.containerd.image.name"

// DefaultIDs is how many ids a template's shifted range holds (the
// runtime maps 0..65535).
const DefaultIDs = 65536

// ErrOwner: a file in the tree is owned by a host id outside the shifted
// range, which the image has no id for.
var ErrOwner = errors.New("owner outside the shifted ids")

// File is a host file added to the image's second layer, owned by root.
type File struct {
	Path   string      // absolute path in the image, e.g. /.sheepfold/agent
	Source string      // the host file to copy (a regular file; symlinks are followed)
	Mode   fs.FileMode // permission bits, e.g. 0o755
	Links  []string    // further absolute paths in the image that are hard links to it
}

// Options configure Write.
type Options struct {
	// Name is the image name without a tag, e.g.
	// sheepfold.local/template/python.
	Name string
	// Tag is the image's tag; empty means the first 12 hex digits of the
	// manifest's digest.
	Tag string
	// RootFS is the directory packed as the first layer.
	RootFS string
	// The files under RootFS are owned by host ids HostID..HostID+IDs-1,
	// which stand for image ids 0..IDs-1. IDs 0 means DefaultIDs.
	HostID uint32
	IDs    uint32
	// Files are added in a second layer (none: no second layer).
	Files []File
	// Config is the image's execution config (Entrypoint, Env, ...).
	Config v1.ImageConfig
	// Created is the image's creation time (e.g. when the template was
	// built) and the mtime of what the second layer adds; zero means the
	// Unix epoch, so that nothing in the archive depends on when it was
	// written.
	Created time.Time
	// CreatedBy describes the first layer in the image's history.
	CreatedBy string
	// Architecture is the image platform's; empty means runtime.GOARCH.
	Architecture string
	// Gzip compresses the layers (on all cores); uncompressed layers are
	// faster to write and to import.
	Gzip bool
	// TempDir holds the layers while they are written (as unlinked files,
	// as large as the layers); empty means os.TempDir().
	TempDir string
}

// Layer describes one layer written.
type Layer struct {
	v1.Descriptor               // the blob as stored in the archive
	DiffID        digest.Digest // sha256 of the uncompressed tar
	TarSize       int64         // size of the uncompressed tar
	Entries       int           // tar entries
}

// Result describes the image Write wrote.
type Result struct {
	Ref      string        // Name:Tag
	Manifest v1.Descriptor // its digest names the image
	Config   v1.Descriptor
	Layers   []Layer
	Size     int64    // bytes of the archive
	Skipped  []string // paths under RootFS left out (sockets)
}

var (
	// A reference's name: an optional registry host[:port], then
	// lowercase path components (distribution's grammar, simplified).
	nameRE = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)
	tagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ValidTag reports whether tag can be an image's tag.
func ValidTag(tag string) error {
	if !tagRE.MatchString(tag) {
		return fmt.Errorf("invalid image tag %q: want [A-Za-z0-9_][A-Za-z0-9_.-]*, at most 128 characters", tag)
	}
	return nil
}

func (o *Options) validate() error {
	if !nameRE.MatchString(o.Name) || len(o.Name) > 255 {
		return fmt.Errorf("invalid image name %q", o.Name)
	}
	if o.Tag != "" {
		if err := ValidTag(o.Tag); err != nil {
			return err
		}
	}
	if o.RootFS == "" {
		return errors.New("no root filesystem directory")
	}
	if o.IDs == 0 {
		o.IDs = DefaultIDs
	}
	if uint64(o.HostID)+uint64(o.IDs) > 1<<32 {
		return fmt.Errorf("id range %d+%d overflows", o.HostID, o.IDs)
	}
	seen := map[string]bool{}
	for _, f := range o.Files {
		for _, p := range append([]string{f.Path}, f.Links...) {
			if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
				return fmt.Errorf("image path %q is not a clean absolute file path", p)
			}
			if seen[p] {
				return fmt.Errorf("image path %s added twice", p)
			}
			seen[p] = true
		}
		if f.Mode&^fs.ModePerm != 0 {
			return fmt.Errorf("%s: mode %v has more than permission bits", f.Path, f.Mode)
		}
	}
	if o.Architecture == "" {
		o.Architecture = runtime.GOARCH
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	o.Created = o.Created.UTC()
	if o.TempDir == "" {
		o.TempDir = os.TempDir()
	}
	return nil
}

// Write writes the image of opt.RootFS and opt.Files to w as an OCI image
// layout archive. w may be left with part of an archive on error; the
// caller removes it. Cancelling ctx stops the walk and the copy soon.
func Write(ctx context.Context, w io.Writer, opt Options) (Result, error) {
	if err := opt.validate(); err != nil {
		return Result{}, err
	}
	ids := idRange{host: opt.HostID, n: opt.IDs}

	var res Result
	var staged []*stagedLayer
	defer func() {
		for _, s := range staged {
			s.close()
		}
	}()
	root, err := stageLayer(opt.TempDir, opt.Gzip, func(tw *tar.Writer) (int, error) {
		n, skipped, err := addTree(ctx, tw, opt.RootFS, ids)
		res.Skipped = skipped
		return n, err
	})
	if err != nil {
		return Result{}, fmt.Errorf("layer of %s: %w", opt.RootFS, err)
	}
	staged = append(staged, root)
	history := []v1.History{{Created: &opt.Created, CreatedBy: opt.CreatedBy}}
	if len(opt.Files) > 0 {
		files, err := stageLayer(opt.TempDir, opt.Gzip, func(tw *tar.Writer) (int, error) {
			return addFiles(tw, opt.RootFS, ids, opt.Files, opt.Created)
		})
		if err != nil {
			return Result{}, fmt.Errorf("layer of added files: %w", err)
		}
		staged = append(staged, files)
		var paths []string
		for _, f := range opt.Files {
			paths = append(paths, f.Path)
			paths = append(paths, f.Links...)
		}
		history = append(history, v1.History{Created: &opt.Created, CreatedBy: "sheepfold: add " + strings.Join(paths, ", ")})
	}

	img := v1.Image{
		Created:  &opt.Created,
		Platform: v1.Platform{Architecture: opt.Architecture, OS: "linux"},
		Config:   opt.Config,
		RootFS:   v1.RootFS{Type: "layers"},
		History:  history,
	}
	for _, s := range staged {
		res.Layers = append(res.Layers, s.layer)
		img.RootFS.DiffIDs = append(img.RootFS.DiffIDs, s.layer.DiffID)
	}
	configJSON, err := json.Marshal(img)
	if err != nil {
		return Result{}, err
	}
	res.Config = descriptorOf(v1.MediaTypeImageConfig, configJSON)
	manifest := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    res.Config,
	}
	for _, l := range res.Layers {
		manifest.Layers = append(manifest.Layers, l.Descriptor)
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return Result{}, err
	}
	res.Manifest = descriptorOf(v1.MediaTypeImageManifest, manifestJSON)

	tag := opt.Tag
	if tag == "" {
		tag = res.Manifest.Digest.Encoded()[:12]
	}
	res.Ref = opt.Name + ":" + tag
	top := res.Manifest
	top.Platform = &v1.Platform{Architecture: opt.Architecture, OS: "linux"}
	top.Annotations = map[string]string{
		v1.AnnotationRefName: tag, // the OCI layout's convention: the tag alone
		AnnotationImageName:  res.Ref,
	}
	indexJSON, err := json.Marshal(v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{top},
	})
	if err != nil {
		return Result{}, err
	}
	layoutJSON, err := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	if err != nil {
		return Result{}, err
	}

	cw := &countWriter{w: w}
	a := &archive{tw: tar.NewWriter(cw), mtime: opt.Created.Truncate(time.Second)}
	a.file(v1.ImageLayoutFile, layoutJSON)
	a.dir("blobs/")
	a.dir("blobs/sha256/")
	a.file(blobPath(res.Config.Digest), configJSON)
	for _, s := range staged {
		a.copy(ctx, blobPath(s.layer.Digest), s.f, s.layer.Size)
	}
	a.file(blobPath(res.Manifest.Digest), manifestJSON)
	a.file(v1.ImageIndexFile, indexJSON)
	if a.err == nil {
		a.err = a.tw.Close()
	}
	if a.err != nil {
		return Result{}, fmt.Errorf("write archive: %w", a.err)
	}
	res.Size = cw.n
	return res, nil
}

func descriptorOf(mediaType string, b []byte) v1.Descriptor {
	return v1.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

func blobPath(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}

// archive writes the entries of the image layout archive; the first error
// sticks and the calls after it do nothing.
type archive struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func (a *archive) header(name string, typ byte, mode, size int64) {
	if a.err != nil {
		return
	}
	a.err = a.tw.WriteHeader(&tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size,
		ModTime: a.mtime})
}

func (a *archive) dir(name string) { a.header(name, tar.TypeDir, 0o755, 0) }

func (a *archive) file(name string, b []byte) {
	a.header(name, tar.TypeReg, 0o644, int64(len(b)))
	if a.err == nil {
		_, a.err = a.tw.Write(b)
	}
}

// copy adds a blob of size bytes read from f's start.
func (a *archive) copy(ctx context.Context, name string, f *os.File, size int64) {
	a.header(name, tar.TypeReg, 0o644, size)
	if a.err != nil {
		return
	}
	if _, a.err = f.Seek(0, io.SeekStart); a.err != nil {
		return
	}
	n, err := io.CopyBuffer(a.tw, ctxReader{ctx, f}, make([]byte, copyBuffer))
	if err == nil && n != size {
		err = fmt.Errorf("%s: staged blob has %d bytes, want %d", name, n, size)
	}
	a.err = err
}

// copyBuffer is the buffer size for copying file contents.
const copyBuffer = 1 << 20

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// idRange maps host ids host..host+n-1 to image ids 0..n-1.
type idRange struct{ host, n uint32 }

// unshift returns the image id of host id id.
func (r idRange) unshift(id uint32) (uint32, bool) {
	if id < r.host || uint64(id) >= uint64(r.host)+uint64(r.n) {
		return 0, false
	}
	return id - r.host, true
}
