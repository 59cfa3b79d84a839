package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

const testShift = 1_000_000

// node is one file of a test tree, with its in-image owner.
type node struct {
	path     string
	kind     byte // tar type: TypeReg, TypeDir, TypeSymlink, TypeLink, TypeChar, TypeFifo
	mode     int64
	uid, gid int
	content  string // file content, symlink or hard link target
	major    int64
	minor    int64
}

// testTree is the fake template: every kind of file a rootfs has.
var testTree = []node{
	{path: "bin", kind: tar.TypeSymlink, content: "usr/bin"},
	{path: "dev", kind: tar.TypeDir, mode: 0o755},
	{path: "dev/null", kind: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
	{path: "empty", kind: tar.TypeDir, mode: 0o700},
	{path: "etc", kind: tar.TypeDir, mode: 0o755},
	{path: "etc/note", kind: tar.TypeReg, mode: 0o644, content: "has a user xattr\n"},
	{path: "etc/passwd", kind: tar.TypeReg, mode: 0o644, content: "root:x:0:0::/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"},
	{path: "etc/shadow", kind: tar.TypeReg, mode: 0o640, gid: 42, content: "root:*:1::::::\n"},
	{path: "home", kind: tar.TypeDir, mode: 0o755},
	{path: "home/user", kind: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
	{path: "home/user/.bashrc", kind: tar.TypeReg, mode: 0o644, uid: 1000, gid: 1000, content: "PS1='$ '\n"},
	{path: "home/user/" + strings.Repeat("long-name-", 12), kind: tar.TypeReg, mode: 0o600, uid: 1000, gid: 1000, content: "a path over 100 bytes"},
	{path: "run", kind: tar.TypeDir, mode: 0o755},
	{path: "run/fifo", kind: tar.TypeFifo, mode: 0o620},
	{path: "tmp", kind: tar.TypeDir, mode: 0o1777},
	{path: "usr", kind: tar.TypeDir, mode: 0o755},
	{path: "usr/bin", kind: tar.TypeDir, mode: 0o755},
	{path: "usr/bin/ping", kind: tar.TypeReg, mode: 0o755, content: "\x7fELF ping"},
	{path: "usr/bin/su", kind: tar.TypeReg, mode: 0o4755, content: "\x7fELF su"},
	{path: "usr/bin/tool", kind: tar.TypeReg, mode: 0o755, content: "\x7fELF tool"},
	{path: "usr/bin/tool2", kind: tar.TypeLink, content: "usr/bin/tool"},
	{path: "usr/bin/wall", kind: tar.TypeReg, mode: 0o2755, gid: 5, content: "\x7fELF wall"},
	{path: "usr/local", kind: tar.TypeDir, mode: 0o755},
	{path: "usr/local/bin", kind: tar.TypeDir, mode: 0o775, gid: 50},
}

// treeMtime is every test file's mtime: sub-second, which the layer drops.
var treeMtime = time.Date(2026, 12, 4, 14, 47, 1, 500_000_000, time.UTC)

// pingCaps is a revision 2 security.capability of cap_net_raw, effective.
var pingCaps = func() []byte {
	b := make([]byte, capSize2)
	binary.LittleEndian.PutUint32(b, capRevision2|1)
	binary.LittleEndian.PutUint32(b[4:], 1<<13)
	return b
}()

// makeTree builds testTree under root with owners shifted by shift, as a
// template build leaves them, plus a socket (left out of the image). It
// reports whether the filesystem took the xattrs.
func makeTree(t *testing.T, root string, shift int) (xattrs bool) {
	t.Helper()
	for _, n := range testTree {
		p := filepath.Join(root, n.path)
		var err error
		switch n.kind {
		case tar.TypeDir:
			err = os.Mkdir(p, 0o700)
		case tar.TypeReg:
			err = os.WriteFile(p, []byte(n.content), 0o600)
		case tar.TypeSymlink:
			err = os.Symlink(n.content, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(root, n.content), p)
		case tar.TypeChar:
			err = unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(uint32(n.major), uint32(n.minor))))
		case tar.TypeFifo:
			err = unix.Mkfifo(p, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n.kind == tar.TypeLink {
			continue
		}
		if err := os.Lchown(p, n.uid+shift, n.gid+shift); err != nil {
			t.Fatal(err)
		}
		if n.kind != tar.TypeSymlink { // chown cleared setuid and setgid bits
			if err := unix.Chmod(p, uint32(n.mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(root, "run/sock")})
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(root, "run/sock"), shift, shift); err != nil {
		t.Fatal(err)
	}
	// After the chowns, which drop file capabilities.
	xattrs = true
	if err := unix.Lsetxattr(filepath.Join(root, "usr/bin/ping"), capabilityXattr, pingCaps, 0); err != nil {
		if !errors.Is(err, unix.ENOTSUP) {
			t.Fatal(err)
		}
		t.Logf("the filesystem of %s has no xattrs: %v", root, err)
		xattrs = false
	}
	if xattrs {
		if err := unix.Lsetxattr(filepath.Join(root, "etc/note"), "user.comment", []byte("kept"), 0); err != nil {
			t.Fatal(err)
		}
	}
	// mtimes last: creating entries changed their directories'.
	for _, n := range slices.Backward(testTree) {
		ts := []unix.Timespec{unix.NsecToTimespec(treeMtime.UnixNano()), unix.NsecToTimespec(treeMtime.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, n.path), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	return xattrs
}

// entry is a tar entry read back, content included.
type entry struct {
	hdr     *tar.Header
	content string
}

// image is an archive read back and checked against its own descriptors.
type image struct {
	index    v1.Index
	manifest v1.Manifest
	config   v1.Image
	blobs    map[string]bool // archive paths of the blobs
	layers   [][]entry       // each layer's entries, in order
	diffIDs  []digest.Digest // sha256 of each uncompressed layer, computed here
}

// readImage reads the OCI image layout archive at file and fails t where it
// is not one: every blob's digest and size must match its descriptor and
// the config's diff_ids the layers' uncompressed tars. keepContent says
// whether to keep the layers' file contents (not for a real template).
func readImage(t *testing.T, file string, keepContent bool) *image {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// Pass 1: every entry's hash and size, the small files' contents.
	type blob struct {
		size int64
		sum  string
		data []byte // up to 1 MiB
	}
	entries := map[string]blob{}
	var order []string
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg:
		default:
			t.Fatalf("archive entry %s has type %c", hdr.Name, hdr.Typeflag)
		}
		h := sha256.New()
		var small bytes.Buffer
		n, err := io.Copy(io.MultiWriter(h, &limitBuffer{&small, 1 << 20}), tr)
		if err != nil {
			t.Fatal(err)
		}
		entries[hdr.Name] = blob{size: n, sum: hex.EncodeToString(h.Sum(nil)), data: small.Bytes()}
	}
	wantOrder := []string{"oci-layout", "blobs/", "blobs/sha256/"}
	if len(order) < 3 || !slices.Equal(order[:3], wantOrder) || order[len(order)-1] != "index.json" {
		t.Errorf("archive entries %v: want %v first and index.json last", order, wantOrder)
	}
	if got := string(entries["oci-layout"].data); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", got)
	}
	img := &image{blobs: map[string]bool{}}
	for name := range entries {
		if strings.HasPrefix(name, "blobs/") {
			img.blobs[name] = true
		}
	}
	// check finds the blob of d, checks it and returns its path.
	check := func(what string, d v1.Descriptor) (string, []byte) {
		t.Helper()
		if d.Digest.Algorithm() != digest.SHA256 {
			t.Fatalf("%s digest %s is not sha256", what, d.Digest)
		}
		p := "blobs/sha256/" + d.Digest.Encoded()
		b, ok := entries[p]
		if !ok {
			t.Fatalf("%s blob %s missing from the archive", what, p)
		}
		if b.sum != d.Digest.Encoded() {
			t.Errorf("%s blob %s has sha256 %s", what, p, b.sum)
		}
		if b.size != d.Size {
			t.Errorf("%s blob %s has %d bytes, descriptor says %d", what, p, b.size, d.Size)
		}
		delete(img.blobs, p)
		return p, b.data
	}
	decode := func(what string, b []byte, v any) {
		t.Helper()
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, b)
		}
	}
	decode("index.json", entries["index.json"].data, &img.index)
	if img.index.SchemaVersion != 2 || img.index.MediaType != v1.MediaTypeImageIndex || len(img.index.Manifests) != 1 {
		t.Fatalf("index.json: %+v", img.index)
	}
	md := img.index.Manifests[0]
	if md.MediaType != v1.MediaTypeImageManifest {
		t.Errorf("manifest media type %s", md.MediaType)
	}
	_, b := check("manifest", md)
	decode("manifest", b, &img.manifest)
	if img.manifest.SchemaVersion != 2 || img.manifest.MediaType != v1.MediaTypeImageManifest || img.manifest.Config.MediaType != v1.MediaTypeImageConfig {
		t.Errorf("manifest: %+v", img.manifest)
	}
	_, b = check("config", img.manifest.Config)
	decode("config", b, &img.config)
	if img.config.OS != "linux" || img.config.Architecture != runtime.GOARCH || img.config.RootFS.Type != "layers" {
		t.Errorf("config: os %q, architecture %q, rootfs type %q", img.config.OS, img.config.Architecture, img.config.RootFS.Type)
	}
	if md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != runtime.GOARCH {
		t.Errorf("manifest descriptor platform %+v", md.Platform)
	}
	if len(img.config.RootFS.DiffIDs) != len(img.manifest.Layers) || len(img.config.History) != len(img.manifest.Layers) {
		t.Fatalf("%d layers, %d diff_ids, %d history entries", len(img.manifest.Layers), len(img.config.RootFS.DiffIDs), len(img.config.History))
	}

	// Pass 2: each layer's tar.
	for i, l := range img.manifest.Layers {
		p, _ := check(fmt.Sprintf("layer %d", i), l)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			hdr, err := tr.Next()
			if err != nil {
				t.Fatalf("layer %s not found again: %v", p, err)
			}
			if hdr.Name == p {
				break
			}
		}
		var r io.Reader = tr
		switch l.MediaType {
		case v1.MediaTypeImageLayer:
		case v1.MediaTypeImageLayerGzip:
			zr, err := gzip.NewReader(tr)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		default:
			t.Fatalf("layer %d media type %s", i, l.MediaType)
		}
		h := sha256.New()
		lr := tar.NewReader(io.TeeReader(r, h))
		var es []entry
		for {
			hdr, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			var content []byte
			if keepContent {
				content, err = io.ReadAll(lr)
			} else {
				_, err = io.Copy(io.Discard, lr)
			}
			if err != nil {
				t.Fatalf("layer %d: %s: %v", i, hdr.Name, err)
			}
			es = append(es, entry{hdr: hdr, content: string(content)})
		}
		if _, err := io.Copy(h, r); err != nil { // the tar's end padding
			t.Fatal(err)
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil)))
		if d != img.config.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: uncompressed sha256 %s, config's diff_id %s", i, d, img.config.RootFS.DiffIDs[i])
		}
		if l.MediaType == v1.MediaTypeImageLayer && d != l.Digest {
			t.Errorf("uncompressed layer %d: diff_id %s differs from its digest %s", i, d, l.Digest)
		}
		img.diffIDs = append(img.diffIDs, d)
		img.layers = append(img.layers, es)
	}
	if len(img.blobs) > 0 {
		t.Errorf("blobs no descriptor names: %v", img.blobs)
	}
	return img
}

