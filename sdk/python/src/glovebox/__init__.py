"""Glovebox: run untrusted code in disposable, isolated sandboxes on your own machine.

    from glovebox import Sandbox

    with Sandbox.create() as sb:
        print(sb.commands.run("python3 -c 'print(6*7)'").stdout)   # 42
        print(sb.run_code("x = 41\\nx + 1").text)                   # 42

Configuration: ``$GLOVEBOX_URL`` (default ``http://127.0.0.1:7171``) and
``$GLOVEBOX_API_KEY``, or ``url=``/``api_key=`` arguments. ``AsyncSandbox`` is the asyncio
twin. Only the standard library is used.
"""

from ._http import DEFAULT_URL, __version__
from .aio import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncFileStream,
    AsyncPty,
    AsyncPtyHandle,
    AsyncSandbox,
)
from .errors import (
    AuthError,
    CommandExitError,
    ConflictError,
    GloveboxError,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
    QuotaError,
    SandboxGoneError,
    TimeoutError,
)
from .models import (
    CommandInfo,
    CommandResult,
    Context,
    Execution,
    ExecutionError,
    FileInfo,
    Limits,
    Logs,
    Metrics,
    Result,
    SandboxInfo,
)
from .sandbox import CommandHandle, Commands, Files, FileStream, Pty, PtyHandle, Sandbox
from .snapshots import Snapshot, SnapshotInfo
from .volumes import Volume, VolumeInfo

__all__ = [
    "__version__",
    "DEFAULT_URL",
    "Sandbox",
    "Volume",
    "VolumeInfo",
    "Snapshot",
    "SnapshotInfo",
    "Commands",
    "CommandHandle",
    "Files",
    "FileStream",
    "Pty",
    "PtyHandle",
    "AsyncSandbox",
    "AsyncCommands",
    "AsyncCommandHandle",
    "AsyncFiles",
    "AsyncFileStream",
    "AsyncPty",
    "AsyncPtyHandle",
    "SandboxInfo",
    "Limits",
    "CommandResult",
    "CommandInfo",
    "FileInfo",
    "Execution",
    "Result",
    "Logs",
    "ExecutionError",
    "Context",
    "Metrics",
    "GloveboxError",
    "TimeoutError",
    "CommandExitError",
    "SandboxGoneError",
    "NotFoundError",
    "QuotaError",
    "AuthError",
    "InvalidArgumentError",
    "ConflictError",
    "NotSupportedError",
]
