// Package apierr is Sheepfold's one error model: a stable machine code, a
// message a user may see, and the cause kept for the log only.
//
// Engine packages return wrapped errors and sentinels; the service boundary
// attaches a code once (with New or Wrap); transports only render. Codes are
// append-only and never renamed.
//
// # Where codes are attached
//
// internal/apierr is the one error model: a stable code (`ERR_…`), a message
// for the user, the cause for the log, and the one table of codes to HTTP
// statuses (checked against the OpenAPI enum by a test). Codes are attached
// once per boundary: agent answers → codes in internal/sandbox
// (`agentError`; a request over the agent's frame size is `ERR_BAD_REQUEST`);
// the server's own dependencies → codes in internal/server (`classify`: the
// store's `ErrUnavailable` is 503 `ERR_STORAGE_UNAVAILABLE`); codes → E2B's
// answers in internal/e2b/errors.go, one table per boundary: `connectCodes`
// for envd's Connect RPCs (every code has one; a test checks), `httpStatus`
// for E2B's HTTP answers (control plane, `/files`, the code interpreter:
// apierr's statuses except a stopped sandbox, 404 for E2B clients, with
// `Retry-After`), each renderer only shaping the body; Connect's own error
// writer answers plain requests. /v1 renders
// `{"error":{code,message,request_id}}` in one function, and while the
// server drains, what is cut off is `ERR_SHUTTING_DOWN`. docs/errors.md is
// the user's table of every code (status, message, when, the Python SDK's
// exception and the Go SDK's `client.ErrXxx`); a test walks apierr's codes
// against it and both SDKs. An execution's own failure gets its code in
// internal/sandbox: the kernel's status (timeout, CPU, output cap), the
// exception a policy hook raised (`errorCodes`), a `network_denied`
// violation the kernel reported during the execution (so urllib's
// `URLError` around `NetworkRestrictedError` is `ERR_NETWORK_RESTRICTED`
// too), and, in a sandbox without network, the resolver and connect
// failures of Node, curl and the C library (`netrefused.go`, which also
// reports the attempt as a `network_denied` event).
package apierr

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Code is a stable machine error code.
type Code string

// The codes. Keep Status in step; never rename one.
const (
	BadRequest           Code = "ERR_BAD_REQUEST"
	AuthenticationFailed Code = "ERR_AUTHENTICATION_FAILED"
	SandboxNotFound      Code = "ERR_SANDBOX_NOT_FOUND"
	NotFound             Code = "ERR_NOT_FOUND"
	SandboxState         Code = "ERR_SANDBOX_STATE"
	SandboxTimeout       Code = "ERR_SANDBOX_TIMEOUT"
	OutOfMemory          Code = "ERR_OUT_OF_MEMORY"
	OutputLimit          Code = "ERR_OUTPUT_LIMIT"
	FileTooLarge         Code = "ERR_FILE_TOO_LARGE"
	DiskFull             Code = "ERR_DISK_FULL"
	PathNotAllowed       Code = "ERR_PATH_NOT_ALLOWED"
	Conflict             Code = "ERR_CONFLICT"
	UnsupportedLanguage  Code = "ERR_UNSUPPORTED_LANGUAGE"
	TemplateNotFound     Code = "ERR_TEMPLATE_NOT_FOUND"
	ModuleBlocked        Code = "ERR_MODULE_BLOCKED"
	NetworkRestricted    Code = "ERR_NETWORK_RESTRICTED"
	SessionQuotaExceeded Code = "ERR_SESSION_QUOTA_EXCEEDED"
	RateLimited          Code = "ERR_RATE_LIMITED"
	Capacity             Code = "ERR_CAPACITY"
	Internal             Code = "ERR_INTERNAL"
	MethodNotAllowed     Code = "ERR_METHOD_NOT_ALLOWED"
	StorageUnavailable   Code = "ERR_STORAGE_UNAVAILABLE"
	ShuttingDown         Code = "ERR_SHUTTING_DOWN"
	Forbidden            Code = "ERR_FORBIDDEN"
	InvalidPolicy        Code = "ERR_INVALID_POLICY"
	SubprocessDenied     Code = "ERR_SUBPROCESS_DENIED"
	CPUTimeExceeded      Code = "ERR_CPU_TIME_EXCEEDED"
	ModelNotFound        Code = "ERR_MODEL_NOT_FOUND"
	Provider             Code = "ERR_PROVIDER"
	ProviderTimeout      Code = "ERR_PROVIDER_TIMEOUT"
	SessionNotFound      Code = "ERR_SESSION_NOT_FOUND"
	// TooManyConnections refuses a long-lived connection (a stream, a
	// preview, an MCP call) past its key's or its account's share.
	TooManyConnections Code = "ERR_TOO_MANY_CONNECTIONS"
	// StorageQuotaExceeded: the account keeps as many records of a kind
	// as the server lets one account keep, and none of them may go to
	// make room (internal/store, storage.go).
	StorageQuotaExceeded Code = "ERR_STORAGE_QUOTA_EXCEEDED"
	// ProcessLimit: a process start refused because the sandbox holds
	// its limit of tasks (pids); it succeeds again once some end.
	ProcessLimit Code = "ERR_PROCESS_LIMIT"
	// NotSupported: this server cannot do what was asked (pause a
	// sandbox on a runtime that cannot checkpoint, or one with a
	// network); no state changed.
	NotSupported Code = "ERR_NOT_SUPPORTED"
	// VolumeNotFound: the account has no volume of that name (another
	// account's volumes are not found either).
	VolumeNotFound Code = "ERR_VOLUME_NOT_FOUND"
	// VolumeInUse: a volume mounted by a live sandbox cannot be deleted,
	// nor mounted read-write by a second writer unless every writer asks
	// to share it.
	VolumeInUse Code = "ERR_VOLUME_IN_USE"
	// InvalidHandler: a batch's code does not parse, or binds no
	// handler(item) at its top level; the batch is refused before any
	// item runs.
	InvalidHandler Code = "ERR_INVALID_HANDLER"
	// DeviceNotFound: a device (by CDI name) or a number of GPUs the
	// server does not have.
	DeviceNotFound Code = "ERR_DEVICE_NOT_FOUND"
	// DeviceInUse: the device asked for, or every GPU, is held by other
	// live sandboxes (one sandbox at a time, unless the operator lets
	// them share).
	DeviceInUse Code = "ERR_DEVICE_IN_USE"
	// RegistryNotAllowed: a template's FROM names an image registry the
	// operator does not allow.
	RegistryNotAllowed Code = "ERR_REGISTRY_NOT_ALLOWED"
	// TemplateNotReady: the template's start command ended, or its ready
	// check did not hold in time, as a sandbox of it started; the
	// sandbox is gone, and Details carry the command's last output.
	TemplateNotReady Code = "ERR_TEMPLATE_NOT_READY"
)

