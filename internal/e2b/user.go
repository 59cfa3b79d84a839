package e2b

import (
	"errors"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// setUser makes a process run as the sandbox user a request names.
func setUser(spec *sandbox.ProcessSpec, user string) error {
	if user == rootUser {
		return connect.NewError(connect.CodePermissionDenied, errors.New("running as root is not supported by this server yet"))
	}
	return nil
}

func apierrIsNotFound(err error) bool { return apierr.CodeOf(err) == apierr.NotFound }
