package ociimage

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/klauspost/pgzip"
	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// stagedLayer is a layer blob written to an unlinked temporary file.
type stagedLayer struct {
	f     *os.File
	layer Layer
}

func (s *stagedLayer) close() { s.f.Close() }

// stageLayer writes the layer that fill makes to an unlinked temporary
// file in dir.
func stageLayer(dir string, gz bool, fill func(*tar.Writer) (int, error)) (*stagedLayer, error) {
	f, err := os.CreateTemp(dir, ".sheepfold-layer-*")
	if err != nil {
		return nil, err
	}
	// Unlinked at once: nothing is left behind, whatever happens.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	l, err := writeLayer(f, gz, fill)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &stagedLayer{f: f, layer: l}, nil
}

// writeLayer writes the layer that fill makes (fill returns the number of
// entries it wrote) to out, gzipped if gz, hashing the tar and the blob on
// the way.
func writeLayer(out io.Writer, gz bool, fill func(*tar.Writer) (int, error)) (Layer, error) {
	bw := bufio.NewWriterSize(out, copyBuffer)
	blob := &hashWriter{h: sha256.New()}
	blobOut := io.MultiWriter(bw, blob)
	diff, tarOut := blob, blobOut
	var zw *pgzip.Writer
	mediaType := v1.MediaTypeImageLayer
	if gz {
		mediaType = v1.MediaTypeImageLayerGzip
		// No name or mtime in the gzip header, blocks of a fixed size
		// (pgzip's default): the blob depends on the tar alone.
		zw = pgzip.NewWriter(blobOut)
		diff = &hashWriter{h: sha256.New()}
		tarOut = io.MultiWriter(zw, diff)
	}
	tw := tar.NewWriter(tarOut)
	n, err := fill(tw)
	if err != nil {
		return Layer{}, err
	}
	if err := tw.Close(); err != nil {
		return Layer{}, err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return Layer{}, err
		}
	}
	if err := bw.Flush(); err != nil {
		return Layer{}, err
	}
	return Layer{
		Descriptor: v1.Descriptor{MediaType: mediaType, Digest: blob.digest(), Size: blob.n},
		DiffID:     diff.digest(),
		TarSize:    diff.n,
		Entries:    n,
	}, nil
}

// hashWriter hashes and counts what is written to it.
type hashWriter struct {
	h hash.Hash
	n int64
}

func (w *hashWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	w.n += int64(len(p))
	return len(p), nil
}

func (w *hashWriter) digest() digest.Digest {
	return digest.NewDigestFromEncoded(digest.SHA256, fmt.Sprintf("%x", w.h.Sum(nil)))
}
