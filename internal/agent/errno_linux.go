package agent

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// codeOf maps an error to the Code* constant a Done carries. It is the one
// place where system errors become protocol codes.
func codeOf(err error) string {
	switch {
	case errors.Is(err, agentproto.ErrBodyTooLarge):
		return agentproto.CodeTooLarge
	case errors.Is(err, agentproto.ErrBadFrame), errors.Is(err, agentproto.ErrFrameTooLarge):
		return agentproto.CodeBadRequest
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return agentproto.CodeInternal
	}
	switch errno {
	case unix.ENOENT, unix.ESRCH:
		return agentproto.CodeNotFound
	case unix.ENOTDIR:
		return agentproto.CodeNotDir
	case unix.EISDIR:
		return agentproto.CodeIsDir
	case unix.EEXIST, unix.ENOTEMPTY:
		return agentproto.CodeExists
	case unix.EACCES, unix.EPERM, unix.EROFS, unix.ETXTBSY:
		return agentproto.CodePermission
	case unix.ENOSPC, unix.EDQUOT:
		return agentproto.CodeNoSpace
	case unix.EFBIG:
		return agentproto.CodeTooLarge
	case unix.EINVAL, unix.ENAMETOOLONG, unix.ELOOP, unix.ENOEXEC:
		return agentproto.CodeBadRequest
	case unix.EXDEV, unix.ENOSYS, unix.EOPNOTSUPP:
		return agentproto.CodeUnsupported
	}
	return agentproto.CodeInternal
}

// failErr returns a failed Done for err about the sandbox path p (or any
// other name the client gave). Messages never name host paths: callers
// pass bare errnos or errors built from sandbox paths.
func failErr(p string, err error) agentproto.Event {
	var errno unix.Errno
	msg := err.Error()
	if errors.As(err, &errno) {
		msg = errno.Error()
	}
	if p != "" {
		msg = fmt.Sprintf("%s: %s", p, msg)
	}
	return fail(codeOf(err), "%s", msg)
}