// limitBuffer keeps the first max bytes written to it and drops the rest.
type limitBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// pathLess orders paths as a depth-first walk with sorted directories
// visits them: component by component.
func pathLess(a, b string) bool {
	return slices.Compare(strings.Split(strings.TrimSuffix(a, "/"), "/"), strings.Split(strings.TrimSuffix(b, "/"), "/")) < 0
}

// testOptions are the options of an export of the test tree at root.
func testOptions(t *testing.T, root string) Options {
	agent := filepath.Join(t.TempDir(), "sheepfold-agent")
	if err := os.WriteFile(agent, []byte("\x7fELF the agent"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Options{
		Name:      "sheepfold.local/template/test",
		RootFS:    root,
		HostID:    testShift,
		Files:     []File{{Path: "/.sheepfold/agent", Source: agent, Mode: 0o755, Links: []string{"/usr/local/bin/sudo"}}},
		Config:    v1.ImageConfig{User: "0:0", Entrypoint: []string{"/.sheepfold/agent"}, Env: []string{"PATH=/usr/bin:/bin"}, WorkingDir: "/home/user", Labels: map[string]string{"io.sheepfold.template.name": "test"}},
		Created:   time.Date(2026, 12, 4, 14, 50, 17, 324330922, time.UTC),
		CreatedBy: "test tree",
		TempDir:   t.TempDir(),
	}
}

func export(t *testing.T, opt Options) (Result, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Write(context.Background(), f, opt)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != res.Size {
		t.Fatalf("archive has %v bytes, Result.Size %d (%v)", fi.Size(), res.Size, err)
	}
	if left, _ := os.ReadDir(opt.TempDir); len(left) > 0 {
		t.Errorf("staged layers left in TempDir: %v", left)
	}
	return res, out
}

func TestWriteTree(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	root := t.TempDir()
	xattrs := makeTree(t, root, testShift)
	opt := testOptions(t, root)
	res, file := export(t, opt)
	img := readImage(t, file, true)

	// Result, index and config agree.
	tag := img.index.Manifests[0].Digest.Encoded()[:12]
	if res.Ref != "sheepfold.local/template/test:"+tag {
		t.Errorf("Ref %s, want the manifest digest's first 12 hex digits (%s) as tag", res.Ref, tag)
	}
	ann := img.index.Manifests[0].Annotations
	if ann[v1.AnnotationRefName] != tag || ann[AnnotationImageName] != res.Ref {
		t.Errorf("index annotations %v", ann)
	}
	if res.Manifest.Digest != img.index.Manifests[0].Digest || res.Config.Digest != img.manifest.Config.Digest {
		t.Errorf("Result digests %s %s differ from the archive's", res.Manifest.Digest, res.Config.Digest)
	}
	if len(res.Layers) != 2 || res.Layers[0].DiffID != img.diffIDs[0] || res.Layers[1].DiffID != img.diffIDs[1] {
		t.Errorf("Result layers %+v, archive diff_ids %v", res.Layers, img.diffIDs)
	}
	if !reflect.DeepEqual(img.config.Config, opt.Config) {
		t.Errorf("image config %+v, want %+v", img.config.Config, opt.Config)
	}
	if img.config.Created == nil || !img.config.Created.Equal(opt.Created) || img.config.History[0].CreatedBy != "test tree" {
		t.Errorf("config created %v, history %+v", img.config.Created, img.config.History)
	}
	if !slices.Equal(res.Skipped, []string{filepath.Join(root, "run/sock")}) {
		t.Errorf("Skipped %v, want the socket", res.Skipped)
	}

	// Layer 0: the tree, unshifted, in walk order.
	got := map[string]*tar.Header{}
	content := map[string]string{}
	for i, e := range img.layers[0] {
		if i > 0 && !pathLess(img.layers[0][i-1].hdr.Name, e.hdr.Name) {
			t.Errorf("entry %s after %s: not in walk order", e.hdr.Name, img.layers[0][i-1].hdr.Name)
		}
		name := strings.TrimSuffix(e.hdr.Name, "/")
		got[name] = e.hdr
		content[name] = e.content
	}
	for _, n := range testTree {
		h, ok := got[n.path]
		if !ok {
			t.Errorf("%s missing from the layer", n.path)
			continue
		}
		delete(got, n.path)
		if h.Typeflag != n.kind {
			t.Errorf("%s: type %c, want %c", n.path, h.Typeflag, n.kind)
			continue
		}
		if h.Uid != n.uid || h.Gid != n.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", n.path, h.Uid, h.Gid, n.uid, n.gid)
		}
		if !h.ModTime.Equal(treeMtime.Truncate(time.Second)) {
			t.Errorf("%s: mtime %v, want %v", n.path, h.ModTime, treeMtime.Truncate(time.Second))
		}
		wantMode := n.mode
		switch n.kind {
		case tar.TypeSymlink, tar.TypeLink:
			if h.Linkname != n.content {
				t.Errorf("%s: links to %q, want %q", n.path, h.Linkname, n.content)
			}
			// Unpackers give the linked inode a hard link entry's
			// mode: it must be the target's.
			if n.kind == tar.TypeLink {
				i := slices.IndexFunc(testTree, func(m node) bool { return m.path == n.content })
				wantMode = testTree[i].mode
			}
		}
		if n.kind != tar.TypeSymlink && h.Mode != wantMode {
			t.Errorf("%s: mode %#o, want %#o", n.path, h.Mode, wantMode)
		}
		switch n.kind {
		case tar.TypeReg:
			if content[n.path] != n.content || h.Size != int64(len(n.content)) {
				t.Errorf("%s: content %q (size %d), want %q", n.path, content[n.path], h.Size, n.content)
			}
		case tar.TypeChar:
			if h.Devmajor != n.major || h.Devminor != n.minor {
				t.Errorf("%s: device %d:%d, want %d:%d", n.path, h.Devmajor, h.Devminor, n.major, n.minor)
			}
		}
		wantX := map[string]string{}
		if xattrs && n.path == "usr/bin/ping" {
			wantX["SCHILY.xattr."+capabilityXattr] = string(pingCaps)
		}
		if xattrs && n.path == "etc/note" {
			wantX["SCHILY.xattr.user.comment"] = "kept"
		}
		gotX := map[string]string{}
		for k, v := range h.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.") {
				gotX[k] = v
			}
		}
		if !reflect.DeepEqual(gotX, wantX) {
			t.Errorf("%s: xattrs %q, want %q", n.path, gotX, wantX)
		}
	}
	for name := range got {
		t.Errorf("unexpected entry %s in the layer", name)
	}

	// Layer 1: the agent, its link and parents.
	type want struct {
		kind          byte
		mode          int64
		uid, gid      int
		link, content string
		fromTreeMtime bool
	}
	wantFiles := []struct {
		name string
		want
	}{
		{".sheepfold/", want{kind: tar.TypeDir, mode: 0o755}},
		{"usr/", want{kind: tar.TypeDir, mode: 0o755, fromTreeMtime: true}},
		{"usr/local/", want{kind: tar.TypeDir, mode: 0o755, fromTreeMtime: true}},
		{"usr/local/bin/", want{kind: tar.TypeDir, mode: 0o775, gid: 50, fromTreeMtime: true}},
		{".sheepfold/agent", want{kind: tar.TypeReg, mode: 0o755, content: "\x7fELF the agent"}},
		{"usr/local/bin/sudo", want{kind: tar.TypeLink, mode: 0o755, link: ".sheepfold/agent"}},
	}
	if len(img.layers[1]) != len(wantFiles) {
		t.Errorf("layer 1 has %d entries, want %d", len(img.layers[1]), len(wantFiles))
	}
	for i, w := range wantFiles {
		if i >= len(img.layers[1]) {
			break
		}
		e := img.layers[1][i]
		h := e.hdr
		mtime := opt.Created.Truncate(time.Second)
		if w.fromTreeMtime {
			mtime = treeMtime.Truncate(time.Second)
		}
		if h.Name != w.name || h.Typeflag != w.kind || h.Uid != w.uid || h.Gid != w.gid || h.Linkname != w.link ||
			e.content != w.content || !h.ModTime.Equal(mtime) || h.Mode != w.mode {
			t.Errorf("layer 1 entry %d: %s type %c mode %#o owner %d:%d link %q content %q mtime %v; want %+v (%s, mtime %v)",
				i, h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname, e.content, h.ModTime, w.want, w.name, mtime)
		}
	}
}

