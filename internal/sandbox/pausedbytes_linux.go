package sandbox

import (
	"io/fs"
	"syscall"
)

// fileBytes is what a file occupies on disk: its blocks (a sparse image
// counts what it holds).
func fileBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
