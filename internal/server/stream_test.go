package server

import (
	"strings"
	"testing"
)

func TestTextCarry(t *testing.T) {
	t.Parallel()
	in := []byte("aé€😀z")
	// Every way of cutting the input in two keeps the text intact.
	for i := range len(in) + 1 {
		var c textCarry
		got := c.text(in[:i]) + c.text(in[i:])
		if got != string(in) {
			t.Fatalf("cut at %d: %q", i, got)
		}
		var fresh textCarry
		if first := fresh.text(in[:i]); !strings.HasPrefix(string(in), first) || strings.ContainsRune(first, '\uFFFD') {
			t.Fatalf("cut at %d: first chunk %q", i, first)
		}
	}
	// Byte by byte.
	var c textCarry
	var b strings.Builder
	for i := range in {
		b.WriteString(c.text(in[i : i+1]))
	}
	if b.String() != string(in) {
		t.Fatalf("byte by byte: %q", b.String())
	}
}
