package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCache: a Cache answers as Get does, reads template.json once while
// it is unchanged, and sees every change to it: a new start command
// written (SetDevices), a rebuild renamed into place, a removal.
func TestCache(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	fakeTemplate(t, data, Info{Name: "a", Start: "one", Version: FormatVersion})
	var c Cache
	info, err := c.Get(data, "a")
	if err != nil || info.Start != "one" {
		t.Fatalf("Get: %+v %v", info, err)
	}
	// Unchanged: from the cache. Breaking the file in place but keeping
	// its identity (inode, size, mtime) proves it is not read again.
	file := filepath.Join(templatesDir(data), "a", infoFile)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(file, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(data, "a"); err == nil {
		t.Fatal("control: Get read a broken template.json")
	}
	if info, err := c.Get(data, "a"); err != nil || info.Start != "one" {
		t.Fatalf("cached Get: %+v %v", info, err)
	}

	// Rewritten: seen.
	fakeTemplate(t, data, Info{Name: "a", Start: "two", Version: FormatVersion})
	if info, err := c.Get(data, "a"); err != nil || info.Start != "two" {
		t.Fatalf("after a rewrite: %+v %v", info, err)
	}
	if err := SetDevices(data, "a", 1, nil); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Get(data, "a"); err != nil || info.GPUs != 1 || info.Start != "two" {
		t.Fatalf("after SetDevices: %+v %v", info, err)
	}

	// Removed: Get's error.
	if err := os.RemoveAll(filepath.Join(templatesDir(data), "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(data, "a"); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("after removal: %v, want ErrNotBuilt", err)
	}
	if _, err := c.Get(data, "../a"); err == nil {
		t.Fatal("a bad name was looked up")
	}
	// writeInfo leaves no temporary file behind.
	fakeTemplate(t, data, Info{Name: "b", Version: FormatVersion})
	ents, _ := os.ReadDir(filepath.Join(templatesDir(data), "b"))
	if len(ents) != 2 {
		t.Fatalf("template dir holds %d entries, want rootfs and %s", len(ents), infoFile)
	}
}