// TestWriteDeterministic: the same tree and options give the same bytes;
// gzipped layers hold the same tars (the same diff_ids) as plain ones.
func TestWriteDeterministic(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	root := t.TempDir()
	makeTree(t, root, testShift)
	opt := testOptions(t, root)
	_, a := export(t, opt)
	_, b := export(t, opt)
	if sum(t, a) != sum(t, b) {
		t.Error("two exports of one tree differ")
	}
	// Not into a regular file, the layers are staged in TempDir first:
	// the same bytes.
	var buf bytes.Buffer
	if _, err := Write(context.Background(), struct{ io.Writer }{&buf}, opt); err != nil {
		t.Fatal(err)
	}
	if s := sha256.Sum256(buf.Bytes()); hex.EncodeToString(s[:]) != sum(t, a) {
		t.Error("the archive written through a plain io.Writer differs from the one written into a file")
	}
	// Into a file already holding something: the archive starts where the
	// file's offset is.
	f, err := os.Create(filepath.Join(t.TempDir(), "prefixed"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prefix := strings.Repeat("x", 1000)
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(context.Background(), f, opt); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte(prefix)) || !bytes.Equal(got[len(prefix):], buf.Bytes()) {
		t.Error("an archive written into a file after 1000 bytes differs")
	}
	opt.Gzip = true
	opt.Tag = "v1"
	res, c := export(t, opt)
	plain, zipped := readImage(t, a, false), readImage(t, c, false)
	if !slices.Equal(plain.diffIDs, zipped.diffIDs) {
		t.Errorf("gzipped layers' diff_ids %v, plain %v", zipped.diffIDs, plain.diffIDs)
	}
	if zipped.manifest.Layers[0].MediaType != v1.MediaTypeImageLayerGzip || zipped.manifest.Layers[0].Digest == plain.manifest.Layers[0].Digest {
		t.Errorf("gzip layer %+v", zipped.manifest.Layers[0])
	}
	if res.Ref != "sheepfold.local/template/test:v1" || zipped.index.Manifests[0].Annotations[AnnotationImageName] != res.Ref {
		t.Errorf("--tag: Ref %s, annotations %v", res.Ref, zipped.index.Manifests[0].Annotations)
	}
	// The tree changes: so does the default tag.
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(root, "etc/passwd"), testShift, testShift); err != nil {
		t.Fatal(err)
	}
	r1, _ := export(t, testOptions(t, root))
	if r1.Manifest.Digest == plain.index.Manifests[0].Digest {
		t.Error("a changed tree gave the same manifest")
	}
}

