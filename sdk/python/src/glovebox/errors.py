"""Typed exceptions. Every error the daemon returns is ``{"error": {"code", "message",
"reason"?}}``; the stable ``code`` (and the HTTP status) pick the class, and the class keeps
both so callers can branch on either.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult

__all__ = [
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


class GloveboxError(Exception):
    """Base of every error this SDK raises.

    ``code`` is the daemon's stable machine code (``sandbox_gone``, ``invalid_request``, …)
    or one of the SDK's own (``connection_error``, ``request_timeout``, ``not_supported``,
    ``protocol_error``); ``status`` is the HTTP status when there was a response.
    """

    def __init__(self, message: str, *, code: Optional[str] = None, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self) -> str:
        head = f"{self.code}: " if self.code else ""
        tail = f" (HTTP {self.status})" if self.status else ""
        return f"{head}{self.message}{tail}"


class TimeoutError(GloveboxError, builtins.TimeoutError):
    """A time budget ran out: an HTTP request got no answer in time, or (with
    ``check=True``) a command hit its timeout. Also a builtin ``TimeoutError``, so
    ``except TimeoutError`` works whichever one is in scope.

    ``result`` is the command's result when a command timed out.
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = "timeout",
        status: Optional[int] = None,
        result: Optional["CommandResult"] = None,
    ) -> None:
        GloveboxError.__init__(self, message, code=code, status=status)
        self.result = result


class CommandExitError(GloveboxError):
    """A command ended with a non-zero exit code (raised only with ``check=True``)."""

    def __init__(self, result: "CommandResult") -> None:
        msg = f"command exited with code {result.exit_code}"
        if result.oom_killed:
            msg += " (killed by the out-of-memory killer)"
        err = result.stderr.strip()
        if err:
            msg += f": {err[-500:]}"
        super().__init__(msg, code="command_exit")
        self.result = result
        self.exit_code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr


class SandboxGoneError(GloveboxError):
    """The sandbox has ended (410 ``sandbox_gone``). ``reason`` is one of ``timeout``,
    ``killed``, ``oom``, ``error``, ``daemon_restart``, ``idle``."""

    def __init__(self, message: str, *, reason: Optional[str] = None, code: Optional[str] = "sandbox_gone",
                 status: Optional[int] = 410) -> None:
        super().__init__(message, code=code, status=status)
        self.reason = reason


class NotFoundError(GloveboxError):
    """404: no such sandbox, template, file, context, command or route."""


class QuotaError(GloveboxError):
    """429: a limit on sandboxes or requests was reached."""


class AuthError(GloveboxError):
    """401: missing or wrong API key."""


class InvalidArgumentError(GloveboxError):
    """400 (and 413/415): the request was refused as malformed or out of bounds; the message
    names what was wrong."""


class ConflictError(GloveboxError):
    """409: e.g. the file exists, the directory is not empty, the command is still running."""


class NotSupportedError(GloveboxError):
    """The daemon has no such route: it predates the feature (e.g. network policies)."""


# Every code the daemon returns (the Rust enum `glovebox_proto::api::ErrorCode`; a test in
# crates/glovebox-openapi checks that this table names exactly that set). The code decides the
# class; the status is the fallback for a code this SDK does not know.
_BY_CODE: Dict[str, Type[GloveboxError]] = {
    "invalid_request": InvalidArgumentError,
    "invalid_path": InvalidArgumentError,
    "not_a_directory": InvalidArgumentError,
    "is_a_directory": InvalidArgumentError,
    "spawn_failed": InvalidArgumentError,
    "unauthorized": AuthError,
    "forbidden": GloveboxError,
    "permission_denied": GloveboxError,
    "sandbox_not_found": NotFoundError,
    "template_not_found": NotFoundError,
    "context_not_found": NotFoundError,
    "command_not_found": NotFoundError,
    "secret_not_found": NotFoundError,
    "volume_not_found": NotFoundError,
    "snapshot_not_found": NotFoundError,
    "file_not_found": NotFoundError,
    "not_found": NotFoundError,
    "sandbox_gone": SandboxGoneError,
    "conflict": ConflictError,
    "volume_in_use": ConflictError,
    "sandbox_paused": ConflictError,
    "file_exists": ConflictError,
    "directory_not_empty": ConflictError,
    "quota_exceeded": QuotaError,
    "unavailable": GloveboxError,
    "start_failed": GloveboxError,
    "build_failed": GloveboxError,
    "snapshot_failed": GloveboxError,
    "disk_full": GloveboxError,
    "agent_error": GloveboxError,
    "port_not_listening": GloveboxError,
    "hibernate_unavailable": NotSupportedError,
    "internal": GloveboxError,
}

_BY_STATUS: Dict[int, Type[GloveboxError]] = {
    400: InvalidArgumentError,
    401: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidArgumentError,
    415: InvalidArgumentError,
    429: QuotaError,
}


def error_from_body(status: Optional[int], body: Any) -> GloveboxError:
    """The exception for an error response (``body`` is the parsed JSON, or raw text)."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        code = detail.get("code")
        message = str(detail.get("message") or code or "error")
        reason = detail.get("reason")
    else:
        code = None
        text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body or "")
        message = text.strip()[:500] or f"HTTP {status}"
        reason = None
    return make_error(status, code, message, reason)


def make_error(status: Optional[int], code: Optional[str], message: str,
               reason: Optional[str] = None) -> GloveboxError:
    if code == "sandbox_gone" or status == 410:
        return SandboxGoneError(message, reason=reason, code=code or "sandbox_gone", status=status)
    if code == "unauthorized" and "GLOVEBOX_API_KEY" not in message:
        message += " (set GLOVEBOX_API_KEY or pass api_key=)"
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status or 0) or GloveboxError
    return cls(message, code=code, status=status)