// Status is the HTTP status of each code.
var Status = map[Code]int{
	BadRequest:           http.StatusBadRequest,
	AuthenticationFailed: http.StatusUnauthorized,
	SandboxNotFound:      http.StatusNotFound,
	NotFound:             http.StatusNotFound,
	SandboxState:         http.StatusConflict,
	SandboxTimeout:       http.StatusRequestTimeout,
	OutOfMemory:          http.StatusUnprocessableEntity,
	OutputLimit:          http.StatusUnprocessableEntity,
	FileTooLarge:         http.StatusRequestEntityTooLarge,
	DiskFull:             http.StatusInsufficientStorage,
	PathNotAllowed:       http.StatusForbidden,
	Conflict:             http.StatusConflict,
	UnsupportedLanguage:  http.StatusBadRequest,
	TemplateNotFound:     http.StatusNotFound,
	ModuleBlocked:        http.StatusForbidden,
	NetworkRestricted:    http.StatusForbidden,
	SessionQuotaExceeded: http.StatusTooManyRequests,
	RateLimited:          http.StatusTooManyRequests,
	Capacity:             http.StatusServiceUnavailable,
	Internal:             http.StatusInternalServerError,
	MethodNotAllowed:     http.StatusMethodNotAllowed,
	StorageUnavailable:   http.StatusServiceUnavailable,
	ShuttingDown:         http.StatusServiceUnavailable,
	Forbidden:            http.StatusForbidden,
	InvalidPolicy:        http.StatusBadRequest,
	SubprocessDenied:     http.StatusForbidden,
	CPUTimeExceeded:      http.StatusUnprocessableEntity,
	ModelNotFound:        http.StatusNotFound,
	Provider:             http.StatusBadGateway,
	ProviderTimeout:      http.StatusGatewayTimeout,
	SessionNotFound:      http.StatusNotFound,
	TooManyConnections:   http.StatusTooManyRequests,
	StorageQuotaExceeded: http.StatusTooManyRequests,
	ProcessLimit:         http.StatusUnprocessableEntity,
	NotSupported:         http.StatusNotImplemented,
	VolumeNotFound:       http.StatusNotFound,
	VolumeInUse:          http.StatusConflict,
	InvalidHandler:       http.StatusBadRequest,
	DeviceNotFound:       http.StatusNotFound,
	DeviceInUse:          http.StatusConflict,
	RegistryNotAllowed:   http.StatusForbidden,
	TemplateNotReady:     http.StatusBadGateway,
}

// Error is an error with a code. Message is safe to show to the caller;
// Err is the cause, for logs only.
type Error struct {
	Code       Code
	Message    string
	Err        error
	Details    map[string]any
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// HTTPStatus is the status to send for this error.
func (e *Error) HTTPStatus() int {
	if s, ok := Status[e.Code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// New returns an error with a code and a user-facing message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap attaches a code and a user-facing message to a cause.
func Wrap(err error, code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err}
}

// From returns err as an *Error; anything uncoded becomes ERR_INTERNAL
// with a generic message (the cause stays in Err for the log).
func From(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: Internal, Message: "internal error", Err: err}
}

// CodeOf returns the code of err, or "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	return From(err).Code
}