func sum(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestWriteRefuses(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, root string, opt *Options)
		want  string
	}{
		{"unshifted owner", func(t *testing.T, root string, opt *Options) {
			if err := os.Lchown(filepath.Join(root, "etc/passwd"), 0, 0); err != nil {
				t.Fatal(err)
			}
		}, "etc/passwd: owner outside the shifted ids: 0:0 is not in 1000000..1065535"},
		{"owner above the range", func(t *testing.T, root string, opt *Options) {
			if err := os.Lchown(filepath.Join(root, "bin"), testShift, testShift+65536); err != nil {
				t.Fatal(err)
			}
		}, "bin: owner outside the shifted ids: 1000000:1065536 is not in"},
		{"whiteout name", func(t *testing.T, root string, opt *Options) {
			if err := os.WriteFile(filepath.Join(root, "etc/.wh.passwd"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "would be read as a deletion"},
		{"parent of an added file is a symlink", func(t *testing.T, root string, opt *Options) {
			opt.Files[0].Path = "/bin/agent"
		}, "/bin is not a directory in the root filesystem"},
		{"added file over a directory", func(t *testing.T, root string, opt *Options) {
			opt.Files[0].Links = []string{"/usr/local/bin"}
		}, "/usr/local/bin is a directory in the root filesystem"},
		{"missing added file", func(t *testing.T, root string, opt *Options) {
			opt.Files[0].Source = filepath.Join(root, "nope")
		}, "no such file"},
		{"relative image path", func(t *testing.T, root string, opt *Options) {
			opt.Files[0].Path = ".sheepfold/agent"
		}, "not a clean absolute file path"},
		{"bad name", func(t *testing.T, root string, opt *Options) {
			opt.Name = "Sheepfold/Python"
		}, "invalid image name"},
		{"bad tag", func(t *testing.T, root string, opt *Options) {
			opt.Tag = "-x"
		}, "invalid image tag"},
		{"missing rootfs", func(t *testing.T, root string, opt *Options) {
			opt.RootFS = filepath.Join(root, "nope")
		}, "no such file"},
		{"bad v3 capability", func(t *testing.T, root string, opt *Options) {
			v := make([]byte, capSize3)
			binary.LittleEndian.PutUint32(v, capRevision3)
			binary.LittleEndian.PutUint32(v[capSize2:], 7) // root id outside the range
			if err := unix.Lsetxattr(filepath.Join(root, "usr/bin/tool"), capabilityXattr, v, 0); err != nil {
				t.Skipf("cannot set a v3 capability here: %v", err)
			}
		}, "usr/bin/tool: security.capability is for the root id 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			makeTree(t, root, testShift)
			opt := testOptions(t, root)
			tt.setup(t, root, &opt)
			_, err := Write(context.Background(), io.Discard, opt)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write: %v, want an error containing %q", err, tt.want)
			}
			if left, _ := os.ReadDir(opt.TempDir); len(left) > 0 {
				t.Errorf("staged layers left in TempDir: %v", left)
			}
		})
	}
}

