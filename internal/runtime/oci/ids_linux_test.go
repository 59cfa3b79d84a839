package oci

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSubIDs(t *testing.T) {
	s, err := parseSubIDs(strings.NewReader("# comment\nalice:100000:65536\nroot:1000000:268500992\nbad line\nbob:1200000:65536\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		start uint64
		want  bool
	}{
		{1065536, true},              // inside root's entry
		{1065536 + 65536*2, false},   // overlaps bob's 1200000
		{999_000, false},             // starts before root's entry
		{1000000 + 268500992, false}, // ends after it
		{1000000 + 268500992 - 65536, true},
	} {
		if got := s.allows(c.start, 65536); got != c.want {
			t.Errorf("allows(%d) = %v, want %v", c.start, got, c.want)
		}
	}
	// No entry for root: anything no other user has.
	s, _ = parseSubIDs(strings.NewReader("alice:100000:65536\n"))
	if !s.allows(1065536, 65536) || s.allows(65536, 65536) {
		t.Error("without root's entries")
	}
}

func TestIDRanges(t *testing.T) {
	dir := t.TempDir()
	r := &idRanges{dir: dir, bases: []uint32{1065536, 1131072}, size: 65536}
	bundles := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
	for _, b := range bundles {
		os.Mkdir(b, 0o700)
	}
	a, err := r.allocate(bundles[0])
	if err != nil || a != 1065536 {
		t.Fatalf("first: %d %v", a, err)
	}
	b, err := r.allocate(bundles[1])
	if err != nil || b != 1131072 {
		t.Fatalf("second: %d %v", b, err)
	}
	if _, err := r.allocate(bundles[2]); !errors.Is(err, ErrNoIDs) {
		t.Fatalf("third while both are held: %v", err)
	}
	// A range whose bundle vanished is reclaimed; a held one never is.
	os.Remove(bundles[0])
	if c, err := r.allocate(bundles[2]); err != nil || c != a {
		t.Fatalf("after a's bundle vanished: %d %v", c, err)
	}
	if err := r.release(bundles[1]); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.find(bundles[1]); ok {
		t.Error("released range still recorded")
	}
	if slot, ok, _ := r.find(bundles[2]); !ok || r.bases[slot] != a {
		t.Errorf("c's range: %d %v", slot, ok)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, ".new-*")); len(names) != 0 {
		t.Errorf("temporaries left: %v", names)
	}
}

// allocate takes the first free range of those preferred (ranges with a
// user namespace made in advance), else the lowest free one; nextFree
// skips what it is told to.
func TestIDRangesPrefer(t *testing.T) {
	dir := t.TempDir()
	r := &idRanges{dir: dir, bases: []uint32{1065536, 1131072, 1196608}, size: 65536}
	bundle := func(name string) string {
		b := filepath.Join(dir, name)
		os.Mkdir(b, 0o700)
		return b
	}
	if got, err := r.allocate(bundle("a"), 1196608, 1131072); err != nil || got != 1196608 {
		t.Fatalf("preferring the third: %d %v", got, err)
	}
	if r.isFree(1196608) || !r.isFree(1065536) || r.isFree(42) {
		t.Error("isFree")
	}
	// A preferred range that is taken, or not a range at all, is passed by.
	if got, err := r.allocate(bundle("b"), 1196608, 42, 1131072); err != nil || got != 1131072 {
		t.Fatalf("preferring a taken one, then the second: %d %v", got, err)
	}
	if got, ok := r.nextFree(func(uint32) bool { return false }); !ok || got != 1065536 {
		t.Fatalf("nextFree = %d %v", got, ok)
	}
	if _, ok := r.nextFree(func(b uint32) bool { return b == 1065536 }); ok {
		t.Fatal("nextFree skipping the only free range found one")
	}
	if got, err := r.allocate(bundle("c"), 1131072); err != nil || got != 1065536 {
		t.Fatalf("with no preferred one free: %d %v", got, err)
	}
}
