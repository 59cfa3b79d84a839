//go:build !linux

package pidfd

import "errors"

// ErrUnsupported is returned where pidfds do not exist.
var ErrUnsupported = errors.New("pidfd: not supported on this system")

// AwaitExit fails: the caller waits as it would without it.
func AwaitExit(pid int) error { return ErrUnsupported }