func TestWriteCancelled(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	root := t.TempDir()
	makeTree(t, root, testShift)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Write(ctx, io.Discard, testOptions(t, root)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write with a cancelled context: %v", err)
	}
}

func TestUnshiftCapability(t *testing.T) {
	t.Parallel()
	ids := idRange{host: testShift, n: DefaultIDs}
	caps := func(magic uint32, size int, root uint32) []byte {
		b := make([]byte, size)
		binary.LittleEndian.PutUint32(b, magic)
		binary.LittleEndian.PutUint32(b[4:], 1<<13)
		if size == capSize3 {
			binary.LittleEndian.PutUint32(b[capSize2:], root)
		}
		return b
	}
	tests := []struct {
		name    string
		in, out []byte
		err     string
	}{
		{"v1 kept", caps(capRevision1, capSize1, 0), caps(capRevision1, capSize1, 0), ""},
		{"v2 kept", caps(capRevision2|1, capSize2, 0), caps(capRevision2|1, capSize2, 0), ""},
		{"v3 for the image's root becomes v2", caps(capRevision3|1, capSize3, testShift), caps(capRevision2|1, capSize2, 0), ""},
		{"v3 for another root id is unshifted", caps(capRevision3, capSize3, testShift+1000), caps(capRevision3, capSize3, 1000), ""},
		{"v3 outside the range", caps(capRevision3, capSize3, 0), nil, "root id 0, outside"},
		{"v3 above the range", caps(capRevision3, capSize3, testShift+DefaultIDs), nil, "outside"},
		{"wrong size", caps(capRevision2, capSize3, 0), nil, "has 24 bytes, want 20"},
		{"unknown revision", caps(0x04000000, capSize2, 0), nil, "unknown revision"},
		{"short", []byte{1, 2}, nil, "of 2 bytes"},
	}
	for _, tt := range tests {
		got, err := unshiftCapability(tt.in, ids)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: %x, %v; want an error containing %q", tt.name, got, err, tt.err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, tt.out) {
			t.Errorf("%s: %x, %v; want %x", tt.name, got, err, tt.out)
		}
	}
}

