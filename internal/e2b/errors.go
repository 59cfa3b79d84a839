package e2b

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// Engine errors leave the E2B surface through one table per boundary:
// httpStatus for E2B's HTTP answers (the control plane, envd's /files and
// the code interpreter, each in its own body shape), connectCodes for
// envd's Connect RPCs. Nothing else maps apierr codes.

// statusError is an answer with an explicit HTTP status (no route, a
// method not allowed, an unsupported operation).
type statusError struct {
	status  int
	message string
}

func (e *statusError) Error() string { return e.message }

// e2bStatus holds where E2B's HTTP answers differ from apierr.Status.
var e2bStatus = map[apierr.Code]int{
	// A stopped sandbox is gone, for E2B clients (kill answers false).
	apierr.SandboxState: http.StatusNotFound,
}

// httpStatus is the E2B HTTP answer to err: its status, the message a
// client may see, and the seconds to wait before retrying (0: none).
func httpStatus(err error) (status int, message string, retryAfter int) {
	var se *statusError
	if errors.As(err, &se) {
		return se.status, se.message, 0
	}
	e := apierr.From(err)
	status, ok := e2bStatus[e.Code]
	if !ok {
		status = e.HTTPStatus()
	}
	return status, e.Message, int(math.Ceil(e.RetryAfter.Seconds()))
}

// setRetryAfter sets Retry-After when retryAfter is positive.
func setRetryAfter(w http.ResponseWriter, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
}

// connectCodes is the Connect code of each apierr code (a code missing
// here, which a test forbids, is CodeInternal).
var connectCodes = map[apierr.Code]connect.Code{
	apierr.BadRequest:           connect.CodeInvalidArgument,
	apierr.UnsupportedLanguage:  connect.CodeInvalidArgument,
	apierr.InvalidPolicy:        connect.CodeInvalidArgument,
	apierr.InvalidHandler:       connect.CodeInvalidArgument,
	apierr.AuthenticationFailed: connect.CodeUnauthenticated,
	apierr.NotFound:             connect.CodeNotFound,
	apierr.SandboxNotFound:      connect.CodeNotFound,
	apierr.TemplateNotFound:     connect.CodeNotFound,
	apierr.Conflict:             connect.CodeAlreadyExists,
	apierr.PathNotAllowed:       connect.CodePermissionDenied,
	apierr.Forbidden:            connect.CodePermissionDenied,
	apierr.ModuleBlocked:        connect.CodePermissionDenied,
	apierr.NetworkRestricted:    connect.CodePermissionDenied,
	apierr.SubprocessDenied:     connect.CodePermissionDenied,
	apierr.FileTooLarge:         connect.CodeResourceExhausted,
	apierr.DiskFull:             connect.CodeResourceExhausted,
	apierr.OutOfMemory:          connect.CodeResourceExhausted,
	apierr.OutputLimit:          connect.CodeResourceExhausted,
	apierr.CPUTimeExceeded:      connect.CodeResourceExhausted,
	apierr.SessionQuotaExceeded: connect.CodeResourceExhausted,
	apierr.RateLimited:          connect.CodeResourceExhausted,
	apierr.TooManyConnections:   connect.CodeResourceExhausted,
	apierr.StorageQuotaExceeded: connect.CodeResourceExhausted,
	apierr.ProcessLimit:         connect.CodeResourceExhausted,
	apierr.SandboxState:         connect.CodeUnavailable,
	apierr.Capacity:             connect.CodeUnavailable,
	apierr.StorageUnavailable:   connect.CodeUnavailable,
	apierr.ShuttingDown:         connect.CodeUnavailable,
	apierr.SandboxTimeout:       connect.CodeDeadlineExceeded,
	apierr.MethodNotAllowed:     connect.CodeUnimplemented,
	apierr.NotSupported:         connect.CodeUnimplemented,
	apierr.Internal:             connect.CodeInternal,
	// The model relay's codes never arise on envd; mapped for the table's
	// completeness.
	apierr.ModelNotFound:   connect.CodeNotFound,
	apierr.SessionNotFound: connect.CodeNotFound,
	apierr.Provider:        connect.CodeUnavailable,
	apierr.ProviderTimeout: connect.CodeDeadlineExceeded,
	// Volumes' codes arise at create, on the control plane.
	apierr.VolumeNotFound: connect.CodeNotFound,
	apierr.VolumeInUse:    connect.CodeFailedPrecondition,
	// Devices' too.
	apierr.DeviceNotFound:     connect.CodeNotFound,
	apierr.DeviceInUse:        connect.CodeFailedPrecondition,
	apierr.RegistryNotAllowed: connect.CodePermissionDenied,
	// A template's start command that never got ready.
	apierr.TemplateNotReady: connect.CodeUnavailable,
}

// connectError maps an engine error to a Connect error. When the sandbox
// itself is gone, the open connection is broken off instead, as the SDK
// expects of a killed sandbox (the error returned is then never sent).
func connectError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cutByDrain(ctx) {
		return connect.NewError(connect.CodeUnavailable, errors.New(apierr.From(context.Cause(ctx)).Message))
	}
	if abortIfGone(ctx) {
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox stopped"))
	}
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	e := apierr.From(err)
	code, ok := connectCodes[e.Code]
	if !ok {
		code = connect.CodeInternal
	}
	return connect.NewError(code, errors.New(e.Message))
}

// cutByDrain reports whether ctx (a request's) was canceled by the
// server's drain (ERR_SHUTTING_DOWN as its cause), not by its client
// going away: the stream is then ended with an error the client sees.
func cutByDrain(ctx context.Context) bool {
	return ctx.Err() != nil && apierr.CodeOf(context.Cause(ctx)) == apierr.ShuttingDown
}
