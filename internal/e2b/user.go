package e2b

import (
	"context"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// setUser makes a process run as the sandbox user a request names: "user"
// (no capabilities) or "root" (root inside the sandbox's user namespace).
func setUser(spec *sandbox.ProcessSpec, user string) {
	spec.User = user
}

// as is the file-call option for the request's user.
func as(ctx context.Context) sandbox.FileOption { return sandbox.AsUser(userFrom(ctx)) }

func apierrIsNotFound(err error) bool { return apierr.CodeOf(err) == apierr.NotFound }
