"""Sheepfold: the Python SDK of the Sheepfold code-interpreter sandbox.

    from sheepfold import Sandbox

    with Sandbox.create() as sb:
        ex = sb.run_code("x = 41\nx + 1")
        print(ex.text)  # 42

Standard library only. See README.md.
"""

from ._version import __version__
from .accounts import Account, Admin, Alert, Credits
from .client import Answer, Client, Monitor, Session, SessionExecution, Step, Tokens, Usage
from .commands import CommandHandle, Commands
from .errors import (
    AuthenticationError,
    CapacityError,
    CodeExecutionError,
    ConflictError,
    DiskFullError,
    FileTooLargeError,
    InternalServerError,
    InvalidArgumentError,
    InvalidPolicyError,
    ModelNotFoundError,
    ModuleBlockedError,
    NetworkRestrictedError,
    NotFoundError,
    OutOfMemoryError,
    OutputLimitError,
    PathNotAllowedError,
    PermissionDeniedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    SandboxNotFoundError,
    SandboxStateError,
    SandboxTimeoutError,
    SessionNotFoundError,
    SessionQuotaExceededError,
    SheepfoldConnectionError,
    SheepfoldError,
    TemplateNotFoundError,
    UnsupportedLanguageError,
)
from .events import Event, EventPage, Events, Webhook, WebhookDelivery, Webhooks, verify_webhook
from .files import FilePage, Filesystem, WriteEntry
from .models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    ExecutionError,
    FileInfo,
    Logs,
    PolicyAnswer,
    ProcessInfo,
    Resources,
    Result,
    SandboxInfo,
)
from .ports import Port, PortList
from .sandbox import Sandbox

__all__ = [
    "__version__",
    "Client",
    "Session",
    "SessionExecution",
    "Answer",
    "Step",
    "Tokens",
    "Usage",
    "Monitor",
    "CodeExecutionError",
    "InvalidPolicyError",
    "ModelNotFoundError",
    "ProviderError",
    "ProviderTimeoutError",
    "SessionNotFoundError",
    "Sandbox",
    "Port",
    "PortList",
    "Account",
    "Admin",
    "Alert",
    "Credits",
    "Event",
    "EventPage",
    "Events",
    "Webhook",
    "WebhookDelivery",
    "Webhooks",
    "verify_webhook",
    "FilePage",
    "Filesystem",
    "WriteEntry",
    "Commands",
    "CommandHandle",
    "CodeContext",
    "CommandResult",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "PolicyAnswer",
    "FileInfo",
    "Logs",
    "ProcessInfo",
    "Resources",
    "Result",
    "SandboxInfo",
    "SheepfoldError",
    "AuthenticationError",
    "CapacityError",
    "ConflictError",
    "DiskFullError",
    "FileTooLargeError",
    "InternalServerError",
    "InvalidArgumentError",
    "ModuleBlockedError",
    "NetworkRestrictedError",
    "NotFoundError",
    "OutOfMemoryError",
    "OutputLimitError",
    "PathNotAllowedError",
    "PermissionDeniedError",
    "RateLimitError",
    "SandboxNotFoundError",
    "SandboxStateError",
    "SandboxTimeoutError",
    "SessionQuotaExceededError",
    "SheepfoldConnectionError",
]
