package template

import (
	"bytes"
	"compress/gzip"
	"io"
	"testing"
)

// TestMaybeGunzip: gzipped bytes come out gunzipped, plain ones as they
// are; a gzip magic over a broken stream is an error.
func TestMaybeGunzip(t *testing.T) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte("inside"))
	w.Close()
	for name, in := range map[string][]byte{"gzipped": gz.Bytes(), "plain": []byte("inside")} {
		r, closeGz, err := MaybeGunzip(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, err := io.ReadAll(r); err != nil || string(got) != "inside" {
			t.Errorf("%s: %q, %v", name, got, err)
		}
		if err := closeGz(); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
	}
	if _, _, err := MaybeGunzip(bytes.NewReader([]byte{0x1f, 0x8b, 0})); err == nil {
		t.Error("a broken gzip header was taken")
	}
}
