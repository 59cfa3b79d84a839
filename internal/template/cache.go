package template

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Cache is Get for a caller that asks often: a create asks for its
// template's root, runtime, devices and start command, and reads
// template.json once, not once a question. An entry holds while the file
// is the one it was read from (device, inode, size and mtime), so a
// rebuild, which renames a new file into place, or a removal is seen at
// the next call. The Infos it returns are shared: callers must not modify
// their slices or maps. The zero Cache is ready to use.
type Cache struct {
	// mu guards infos.
	mu    sync.Mutex
	infos map[string]cachedInfo // by the path of template.json
}

type cachedInfo struct {
	id   fileID
	info Info
}

// fileID tells one version of a file from another.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// Get is the package's Get, from the cache when template.json has not
// changed since it was last read.
func (c *Cache) Get(dataDir, name string) (Info, error) {
	base, tag, err := SplitRef(name)
	if err != nil {
		return Info{}, err
	}
	dir := filepath.Join(templatesDir(dataDir), base)
	read := func() (Info, error) { return readInfo(dir, base) }
	if tag != "" {
		// A tag's generation never changes: a move links another.
		gen, err := tagGen(tagDir(dataDir, base, tag))
		if err != nil {
			return getRef(dataDir, name) // its error
		}
		dir, read = gen, func() (Info, error) { return readGen(gen, base, tag) }
	}
	file := filepath.Join(dir, infoFile)
	key := file + "\x00" + name // a generation is each of its tags'
	id, ok := statID(file)
	if ok {
		c.mu.Lock()
		e, hit := c.infos[key]
		c.mu.Unlock()
		if hit && e.id == id {
			return e.info, nil
		}
	}
	info, err := read()
	if err != nil || !ok {
		return info, err
	}
	c.mu.Lock()
	if c.infos == nil {
		c.infos = map[string]cachedInfo{}
	}
	c.infos[key] = cachedInfo{id: id, info: info}
	c.mu.Unlock()
	return info, nil
}

func statID(path string) (fileID, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: fi.Size(), mtime: fi.ModTime()}, true
}
