package kernel

import "golang.org/x/sys/unix"

// pipeBytes returns how many bytes wait unread in a pipe.
func pipeBytes(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}
