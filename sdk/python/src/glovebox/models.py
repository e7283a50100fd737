"""Plain data returned by the SDK, parsed from the API's JSON (docs/api.md). Unknown JSON
fields are ignored, so a newer daemon does not break an older SDK."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Union

__all__ = [
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
]

_FRACTION = re.compile(r"\.(\d+)")


def parse_time(s: Optional[str]) -> Optional[datetime]:
    """RFC 3339 → aware datetime (Python 3.9's ``fromisoformat`` wants neither ``Z`` nor
    fractions that are not 3 or 6 digits)."""
    if not s:
        return None
    t = s.strip().replace("Z", "+00:00").replace("z", "+00:00")
    t = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], t, count=1)
    try:
        d = datetime.fromisoformat(t)
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_mb: int
    disk_mb: int
    pids: int

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Limits":
        return cls(cpus=float(d.get("cpus", 0)), memory_mb=int(d.get("memory_mb", 0)),
                   disk_mb=int(d.get("disk_mb", 0)), pids=int(d.get("pids", 0)))


@dataclass(frozen=True)
class SandboxInfo:
    """What the daemon says about a sandbox (``GET /v1/sandboxes/{id}``)."""

    id: str
    template: str
    state: str
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    limits: Limits
    metadata: Dict[str, str]
    network: Dict[str, Any]
    end_reason: Optional[str] = None
    #: Seconds without activity before the idle clock acts; ``None``: no idle clock.
    idle_timeout: Optional[int] = None
    #: The snapshot it started from (a fork's children: the fork's anonymous one).
    snapshot: Optional[str] = None
    #: The sandbox it was forked from.
    parent_id: Optional[str] = None
    #: Its lineage, parent first.
    ancestors: List[str] = field(default_factory=list)
    #: Which kernel its processes run on: ``"process"`` (the jail) or ``"gvisor"``.
    isolation: str = "process"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return cls(
            id=d["id"],
            template=d.get("template", ""),
            state=d.get("state", ""),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            limits=Limits.from_json(d.get("limits") or {}),
            metadata=dict(d.get("metadata") or {}),
            network=dict(d.get("network") or {}),
            end_reason=d.get("end_reason"),
            idle_timeout=d.get("idle_timeout_s"),
            snapshot=d.get("snapshot"),
            parent_id=d.get("parent_id"),
            ancestors=list(d.get("ancestors") or []),
            isolation=d.get("isolation") or "process",
        )


def _decode_output(d: Dict[str, Any], key: str) -> bytes:
    v = d.get(key) or ""
    if d.get("encoding") == "base64":
        return base64.b64decode(v)
    return v.encode("utf-8")


@dataclass
class CommandResult:
    """The end of a command. ``stdout``/``stderr`` are text (invalid UTF-8 replaced);
    ``stdout_raw``/``stderr_raw`` the exact bytes kept (at most ``max_output_bytes`` per
    stream; ``*_truncated`` says more was written, ``*_total_bytes`` how much)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    oom_killed: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    id: int
    signal: Optional[int] = None
    stdout_raw: bytes = b""
    stderr_raw: bytes = b""
    stdout_total_bytes: int = 0
    stderr_total_bytes: int = 0

    @property
    def ok(self) -> bool:
        """Exit code 0 and not timed out."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Dict[str, Any], stdout_raw: Optional[bytes] = None,
                  stderr_raw: Optional[bytes] = None) -> "CommandResult":
        out = _decode_output(d, "stdout") if stdout_raw is None else stdout_raw
        err = _decode_output(d, "stderr") if stderr_raw is None else stderr_raw
        return cls(
            exit_code=int(d.get("exit_code", -1)),
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=bool(d.get("timed_out")),
            oom_killed=bool(d.get("oom_killed")),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            duration_ms=int(d.get("duration_ms", 0)),
            id=int(d.get("id", 0)),
            signal=d.get("signal"),
            stdout_raw=out,
            stderr_raw=err,
            stdout_total_bytes=int(d.get("stdout_bytes", len(out))),
            stderr_total_bytes=int(d.get("stderr_bytes", len(err))),
        )


@dataclass(frozen=True)
class CommandInfo:
    """A command of ``commands.list()``."""

    id: int
    pid: int
    cmd: Union[str, List[str]]
    running: bool
    exit_code: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CommandInfo":
        return cls(id=int(d["id"]), pid=int(d.get("pid", 0)), cmd=d.get("cmd", ""),
                   running=bool(d.get("running")), exit_code=d.get("exit_code"))


@dataclass(frozen=True)
class FileInfo:
    """A file, directory or symlink inside the sandbox. ``type`` is ``file``, ``dir``,
    ``symlink`` or ``other``; ``mtime`` an aware datetime (or None)."""

    path: str
    name: str
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime: Optional[datetime]
    target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        m = d.get("mtime")
        if isinstance(m, (int, float)):
            mtime: Optional[datetime] = datetime.fromtimestamp(m, tz=timezone.utc)
        else:
            mtime = parse_time(m)
        return cls(path=d.get("path", ""), name=d.get("name", ""), type=d.get("type", "other"),
                   size=int(d.get("size", 0)), mode=int(d.get("mode", 0)), uid=int(d.get("uid", 0)),
                   gid=int(d.get("gid", 0)), mtime=mtime, target=d.get("target"))


_MIME = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "latex": "text/latex",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "json": "application/json",
    "javascript": "application/javascript",
    "pdf": "application/pdf",
}


@dataclass
class Result:
    """One rich output of a cell: a MIME bundle. The last expression's value has
    ``is_main_result``; ``display(…)`` calls and matplotlib figures are the others.
    ``png``/``jpeg`` are base64 strings (``png_bytes`` decodes)."""

    is_main_result: bool
    data: Dict[str, Any] = field(default_factory=dict)

    def _get(self, name: str) -> Optional[str]:
        v = self.data.get(_MIME[name])
        return v if v is None or isinstance(v, str) else str(v)

    @property
    def text(self) -> Optional[str]:
        return self._get("text")

    @property
    def html(self) -> Optional[str]:
        return self._get("html")

    @property
    def markdown(self) -> Optional[str]:
        return self._get("markdown")

    @property
    def latex(self) -> Optional[str]:
        return self._get("latex")

    @property
    def svg(self) -> Optional[str]:
        return self._get("svg")

    @property
    def png(self) -> Optional[str]:
        return self._get("png")

    @property
    def jpeg(self) -> Optional[str]:
        return self._get("jpeg")

    @property
    def json(self) -> Any:
        """``application/json``: the parsed value (not a string)."""
        return self.data.get(_MIME["json"])

    @property
    def javascript(self) -> Optional[str]:
        return self._get("javascript")

    @property
    def png_bytes(self) -> Optional[bytes]:
        p = self.png
        return base64.b64decode(p) if p else None

    def formats(self) -> List[str]:
        """Short names of the formats present (``text``, ``png``, …)."""
        return [k for k, mime in _MIME.items() if mime in self.data]

    def __str__(self) -> str:
        return self.text or ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        return cls(is_main_result=bool(d.get("is_main_result")), data=dict(d.get("data") or {}))


@dataclass
class Logs:
    """What the cell printed, chunk by chunk."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """The cell raised: ``name`` is the exception's class (``ZeroDivisionError``;
    ``TimeoutError`` when the cell ran out of time), ``value`` its message."""

    name: str
    value: str
    traceback: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecutionError":
        return cls(name=str(d.get("name", "")), value=str(d.get("value", "")),
                   traceback=str(d.get("traceback", "")))


@dataclass
class Execution:
    """What a cell produced."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: int = 0
    context_restarted: bool = False

    @property
    def text(self) -> Optional[str]:
        """``text/plain`` of the main result (the last expression's value), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Execution":
        logs = d.get("logs") or {}
        err = d.get("error")
        return cls(
            results=[Result.from_json(r) for r in d.get("results") or []],
            logs=Logs(stdout=list(logs.get("stdout") or []), stderr=list(logs.get("stderr") or [])),
            error=ExecutionError.from_json(err) if err else None,
            execution_count=int(d.get("execution_count", 0)),
            context_restarted=bool(d.get("context_restarted")),
        )


@dataclass(frozen=True)
class Context:
    """A code context (a running language kernel) inside a sandbox."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Context":
        return cls(id=d["id"], language=d.get("language", ""), cwd=d.get("cwd", ""))


@dataclass(frozen=True)
class Metrics:
    """Resource use of a sandbox (``GET …/metrics``). ``cpu_percent`` is the average since
    the previous call (100 = one core); ``raw`` keeps every field the daemon sent."""

    cpu_percent: float
    cpu_usage_ms: int
    memory_used_bytes: int
    memory_limit_bytes: int
    disk_used_bytes: int
    disk_limit_bytes: int
    pids: int
    pids_limit: int
    oom_kills: int
    memory_peak_bytes: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Metrics":
        def n(k: str) -> int:
            return int(d.get(k) or 0)

        peak = d.get("memory_peak_bytes")
        return cls(cpu_percent=float(d.get("cpu_percent") or 0.0), cpu_usage_ms=n("cpu_usage_ms"),
                   memory_used_bytes=n("memory_used_bytes"), memory_limit_bytes=n("memory_limit_bytes"),
                   disk_used_bytes=n("disk_used_bytes"), disk_limit_bytes=n("disk_limit_bytes"), pids=n("pids"),
                   pids_limit=n("pids_limit"), oom_kills=n("oom_kills"),
                   memory_peak_bytes=None if peak is None else int(peak), raw=dict(d))
