package client

import "github.com/sheepfold/sheepfold/api"

// Code is one of the API's stable error codes ("ERR_MODULE_BLOCKED"). A
// Code is an error too, so that an *Error matches it with errors.Is:
//
//	if errors.Is(err, client.ErrSessionQuotaExceeded) { ... }
//
// An execution's outcome (Execution.ErrorCode, SessionExecution's
// Error.Code) is one of these too; Code(ex.ErrorCode) compares with them.
type Code = api.Code

// The codes the server returns (docs/errors.md: status, message, when).
// They are append-only and never renamed.
const (
	ErrBadRequest           Code = "ERR_BAD_REQUEST"
	ErrAuthenticationFailed Code = "ERR_AUTHENTICATION_FAILED"
	ErrSandboxNotFound      Code = "ERR_SANDBOX_NOT_FOUND"
	ErrNotFound             Code = "ERR_NOT_FOUND"
	ErrSandboxState         Code = "ERR_SANDBOX_STATE"
	ErrSandboxTimeout       Code = "ERR_SANDBOX_TIMEOUT"
	ErrOutOfMemory          Code = "ERR_OUT_OF_MEMORY"
	ErrOutputLimit          Code = "ERR_OUTPUT_LIMIT"
	ErrFileTooLarge         Code = "ERR_FILE_TOO_LARGE"
	ErrDiskFull             Code = "ERR_DISK_FULL"
	ErrPathNotAllowed       Code = "ERR_PATH_NOT_ALLOWED"
	ErrConflict             Code = "ERR_CONFLICT"
	ErrUnsupportedLanguage  Code = "ERR_UNSUPPORTED_LANGUAGE"
	ErrTemplateNotFound     Code = "ERR_TEMPLATE_NOT_FOUND"
	ErrModuleBlocked        Code = "ERR_MODULE_BLOCKED"
	ErrNetworkRestricted    Code = "ERR_NETWORK_RESTRICTED"
	ErrSessionQuotaExceeded Code = "ERR_SESSION_QUOTA_EXCEEDED"
	ErrRateLimited          Code = "ERR_RATE_LIMITED"
	ErrCapacity             Code = "ERR_CAPACITY"
	ErrInternal             Code = "ERR_INTERNAL"
	ErrMethodNotAllowed     Code = "ERR_METHOD_NOT_ALLOWED"
	ErrStorageUnavailable   Code = "ERR_STORAGE_UNAVAILABLE"
	ErrShuttingDown         Code = "ERR_SHUTTING_DOWN"
	ErrForbidden            Code = "ERR_FORBIDDEN"
	ErrInvalidPolicy        Code = "ERR_INVALID_POLICY"
	ErrSubprocessDenied     Code = "ERR_SUBPROCESS_DENIED"
	ErrCPUTimeExceeded      Code = "ERR_CPU_TIME_EXCEEDED"
	ErrModelNotFound        Code = "ERR_MODEL_NOT_FOUND"
	ErrProvider             Code = "ERR_PROVIDER"
	ErrProviderTimeout      Code = "ERR_PROVIDER_TIMEOUT"
	ErrSessionNotFound      Code = "ERR_SESSION_NOT_FOUND"
	ErrTooManyConnections   Code = "ERR_TOO_MANY_CONNECTIONS"
	ErrStorageQuotaExceeded Code = "ERR_STORAGE_QUOTA_EXCEEDED"
	ErrProcessLimit         Code = "ERR_PROCESS_LIMIT"
	ErrNotSupported         Code = "ERR_NOT_SUPPORTED"
	ErrVolumeNotFound       Code = "ERR_VOLUME_NOT_FOUND"
	ErrVolumeInUse          Code = "ERR_VOLUME_IN_USE"
	ErrInvalidHandler       Code = "ERR_INVALID_HANDLER"
	ErrDeviceNotFound       Code = "ERR_DEVICE_NOT_FOUND"
	ErrDeviceInUse          Code = "ERR_DEVICE_IN_USE"
	ErrRegistryNotAllowed   Code = "ERR_REGISTRY_NOT_ALLOWED"
	ErrTemplateNotReady     Code = "ERR_TEMPLATE_NOT_READY"
)

// Codes lists every code above.
var Codes = []Code{
	ErrBadRequest, ErrAuthenticationFailed, ErrSandboxNotFound, ErrNotFound, ErrSandboxState,
	ErrSandboxTimeout, ErrOutOfMemory, ErrOutputLimit, ErrFileTooLarge, ErrDiskFull, ErrPathNotAllowed,
	ErrConflict, ErrUnsupportedLanguage, ErrTemplateNotFound, ErrModuleBlocked, ErrNetworkRestricted,
	ErrSessionQuotaExceeded, ErrRateLimited, ErrCapacity, ErrInternal, ErrMethodNotAllowed,
	ErrStorageUnavailable, ErrShuttingDown, ErrForbidden, ErrInvalidPolicy, ErrSubprocessDenied,
	ErrCPUTimeExceeded, ErrModelNotFound, ErrProvider, ErrProviderTimeout, ErrSessionNotFound,
	ErrTooManyConnections, ErrStorageQuotaExceeded, ErrProcessLimit, ErrNotSupported,
	ErrVolumeNotFound, ErrVolumeInUse, ErrInvalidHandler, ErrDeviceNotFound, ErrDeviceInUse,
	ErrRegistryNotAllowed,
	ErrTemplateNotReady,
}

// Is makes errors.Is(err, client.ErrXxx) true for an *Error of that code.
func (e *Error) Is(target error) bool {
	c, ok := target.(Code)
	return ok && string(c) == e.Code
}
