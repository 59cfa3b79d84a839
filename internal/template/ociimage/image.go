package ociimage

import (
	"archive/tar"
	"bytes"
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
	// as large as the layers) when Write's writer is not a regular file;
	// empty means os.TempDir().
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

	cw := &countWriter{w: w}
	a := &archive{tw: tar.NewWriter(cw), cw: cw, mtime: opt.Created.Truncate(time.Second), tempDir: opt.TempDir, gzip: opt.Gzip}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			if off, err := f.Seek(0, io.SeekCurrent); err == nil {
				a.file, a.base = f, off
			}
		}
	}
	layoutJSON, err := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	if err != nil {
		return Result{}, err
	}
	a.bytes(v1.ImageLayoutFile, layoutJSON)
	a.dir("blobs/")
	a.dir("blobs/sha256/")

	var res Result
	root, err := a.layer(ctx, func(tw *tar.Writer) (int, error) {
		n, skipped, err := addTree(ctx, tw, opt.RootFS, ids)
		res.Skipped = skipped
		return n, err
	})
	if err != nil {
		return Result{}, fmt.Errorf("layer of %s: %w", opt.RootFS, err)
	}
	res.Layers = append(res.Layers, root)
	history := []v1.History{{Created: &opt.Created, CreatedBy: opt.CreatedBy}}
	if len(opt.Files) > 0 {
		files, err := a.layer(ctx, func(tw *tar.Writer) (int, error) {
			return addFiles(tw, opt.RootFS, ids, opt.Files, opt.Created)
		})
		if err != nil {
			return Result{}, fmt.Errorf("layer of added files: %w", err)
		}
		res.Layers = append(res.Layers, files)
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
	for _, l := range res.Layers {
		img.RootFS.DiffIDs = append(img.RootFS.DiffIDs, l.DiffID)
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
	a.bytes(blobPath(res.Config.Digest), configJSON)
	a.bytes(blobPath(res.Manifest.Digest), manifestJSON)
	a.bytes(v1.ImageIndexFile, indexJSON)
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
// of bytes and dir sticks and makes the calls after it do nothing.
type archive struct {
	tw      *tar.Writer
	cw      *countWriter // under tw: what has been written
	mtime   time.Time
	tempDir string
	gzip    bool
	err     error

	// file, if not nil, is the regular file the archive goes to, from
	// offset base: layers are written to it in place.
	file *os.File
	base int64
}

func (a *archive) header(name string, typ byte, mode, size int64) {
	if a.err != nil {
		return
	}
	a.err = a.tw.WriteHeader(&tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size,
		ModTime: a.mtime})
}

func (a *archive) dir(name string) { a.header(name, tar.TypeDir, 0o755, 0) }

func (a *archive) bytes(name string, b []byte) {
	a.header(name, tar.TypeReg, 0o644, int64(len(b)))
	if a.err == nil {
		_, a.err = a.tw.Write(b)
	}
}

// blockSize is the tar block size: headers are one, contents are padded to
// whole ones.
const blockSize = 512

// layer adds the blob of the layer that fill makes. Its tar header needs
// the blob's size and digest, known once the blob is written: into a
// regular file the blob goes in place after a placeholder block, and the
// header is written over that at the end; into anything else the blob is
// staged in a temporary file first. Both write the same bytes.
func (a *archive) layer(ctx context.Context, fill func(*tar.Writer) (int, error)) (Layer, error) {
	if a.err != nil {
		return Layer{}, a.err
	}
	if err := a.tw.Flush(); err != nil { // the padding of the entry before
		return Layer{}, err
	}
	if a.file != nil {
		start := a.base + a.cw.n
		if _, err := a.cw.Write(make([]byte, blockSize)); err != nil {
			return Layer{}, err
		}
		l, err := writeLayer(a.cw, a.gzip, fill)
		if err != nil {
			return Layer{}, err
		}
		if err := a.pad(l.Size); err != nil {
			return Layer{}, err
		}
		hdr, err := blobHeader(blobPath(l.Digest), l.Size, a.mtime)
		if err != nil {
			return Layer{}, err
		}
		if _, err := a.file.WriteAt(hdr, start); err != nil {
			return Layer{}, err
		}
		return l, nil
	}

	s, err := stageLayer(a.tempDir, a.gzip, fill)
	if err != nil {
		return Layer{}, err
	}
	defer s.close()
	hdr, err := blobHeader(blobPath(s.layer.Digest), s.layer.Size, a.mtime)
	if err != nil {
		return Layer{}, err
	}
	if _, err := a.cw.Write(hdr); err != nil {
		return Layer{}, err
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return Layer{}, err
	}
	n, err := io.CopyBuffer(a.cw, ctxReader{ctx, s.f}, make([]byte, copyBuffer))
	if err != nil {
		return Layer{}, err
	}
	if n != s.layer.Size {
		return Layer{}, fmt.Errorf("staged layer has %d bytes, want %d", n, s.layer.Size)
	}
	return s.layer, a.pad(n)
}

// pad writes the zeros that fill a blob of size bytes up to whole blocks.
func (a *archive) pad(size int64) error {
	if r := size % blockSize; r != 0 {
		_, err := a.cw.Write(make([]byte, blockSize-r))
		return err
	}
	return nil
}

// blobHeader returns the tar header block of a blob: one block, in the GNU
// format, which can give a size of 8 GiB or more without extra records.
func blobHeader(name string, size int64, mtime time.Time) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b) // never closed: only the header is wanted
	err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size,
		ModTime: mtime, Format: tar.FormatGNU})
	if err != nil {
		return nil, err
	}
	if b.Len() != blockSize {
		return nil, fmt.Errorf("tar header of %s takes %d bytes", name, b.Len())
	}
	return b.Bytes(), nil
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
