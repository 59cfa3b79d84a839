// Package fdpass reads file descriptors passed over a Unix socket
// (SCM_RIGHTS), for the in-sandbox programs that receive them: the
// agent's sudo and the kernels' seccomp supervisor. It imports only
// golang.org/x/sys/unix.
package fdpass

import "golang.org/x/sys/unix"

// Received returns the descriptors carried by a recvmsg's control data,
// in order; none when it holds no SCM_RIGHTS message or does not parse.
// The caller owns (and must close) every one returned.
func Received(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}
