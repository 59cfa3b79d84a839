package template

import (
	"bufio"
	"compress/gzip"
	"io"
)

// MaybeGunzip returns r's bytes, gunzipped when they start with gzip's
// magic (a tar or a tar.gz alike: a build context, an image layer), and
// the closer of the gzip reader (a no-op for plain bytes).
func MaybeGunzip(r io.Reader) (io.Reader, func() error, error) {
	br := bufio.NewReader(r)
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return gz, gz.Close, nil
	}
	return br, func() error { return nil }, nil
}