// TestWriteRealTemplate exports the python template that `make template`
// builds (as root, where a missing template is a failure) and logs how
// long it took: about 6 s uncompressed and 3 s to read back on 2 cores.
// SHEEPFOLD_EXPORT_GZIP=1 gzips the layers (about twice as long).
func TestWriteRealTemplate(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.TemplateRootFS(t, "python")
	opt := testOptions(t, rootfs)
	opt.Name = "sheepfold.local/template/python"
	opt.Gzip = os.Getenv("SHEEPFOLD_EXPORT_GZIP") == "1"
	// The archive (as large as the template) goes beside the templates,
	// on a disk that holds them, not in a /tmp that may be a tmpfs.
	dir, err := os.MkdirTemp(testutil.DataDir(), ".export-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	opt.TempDir = dir
	f, err := os.Create(filepath.Join(dir, "python.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := f.Name()
	start := time.Now()
	res, err := Write(context.Background(), f, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("exported %s (gzip %v) in %s: archive %d MiB, layer 0: %d entries, tar %d MiB, blob %d MiB",
		res.Ref, opt.Gzip, took.Round(100*time.Millisecond), res.Size>>20, res.Layers[0].Entries, res.Layers[0].TarSize>>20, res.Layers[0].Size>>20)
	start = time.Now()
	img := readImage(t, out, false)
	t.Logf("read back in %s", time.Since(start).Round(100*time.Millisecond))
	var agent bool
	for _, e := range img.layers[1] {
		agent = agent || e.hdr.Name == ".sheepfold/agent" && e.hdr.Mode == 0o755 && e.hdr.Uid == 0
	}
	if !agent {
		t.Error("no agent in the image")
	}
	for _, e := range img.layers[0] {
		if e.hdr.Uid > 65535 || e.hdr.Gid > 65535 {
			t.Errorf("%s: owner %d:%d not unshifted", e.hdr.Name, e.hdr.Uid, e.hdr.Gid)
		}
	}
}
