package template

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// FROM an OCI image: "oci-archive:FILE" (an OCI image layout in a tar, as
// `docker save`'s newer format, `skopeo copy ... oci-archive:` and
// `sheepfold template export` write) or "oci:DIR" (the layout as a
// directory). A relative path is the build context's.
//
// The image's layers are unpacked in order into a base of their own,
// <templates>/.layers/<key>/diff (key: the manifest's digest and the uid
// shift), reused by every build FROM the same image. Each entry is made
// through an os.Root of that directory, so neither a name with .. nor one
// under a symbolic link an earlier entry made lands outside it;
// whiteouts (.wh.NAME, .wh..wh..opq) delete; hard links link inside it;
// device nodes, fifos and sockets are left out. Then the tree gets what
// a template built from Debian packages gets (configureRootfs: the
// sandbox user, hosts and resolver files; no setuid or setgid bits;
// owners shifted by the uid shift). Every blob is checked against its
// digest.

const (
	ociArchivePrefix = "oci-archive:"
	ociDirPrefix     = "oci:"
)

func isImageRef(from string) bool {
	return strings.HasPrefix(from, ociArchivePrefix) || strings.HasPrefix(from, ociDirPrefix)
}

// importImage makes (or finds) the base of an image and returns it as
// an Info whose Path is its tree.
func (b *dfBuilder) importImage(ctx context.Context, ref string) (Info, error) {
	layout := ""
	var cu cleanup
	defer cu.run()
	var pulled ggcrv1.Image
	p := strings.TrimPrefix(strings.TrimPrefix(ref, ociArchivePrefix), ociDirPrefix)
	if IsRegistryRef(ref) {
		img, err := remoteImage(ctx, ref, b.opt.Registries)
		if err != nil {
			return Info{}, err
		}
		if info, ok, err := b.cachedImage(ref, img); err != nil || ok {
			return info, err
		}
		pulled = img
	} else if !filepath.IsAbs(p) {
		if b.opt.Context == "" {
			return Info{}, fmt.Errorf("FROM %s: a relative path needs a build context", ref)
		}
		p = filepath.Join(b.opt.Context, p)
	}
	switch {
	case pulled != nil:
		tmp, err := os.MkdirTemp(filepath.Join(b.dir, layersDir), ".image-")
		if err != nil {
			return Info{}, err
		}
		cu.add(func() error { return os.RemoveAll(tmp) })
		b.log.Printf("FROM %s: pulling", ref)
		if err := pullLayout(pulled, tmp); err != nil {
			return Info{}, fmt.Errorf("FROM %s: pull: %w", ref, err)
		}
		layout = tmp
	case strings.HasPrefix(ref, ociArchivePrefix):
		tmp, err := os.MkdirTemp(filepath.Join(b.dir, layersDir), ".image-")
		if err != nil {
			return Info{}, err
		}
		cu.add(func() error { return os.RemoveAll(tmp) })
		f, err := os.Open(p)
		if err != nil {
			return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
		}
		err = untar(ctx, f, tmp, false)
		f.Close()
		if err != nil {
			return Info{}, fmt.Errorf("FROM %s: unpack the archive: %w", ref, err)
		}
		layout = tmp
	default:
		layout = p
	}
	lr, err := os.OpenRoot(layout)
	if err != nil {
		return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
	}
	defer lr.Close()
	mdesc, manifest, config, err := readImage(lr)
	if err != nil {
		return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
	}
	final, info := b.imageBase(ref, mdesc.Digest.String(), config.Config.Env, config.Config.WorkingDir, config.Config.User)
	if fi, err := os.Lstat(info.Path); err == nil && fi.IsDir() && !b.opt.NoCache {
		b.log.Printf("FROM %s: image %s: cached", ref, mdesc.Digest)
		return info, nil
	}
	b.log.Printf("FROM %s: image %s, %d layers", ref, mdesc.Digest, len(manifest.Layers))
	tmp, err := os.MkdirTemp(filepath.Join(b.dir, layersDir), ".tmp-")
	if err != nil {
		return Info{}, err
	}
	cu.add(func() error { return removeStaging(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Info{}, err
	}
	root := filepath.Join(tmp, diffDir)
	if err := os.Mkdir(root, 0o755); err != nil {
		return Info{}, err
	}
	for i, l := range manifest.Layers {
		if err := unpackLayer(ctx, lr, l, root); err != nil {
			return Info{}, fmt.Errorf("FROM %s: layer %d (%s): %w", ref, i+1, l.Digest, err)
		}
	}
	// The sandbox user's home goes in /home, which minimal images lack.
	if r, err := os.OpenRoot(root); err == nil {
		err = r.MkdirAll("home", 0o755)
		r.Close()
		if err != nil {
			return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
		}
	}
	if err := configureRootfs(root, "stable", time.Now().UTC()); err != nil {
		return Info{}, fmt.Errorf("FROM %s: configure: %w", ref, err)
	}
	if err := chownTree(filepath.Join(root, sandboxHome), sandboxUID, sandboxGID); err != nil {
		return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
	}
	if _, err := stripSetid(root); err != nil {
		return Info{}, err
	}
	if _, err := shiftOwnership(ctx, root, b.opt.UIDShift); err != nil {
		return Info{}, fmt.Errorf("FROM %s: %w", ref, err)
	}
	if err := os.RemoveAll(final); err != nil {
		return Info{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Info{}, err
	}
	return info, nil
}

// imageBase is where the base of the image of manifest digest goes, and
// its Info.
func (b *dfBuilder) imageBase(ref, digest string, env []string, workdir, user string) (string, Info) {
	key := digestOf([]byte(fmt.Sprintf("sheepfold-oci-image-v1\n%s\nshift %d\n", digest, b.opt.UIDShift)))
	final := filepath.Join(b.dir, layersDir, strings.TrimPrefix(key, "sha256:"))
	return final, Info{Name: ref, Path: filepath.Join(final, diffDir), Hash: key, UIDShift: b.opt.UIDShift,
		Env: env, WorkDir: workdir, User: user}
}

// cachedImage finds the base of a registry's image by its manifest
// digest, reading its config (not its layers).
func (b *dfBuilder) cachedImage(ref string, img ggcrv1.Image) (Info, bool, error) {
	if b.opt.NoCache {
		return Info{}, false, nil
	}
	d, err := img.Digest()
	if err != nil {
		return Info{}, false, fmt.Errorf("FROM %s: %w", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Info{}, false, fmt.Errorf("FROM %s: image config: %w", ref, err)
	}
	_, info := b.imageBase(ref, d.String(), cf.Config.Env, cf.Config.WorkingDir, cf.Config.User)
	if fi, err := os.Lstat(info.Path); err != nil || !fi.IsDir() {
		return Info{}, false, nil
	}
	b.log.Printf("FROM %s: image %s: cached", ref, d)
	return info, true, nil
}

// readImage reads an OCI layout's manifest (of this machine's
// architecture when the index offers several) and image config.
func readImage(lr *os.Root) (v1.Descriptor, v1.Manifest, v1.Image, error) {
	var idx v1.Index
	if err := readJSON(lr, "index.json", &idx); err != nil {
		return v1.Descriptor{}, v1.Manifest{}, v1.Image{}, fmt.Errorf("not an OCI image layout: %w", err)
	}
	for depth := 0; ; depth++ {
		if len(idx.Manifests) == 0 || depth > 2 {
			return v1.Descriptor{}, v1.Manifest{}, v1.Image{}, errors.New("the index names no image manifest")
		}
		d := idx.Manifests[0]
		for _, m := range idx.Manifests {
			if m.Platform != nil && m.Platform.Architecture == goruntime.GOARCH && m.Platform.OS == "linux" {
				d = m
				break
			}
		}
		if d.MediaType == v1.MediaTypeImageIndex {
			if err := readBlobJSON(lr, d, &idx); err != nil {
				return v1.Descriptor{}, v1.Manifest{}, v1.Image{}, err
			}
			continue
		}
		var m v1.Manifest
		if err := readBlobJSON(lr, d, &m); err != nil {
			return v1.Descriptor{}, v1.Manifest{}, v1.Image{}, err
		}
		var img v1.Image
		if err := readBlobJSON(lr, m.Config, &img); err != nil {
			return v1.Descriptor{}, v1.Manifest{}, v1.Image{}, err
		}
		return d, m, img, nil
	}
}

func readJSON(lr *os.Root, name string, v any) error {
	b, err := lr.ReadFile(name)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// openBlob opens the blob of d and checks its digest as it is read (the
// check fails the last Read).
func openBlob(lr *os.Root, d v1.Descriptor) (io.ReadCloser, error) {
	if d.Digest.Algorithm() != "sha256" || d.Digest.Validate() != nil {
		return nil, fmt.Errorf("blob digest %q: only sha256 digests", d.Digest)
	}
	f, err := lr.Open(path.Join("blobs", "sha256", d.Digest.Encoded()))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	return &checkedBlob{f: f, h: sha256.New(), want: d.Digest.Encoded()}, nil
}

type checkedBlob struct {
	f    *os.File
	h    hash.Hash
	want string
}

func (c *checkedBlob) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	c.h.Write(p[:n])
	if err == io.EOF && hex.EncodeToString(c.h.Sum(nil)) != c.want {
		return n, fmt.Errorf("blob %s: content does not match its digest", c.want)
	}
	return n, err
}

func (c *checkedBlob) Close() error { return c.f.Close() }

func readBlobJSON(lr *os.Root, d v1.Descriptor, v any) error {
	r, err := openBlob(lr, d)
	if err != nil {
		return err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 4<<20))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// unpackLayer applies one layer blob to root.
func unpackLayer(ctx context.Context, lr *os.Root, d v1.Descriptor, root string) error {
	if strings.Contains(d.MediaType, "zstd") {
		return fmt.Errorf("media type %s: zstd layers are not supported", d.MediaType)
	}
	r, err := openBlob(lr, d)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := untar(ctx, r, root, true); err != nil {
		return err
	}
	// The rest (the tar's padding) is read too, so that the digest is
	// checked whatever the tar reader left.
	_, err = io.Copy(io.Discard, r)
	return err
}

// untar unpacks a tar (gzip or not) into dir through an os.Root; with
// layer, it applies whiteouts and keeps owners (unshifted: the caller
// shifts them), else it is a plain archive of files and directories.
func untar(ctx context.Context, r io.Reader, dir string, layer bool) error {
	r, closeGz, err := MaybeGunzip(r)
	if err != nil {
		return err
	}
	defer closeGz()
	rr, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer rr.Close()
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)[1:] // an absolute name is the root's
		if strings.HasPrefix(path.Clean(h.Name), "../") || path.Clean(h.Name) == ".." {
			return fmt.Errorf("entry %q: outside the root", h.Name)
		}
		if name == "" {
			continue
		}
		if err := untarEntry(rr, tr, h, name, layer); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

func untarEntry(rr *os.Root, tr *tar.Reader, h *tar.Header, name string, layer bool) error {
	dir, base := path.Dir(name), path.Base(name)
	if dir != "." {
		if err := rr.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if layer && strings.HasPrefix(base, ".wh.") {
		if base == ".wh..wh..opq" {
			return emptyDir(rr, dir)
		}
		return rr.RemoveAll(path.Join(dir, strings.TrimPrefix(base, ".wh.")))
	}
	mode := fs.FileMode(h.Mode).Perm()
	if h.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if h.Typeflag != tar.TypeDir {
		if fi, err := rr.Lstat(name); err == nil && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
			if err := rr.RemoveAll(name); err != nil {
				return err
			}
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if fi, err := rr.Lstat(name); err == nil && !fi.IsDir() {
			if err := rr.Remove(name); err != nil {
				return err
			}
		}
		if err := rr.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := rr.Chmod(name, mode); err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := rr.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Chmod(mode); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := rr.Symlink(h.Linkname, name); err != nil {
			return err
		}
	case tar.TypeLink:
		target := path.Clean("/" + h.Linkname)[1:]
		if err := rr.Link(target, name); err != nil {
			return err
		}
		return nil // owner and mode are the target's
	default:
		return nil // devices, fifos: not in a template
	}
	if !layer {
		return nil
	}
	if h.Uid < 0 || h.Gid < 0 || h.Uid > maxMappedID || h.Gid > maxMappedID {
		return fmt.Errorf("owner %d:%d is outside the ids 0..%d the runtime maps", h.Uid, h.Gid, maxMappedID)
	}
	return rr.Lchown(name, h.Uid, h.Gid)
}
