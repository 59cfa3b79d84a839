"""The exceptions of the Sheepfold SDK.

Every error the server reports has the shape
``{"error": {"code": "ERR_...", "message": "...", "request_id": "..."}}``.
The SDK raises it as a :class:`SheepfoldError` subclass chosen by ``code``
(falling back on the HTTP status when the code is unknown). Every exception
keeps the machine ``code`` string, the ``message``, the HTTP ``status`` and
the server's ``request_id``.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "SheepfoldError",
    "AuthenticationError",
    "NotFoundError",
    "SandboxNotFoundError",
    "TemplateNotFoundError",
    "InvalidArgumentError",
    "UnsupportedLanguageError",
    "PermissionDeniedError",
    "PathNotAllowedError",
    "ModuleBlockedError",
    "NetworkRestrictedError",
    "ConflictError",
    "SandboxStateError",
    "SandboxTimeoutError",
    "OutOfMemoryError",
    "OutputLimitError",
    "FileTooLargeError",
    "DiskFullError",
    "RateLimitError",
    "TooManyConnectionsError",
    "StorageQuotaExceededError",
    "SessionQuotaExceededError",
    "SessionNotFoundError",
    "ModelNotFoundError",
    "InvalidPolicyError",
    "ProviderError",
    "ProviderTimeoutError",
    "CodeExecutionError",
    "CapacityError",
    "InternalServerError",
    "SheepfoldConnectionError",
    "ForbiddenError",
    "SubprocessDeniedError",
    "CPUTimeExceededError",
    "ProcessLimitError",
    "NotSupportedError",
    "VolumeNotFoundError",
    "VolumeInUseError",
    "DeviceNotFoundError",
    "DeviceInUseError",
    "RegistryNotAllowedError",
    "TemplateNotReadyError",
    "MethodNotAllowedError",
    "StorageUnavailableError",
    "ShuttingDownError",
    "error_for",
]


class SheepfoldError(Exception):
    """Base of every SDK error.

    Attributes:
        code: the server's machine code (``"ERR_SANDBOX_NOT_FOUND"``...); for
            errors raised by the SDK itself, ``"ERR_CONNECTION"`` or
            ``"ERR_PROTOCOL"``.
        message: the human message.
        status: the HTTP status (``None`` when there was no HTTP response, or
            when the error came inside a stream that had already begun).
        request_id: the server's request id (also sent as ``X-Request-Id``).
        retry_after: seconds the server asked to wait (``Retry-After``), if any.
    """

    default_code = "ERR_INTERNAL"

    def __init__(
        self,
        message: str = "",
        code: Optional[str] = None,
        status: Optional[int] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.code: str = code or self.default_code
        self.message: str = message
        self.status: Optional[int] = status
        self.request_id: Optional[str] = request_id
        self.retry_after: Optional[float] = retry_after

    def __str__(self) -> str:
        s = f"{self.code}: {self.message}" if self.message else self.code
        extra = []
        if self.status is not None:
            extra.append(f"status {self.status}")
        if self.request_id:
            extra.append(f"request {self.request_id}")
        if extra:
            s += " (" + ", ".join(extra) + ")"
        return s

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r}, request_id={self.request_id!r})"
        )


class AuthenticationError(SheepfoldError):
    """401: the API key is missing, malformed or unknown."""

    default_code = "ERR_AUTHENTICATION_FAILED"


class NotFoundError(SheepfoldError):
    """404: a sandbox, file, context, process or route does not exist."""

    default_code = "ERR_NOT_FOUND"


class SandboxNotFoundError(NotFoundError):
    """404 ERR_SANDBOX_NOT_FOUND: no such sandbox (or it belongs to someone else)."""

    default_code = "ERR_SANDBOX_NOT_FOUND"


class VolumeNotFoundError(NotFoundError):
    """404 ERR_VOLUME_NOT_FOUND: the account has no volume of that name."""

    default_code = "ERR_VOLUME_NOT_FOUND"


class DeviceNotFoundError(NotFoundError):
    """404 ERR_DEVICE_NOT_FOUND: the server has no such device (by CDI
    name), or fewer GPUs than asked for."""

    default_code = "ERR_DEVICE_NOT_FOUND"


class TemplateNotFoundError(NotFoundError):
    default_code = "ERR_TEMPLATE_NOT_FOUND"


class InvalidArgumentError(SheepfoldError, ValueError):
    """400: the request was refused as malformed or invalid."""

    default_code = "ERR_BAD_REQUEST"


class InvalidPolicyError(InvalidArgumentError):
    """400 ERR_INVALID_POLICY: a security policy was refused; the message
    names the field."""

    default_code = "ERR_INVALID_POLICY"


class InvalidHandlerError(InvalidArgumentError):
    """400 ERR_INVALID_HANDLER: a batch's code does not parse, or binds no
    handler(item) at its top level; no item ran."""

    default_code = "ERR_INVALID_HANDLER"


class UnsupportedLanguageError(InvalidArgumentError):
    default_code = "ERR_UNSUPPORTED_LANGUAGE"


class PermissionDeniedError(SheepfoldError):
    """403: the operation is not allowed in this sandbox."""

    default_code = "ERR_PATH_NOT_ALLOWED"


class PathNotAllowedError(PermissionDeniedError):
    default_code = "ERR_PATH_NOT_ALLOWED"


class ModuleBlockedError(PermissionDeniedError):
    default_code = "ERR_MODULE_BLOCKED"


class NetworkRestrictedError(PermissionDeniedError):
    default_code = "ERR_NETWORK_RESTRICTED"


class ForbiddenError(PermissionDeniedError):
    """403 ERR_FORBIDDEN: the key may not do this (an admin route, another
    account's resource)."""

    default_code = "ERR_FORBIDDEN"


class RegistryNotAllowedError(ForbiddenError):
    """403 ERR_REGISTRY_NOT_ALLOWED: a template's FROM names an image
    registry the operator does not allow."""

    default_code = "ERR_REGISTRY_NOT_ALLOWED"


class SubprocessDeniedError(PermissionDeniedError):
    """403 ERR_SUBPROCESS_DENIED: the policy's allow_subprocess is false and
    the code tried to start a program."""

    default_code = "ERR_SUBPROCESS_DENIED"


class ConflictError(SheepfoldError):
    """409: the request conflicts with the current state."""

    default_code = "ERR_CONFLICT"


class VolumeInUseError(ConflictError):
    """409 ERR_VOLUME_IN_USE: the volume is mounted by a live sandbox (a
    delete), or read-write by another (a second writer that does not
    share it)."""

    default_code = "ERR_VOLUME_IN_USE"


class DeviceInUseError(ConflictError):
    """409 ERR_DEVICE_IN_USE: the device asked for, or every GPU, is held
    by other live sandboxes."""

    default_code = "ERR_DEVICE_IN_USE"


class SandboxStateError(ConflictError):
    """409 ERR_SANDBOX_STATE: e.g. the sandbox has stopped (see ``message``)."""

    default_code = "ERR_SANDBOX_STATE"


class SandboxTimeoutError(SheepfoldError, TimeoutError):
    """ERR_SANDBOX_TIMEOUT: the sandbox or the operation ran out of time.

    Also a builtin :class:`TimeoutError`.
    """

    default_code = "ERR_SANDBOX_TIMEOUT"


class OutOfMemoryError(SheepfoldError):
    default_code = "ERR_OUT_OF_MEMORY"


class OutputLimitError(SheepfoldError):
    """ERR_OUTPUT_LIMIT: the output passed the cap and the policy's
    output_filtering.stop_on_output_cap stopped the execution."""

    default_code = "ERR_OUTPUT_LIMIT"


class CPUTimeExceededError(SheepfoldError):
    """ERR_CPU_TIME_EXCEEDED: the execution used the policy's
    resource_limits.cpu_time_seconds and was stopped."""

    default_code = "ERR_CPU_TIME_EXCEEDED"


class ProcessLimitError(SheepfoldError):
    """ERR_PROCESS_LIMIT: a process start was refused because the
    sandbox holds its limit of tasks (pids); it succeeds again once some
    end."""

    default_code = "ERR_PROCESS_LIMIT"


class NotSupportedError(SheepfoldError):
    """501 ERR_NOT_SUPPORTED: this server cannot do what was asked (pause
    a sandbox on a runtime that cannot checkpoint, or one with a
    network); nothing changed."""

    default_code = "ERR_NOT_SUPPORTED"


class MethodNotAllowedError(InvalidArgumentError):
    """405 ERR_METHOD_NOT_ALLOWED: the route does not take this method."""

    default_code = "ERR_METHOD_NOT_ALLOWED"


class FileTooLargeError(SheepfoldError):
    """413 ERR_FILE_TOO_LARGE: an upload exceeds the server's limit."""

    default_code = "ERR_FILE_TOO_LARGE"


class DiskFullError(SheepfoldError):
    default_code = "ERR_DISK_FULL"


class RateLimitError(SheepfoldError):
    """429: too many requests. The SDK already retried (see ``retry_after``)."""

    default_code = "ERR_RATE_LIMITED"


class SessionQuotaExceededError(RateLimitError):
    default_code = "ERR_SESSION_QUOTA_EXCEEDED"


class TooManyConnectionsError(RateLimitError):
    """429: this key or account holds as many streams (executions, event
    streams, downloads, previews...) open as it may; close one first."""

    default_code = "ERR_TOO_MANY_CONNECTIONS"


class StorageQuotaExceededError(RateLimitError):
    """429: the account keeps as many records of a kind (alerts) as the
    server lets one account keep, none of which may go to make room:
    acknowledge some alerts first. Retrying alone does not help."""

    default_code = "ERR_STORAGE_QUOTA_EXCEEDED"


class SessionNotFoundError(NotFoundError):
    """404 ERR_SESSION_NOT_FOUND: no such session (or it belongs to someone else)."""

    default_code = "ERR_SESSION_NOT_FOUND"


class ModelNotFoundError(NotFoundError):
    """404 ERR_MODEL_NOT_FOUND: the server's providers do not serve the model."""

    default_code = "ERR_MODEL_NOT_FOUND"


class TemplateNotReadyError(SheepfoldError):
    """502 ERR_TEMPLATE_NOT_READY: the template's start command ended, or
    its ready check did not hold in time, as the sandbox started (the
    sandbox is gone; ``details["output"]`` is the command's last output)."""

    default_code = "ERR_TEMPLATE_NOT_READY"


class ProviderError(SheepfoldError):
    """502 ERR_PROVIDER: the model's provider failed or answered nonsense."""

    default_code = "ERR_PROVIDER"


class ProviderTimeoutError(ProviderError, TimeoutError):
    """504 ERR_PROVIDER_TIMEOUT: the model's provider did not answer in time."""

    default_code = "ERR_PROVIDER_TIMEOUT"


class CodeExecutionError(SheepfoldError):
    """The code itself raised (an execution's ``error`` without a Sheepfold
    code): ``name`` is the exception's class, ``traceback`` its traceback.
    ``ERR_CODE_EXCEPTION`` is the SDK's own code for it."""

    default_code = "ERR_CODE_EXCEPTION"

    def __init__(self, message: str = "", code: Optional[str] = None, status: Optional[int] = None,
                 request_id: Optional[str] = None, retry_after: Optional[float] = None,
                 name: str = "", traceback: str = "") -> None:
        super().__init__(message, code=code, status=status, request_id=request_id, retry_after=retry_after)
        self.name = name
        self.traceback = traceback


class CapacityError(SheepfoldError):
    """503 ERR_CAPACITY: the server cannot take more sandboxes right now."""

    default_code = "ERR_CAPACITY"


class StorageUnavailableError(CapacityError):
    """503 ERR_STORAGE_UNAVAILABLE: the server's database cannot be reached
    for now; retry."""

    default_code = "ERR_STORAGE_UNAVAILABLE"


class ShuttingDownError(CapacityError):
    """503 ERR_SHUTTING_DOWN: the server is draining; retry on another."""

    default_code = "ERR_SHUTTING_DOWN"


class InternalServerError(SheepfoldError):
    """500 and other server-side failures."""

    default_code = "ERR_INTERNAL"


class SheepfoldConnectionError(SheepfoldError, ConnectionError):
    """The server could not be reached, or the connection broke."""

    default_code = "ERR_CONNECTION"


_BY_CODE: Dict[str, Type[SheepfoldError]] = {
    "ERR_BAD_REQUEST": InvalidArgumentError,
    "ERR_AUTHENTICATION_FAILED": AuthenticationError,
    "ERR_SANDBOX_NOT_FOUND": SandboxNotFoundError,
    "ERR_NOT_FOUND": NotFoundError,
    "ERR_SANDBOX_STATE": SandboxStateError,
    "ERR_SANDBOX_TIMEOUT": SandboxTimeoutError,
    "ERR_OUT_OF_MEMORY": OutOfMemoryError,
    "ERR_OUTPUT_LIMIT": OutputLimitError,
    "ERR_FILE_TOO_LARGE": FileTooLargeError,
    "ERR_DISK_FULL": DiskFullError,
    "ERR_PATH_NOT_ALLOWED": PathNotAllowedError,
    "ERR_CONFLICT": ConflictError,
    "ERR_UNSUPPORTED_LANGUAGE": UnsupportedLanguageError,
    "ERR_INVALID_POLICY": InvalidPolicyError,
    "ERR_TEMPLATE_NOT_FOUND": TemplateNotFoundError,
    "ERR_MODULE_BLOCKED": ModuleBlockedError,
    "ERR_NETWORK_RESTRICTED": NetworkRestrictedError,
    "ERR_SESSION_QUOTA_EXCEEDED": SessionQuotaExceededError,
    "ERR_RATE_LIMITED": RateLimitError,
    "ERR_TOO_MANY_CONNECTIONS": TooManyConnectionsError,
    "ERR_STORAGE_QUOTA_EXCEEDED": StorageQuotaExceededError,
    "ERR_CAPACITY": CapacityError,
    "ERR_INTERNAL": InternalServerError,
    "ERR_SESSION_NOT_FOUND": SessionNotFoundError,
    "ERR_MODEL_NOT_FOUND": ModelNotFoundError,
    "ERR_PROVIDER": ProviderError,
    "ERR_PROVIDER_TIMEOUT": ProviderTimeoutError,
    "ERR_FORBIDDEN": ForbiddenError,
    "ERR_SUBPROCESS_DENIED": SubprocessDeniedError,
    "ERR_CPU_TIME_EXCEEDED": CPUTimeExceededError,
    "ERR_PROCESS_LIMIT": ProcessLimitError,
    "ERR_NOT_SUPPORTED": NotSupportedError,
    "ERR_VOLUME_NOT_FOUND": VolumeNotFoundError,
    "ERR_VOLUME_IN_USE": VolumeInUseError,
    "ERR_INVALID_HANDLER": InvalidHandlerError,
    "ERR_DEVICE_NOT_FOUND": DeviceNotFoundError,
    "ERR_DEVICE_IN_USE": DeviceInUseError,
    "ERR_REGISTRY_NOT_ALLOWED": RegistryNotAllowedError,
    "ERR_TEMPLATE_NOT_READY": TemplateNotReadyError,
    "ERR_METHOD_NOT_ALLOWED": MethodNotAllowedError,
    "ERR_STORAGE_UNAVAILABLE": StorageUnavailableError,
    "ERR_SHUTTING_DOWN": ShuttingDownError,
}

_BY_STATUS: Dict[int, Type[SheepfoldError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    408: SandboxTimeoutError,
    409: ConflictError,
    413: FileTooLargeError,
    429: RateLimitError,
    503: CapacityError,
    507: DiskFullError,
}


def error_for(
    code: Optional[str],
    message: str,
    status: Optional[int] = None,
    request_id: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> SheepfoldError:
    """Build the exception for a server error (by code, else by status)."""
    cls = _BY_CODE.get(code or "")
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status)
        if cls is None:
            cls = InternalServerError if status >= 500 else SheepfoldError
    if cls is None:
        cls = SheepfoldError
    return cls(message, code=code or cls.default_code, status=status,
               request_id=request_id, retry_after=retry_after)
