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

// owned is the option of calls that create (writes, makeDir): as E2B's
// envd, which runs as root, they may create anywhere, and what they create
// (missing parents included) is the request's user's, by default the
// sandbox's (its template's USER).
func owned(ctx context.Context) sandbox.FileOption {
	u := userFrom(ctx)
	if u == "" {
		u = sandboxFrom(ctx).DefaultUser()
	}
	return sandbox.OwnedBy(u)
}

func apierrIsNotFound(err error) bool { return apierr.CodeOf(err) == apierr.NotFound }
