package kernel

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pipeBytes returns how many bytes wait unread in a pipe.
func pipeBytes(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}

// sourceFile returns a sealed memory file holding src, which an
// interpreter that reads its program from a seekable file (the Java
// launcher's source mode) gets as one of its descriptors: nothing on a
// file system the sandbox's code could write.
func sourceFile(name, src string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(src); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal %s: %w", name, err)
	}
	return f, nil
}
