"""The synchronous client: ``Sandbox`` with its ``commands`` and ``files``, and the code
interpreter. Each method is one (sometimes streamed) call of docs/api.md."""

from __future__ import annotations

import base64
import codecs
import math
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from . import errors
from ._http import DEFAULT_REQUEST_TIMEOUT, StreamResponse, Transport
from .errors import GloveboxError, InvalidArgumentError, NotFoundError, NotSupportedError, SandboxGoneError
from .models import (
    CommandInfo,
    CommandResult,
    Context,
    Execution,
    ExecutionError,
    FileInfo,
    Logs,
    Metrics,
    Result,
    SandboxInfo,
)
from .snapshots import SnapshotInfo
from .volumes import VolumeSpec, mounts_body

__all__ = ["Sandbox", "Commands", "CommandHandle", "Files", "FileStream"]

#: The daemon's per-command and per-cell time budget when none is given (seconds): the
#: `TimeBudget` default the OpenAPI spec publishes (a Rust test checks they agree). Used only
#: to size socket timeouts; the budget itself is left to the daemon.
DEFAULT_COMMAND_TIMEOUT = 60.0
# How much longer than a command's own budget the HTTP call may take (start, teardown,
# reporting): the daemon enforces the budget, the socket timeout only catches a hung daemon.
_EXEC_MARGIN = 30.0
# Cells may also have to start their kernel (up to 60 s with preloaded modules).
_CELL_MARGIN = 90.0
_CHUNK = 64 * 1024

OutputCallback = Callable[[str], Any]
Cmd = Union[str, Sequence[str]]
Data = Union[str, bytes, bytearray, memoryview, Any]


def _ms(seconds: float, what: str) -> int:
    if seconds < 0:
        raise InvalidArgumentError(f"{what} must not be negative", code="invalid_request")
    return int(math.ceil(seconds * 1000))


def _budget(timeout: Optional[float], default: float, margin: float) -> Optional[float]:
    """Socket timeout for a call that runs user code for up to `timeout` seconds
    (None: the daemon's default; 0: unbounded)."""
    if timeout is None:
        return default + margin
    if timeout == 0:
        return None
    return timeout + margin


def _check(result: CommandResult, check: bool) -> CommandResult:
    if check:
        if result.timed_out:
            raise errors.TimeoutError(f"command {result.id} timed out after {result.duration_ms} ms",
                                      code="command_timeout", result=result)
        if result.exit_code != 0:
            raise errors.CommandExitError(result)
    return result


class Sandbox:
    """One sandbox on a Glovebox daemon.

    Make one with :meth:`create` (or attach with :meth:`connect`). As a context manager it
    is always killed on exit, whether the block raised or not::

        with Sandbox.create() as sb:
            print(sb.commands.run("echo hi").stdout)
    """

    def __init__(self, sandbox_id: str, *, transport: Transport, info: Optional[SandboxInfo] = None) -> None:
        self._id = sandbox_id
        self._t = transport
        self._info = info
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)

    # -- lifecycle ----------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[float] = 300,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        disk_mb: Optional[int] = None,
        pids: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Union[None, str, Mapping[str, Any]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        idle_timeout: Optional[float] = None,
        on_idle: Optional[str] = None,
        volumes: Optional[Sequence[VolumeSpec]] = None,
        snapshot: Optional[str] = None,
        isolation: Optional[str] = None,
    ) -> "Sandbox":
        """Creates a sandbox. ``timeout`` is its lifetime in seconds (it is destroyed then,
        whatever runs; extend with :meth:`set_timeout`). ``network`` is a policy object
        (``{"mode": "deny-all"}``) or just its mode. ``url``/``api_key`` default to
        ``$GLOVEBOX_URL`` / ``$GLOVEBOX_API_KEY``. ``idle_timeout`` (seconds) stops it once
        nothing has run in it or talked to it for that long (reason ``idle``); with
        ``on_idle="pause"`` it is paused instead. ``volumes`` mounts volumes (see
        :class:`Volume`): ``["data:/data", "ref:/ref:ro"]`` or ``{"name", "path", "read_only"}``
        dicts. ``snapshot`` starts it from one of your snapshots (its files are there at once;
        its template is the snapshot's). ``isolation`` is which kernel its processes run on:
        ``"process"`` (the process jail) or ``"gvisor"`` (gVisor's user-space kernel, see
        docs/gvisor.md); ``None`` leaves it to the template, else the daemon's default. A value
        the daemon does not know raises :class:`InvalidArgumentError` (``invalid_request``)."""
        t = Transport(url, api_key, request_timeout)
        body = _create_body(template, timeout, cpus, memory_mb, disk_mb, pids, env, metadata, network)
        if idle_timeout is not None:
            body["idle_timeout_s"] = int(math.ceil(idle_timeout))
        if on_idle is not None:
            body["on_idle"] = on_idle
        mounts = mounts_body(volumes)
        if mounts:
            body["volumes"] = mounts
        if snapshot is not None:
            body["snapshot"] = snapshot
        if isolation is not None:
            body["isolation"] = isolation
        info = SandboxInfo.from_json(t.request("POST", "/v1/sandboxes", json=body).json())
        return cls(info.id, transport=t, info=info)

    @classmethod
    def connect(cls, sandbox_id: str, url: Optional[str] = None, api_key: Optional[str] = None,
                request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "Sandbox":
        """Attaches to a running sandbox (raises ``SandboxGoneError``/``NotFoundError``)."""
        t = Transport(url, api_key, request_timeout)
        sb = cls(sandbox_id, transport=t)
        sb.info()
        return sb

    @classmethod
    def list(cls, metadata: Optional[Mapping[str, str]] = None, url: Optional[str] = None,
             api_key: Optional[str] = None) -> List[SandboxInfo]:
        """Running sandboxes, optionally only those whose metadata has all these pairs."""
        t = Transport(url, api_key)
        q = None
        if metadata:
            for k, v in metadata.items():
                if "," in f"{k}{v}" or "=" in str(k):
                    raise InvalidArgumentError("metadata filter keys may not contain ',' or '=', values not ','",
                                               code="invalid_request")
            q = {"metadata": ",".join(f"{k}={v}" for k, v in metadata.items())}
        r = t.request("GET", "/v1/sandboxes", query=q).json() or {}
        return [SandboxInfo.from_json(s) for s in r.get("sandboxes", [])]

    @property
    def id(self) -> str:
        return self._id

    @property
    def sandbox_id(self) -> str:
        """Alias of :attr:`id` (E2B's name)."""
        return self._id

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{quote(self._id, safe='')}{suffix}"

    def info(self) -> SandboxInfo:
        """Current state; raises ``SandboxGoneError`` (with ``reason``) once it has ended."""
        self._info = SandboxInfo.from_json(self._t.request("GET", self._path()).json())
        return self._info

    def is_running(self) -> bool:
        try:
            return self.info().state in ("running", "starting")
        except (SandboxGoneError, NotFoundError):
            return False

    def set_timeout(self, seconds: float) -> SandboxInfo:
        """Moves the lifetime deadline to now + ``seconds``."""
        body = {"timeout_s": int(math.ceil(seconds))}
        self._info = SandboxInfo.from_json(self._t.request("POST", self._path("/timeout"), json=body).json())
        return self._info

    def set_metadata(self, metadata: Mapping[str, str]) -> SandboxInfo:
        """Replaces the sandbox's metadata (the whole set), live; list filters see it at once."""
        return self._update({"metadata": dict(metadata)})

    def set_idle_timeout(self, seconds: float) -> SandboxInfo:
        """Sets the idle timeout, live: the idle clock uses it from its next check (measured
        from the last activity); 0 turns the idle clock off. What it does at the end
        (``on_idle``) stays as created."""
        return self._update({"idle_timeout_s": int(math.ceil(seconds))})

    def _update(self, body: Dict[str, Any]) -> SandboxInfo:
        self._info = SandboxInfo.from_json(self._t.request("PATCH", self._path(), json=body).json())
        return self._info

    def pause(self) -> SandboxInfo:
        """Pauses the sandbox: its processes frozen (memory kept), its clocks stopped with the
        lifetime left kept. Idempotent. Any command, file or code call resumes it."""
        self._info = SandboxInfo.from_json(self._t.request("POST", self._path("/pause")).json())
        return self._info

    def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox (its lifetime clock restarts with what was left).
        Idempotent."""
        self._info = SandboxInfo.from_json(self._t.request("POST", self._path("/resume")).json())
        return self._info

    def snapshot(self, name: str) -> "SnapshotInfo":
        """Snapshots the sandbox's files as ``name`` (it is frozen for the copy, then thawed
        unless it was paused). Processes and memory are not kept. ``ConflictError`` if the name
        is taken; code ``snapshot_failed`` beyond its disk cap or 128 directory levels."""
        r = self._t.request("POST", self._path("/snapshots"), json={"name": name})
        return SnapshotInfo.from_json(r.json())

    def fork(self, count: int = 1) -> List["Sandbox"]:
        """``count`` (1-20) new sandboxes starting from this one's current files, each with a
        copy of its network policy, limits, environment and labels; their info shows
        ``parent_id`` and ``ancestors``. Running processes are NOT copied: each child starts
        with nothing running."""
        r = self._t.request("POST", self._path("/fork"), json={"count": int(count)}).json() or {}
        out = []
        for s in r.get("sandboxes", []):
            info = SandboxInfo.from_json(s)
            out.append(Sandbox(info.id, transport=self._t, info=info))
        return out

    def expose(self, port: int, public: bool = False) -> str:
        """Exposes ``port`` (a server listening inside the sandbox) and returns its preview URL,
        ``http://PORT-ID.<domain>:<daemon port>/``: with the port's token in it
        (``?gb_token=``) unless ``public``, in which case it needs no credential."""
        body = {"public": bool(public)}
        p = self._t.request("POST", self._path(f"/ports/{int(port)}"), json=body).json()
        return p["url"] if p["public"] else f"{p['url']}?gb_token={p['token']}"

    def kill(self) -> bool:
        """Destroys the sandbox and everything in it. False if it had already ended."""
        try:
            self._t.request("DELETE", self._path())
        except (SandboxGoneError, NotFoundError):
            return False
        return True

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, tp: Any, exc: Any, tb: Any) -> None:
        try:
            self.kill()
        except GloveboxError:
            # Never hide the exception that ended the block behind a failed cleanup.
            if exc is None:
                raise

    def __repr__(self) -> str:
        return f"Sandbox(id={self._id!r}, url={self._t.url!r})"

    # -- code interpreter ---------------------------------------------------------------

    def run_code(
        self,
        code: str,
        language: Optional[str] = "python",
        context: Union[None, str, Context] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
    ) -> Execution:
        """Runs a cell in a stateful context (the sandbox's default one of ``language``, or
        ``context``, whose language wins). An exception in the cell is not raised: it is
        ``Execution.error`` (``name == "TimeoutError"`` when ``timeout`` seconds ran out;
        default 60; ``0`` means only the sandbox lifetime bounds the cell, as for commands).
        With callbacks, events are delivered as they happen."""
        body: Dict[str, Any] = {"code": code}
        if context is not None:
            body["context_id"] = context.id if isinstance(context, Context) else str(context)
        elif language:
            body["language"] = language
        if timeout is not None:
            body["timeout_ms"] = _ms(timeout, "timeout")
        if env:
            body["env"] = dict(env)
        budget = _budget(timeout, DEFAULT_COMMAND_TIMEOUT, _CELL_MARGIN)
        if not (on_stdout or on_stderr or on_result or on_error):
            return Execution.from_json(self._t.request("POST", self._path("/code"), json=body, timeout=budget).json())
        s = self._t.stream("POST", self._path("/code"), json=body, headers={"Accept": "application/x-ndjson"},
                           timeout=budget)
        return self._read_code_stream(s, on_stdout, on_stderr, on_result, on_error)

    def _read_code_stream(self, s: StreamResponse, on_stdout: Optional[OutputCallback],
                          on_stderr: Optional[OutputCallback], on_result: Optional[Callable[[Result], Any]],
                          on_error: Optional[Callable[[ExecutionError], Any]]) -> Execution:
        ex = Execution(logs=Logs())
        # An error is delivered once we know it is the cell's and not the daemon's (the
        # daemon reports its own failures as a last `GloveboxError` with no `end`).
        pending: Optional[ExecutionError] = None
        with s:
            for ev in s.iter_lines():
                typ = ev.get("type")
                if pending is not None:
                    ex.error = pending
                    if on_error:
                        on_error(pending)
                    pending = None
                if typ == "stdout":
                    ex.logs.stdout.append(ev.get("text", ""))
                    if on_stdout:
                        on_stdout(ev.get("text", ""))
                elif typ == "stderr":
                    ex.logs.stderr.append(ev.get("text", ""))
                    if on_stderr:
                        on_stderr(ev.get("text", ""))
                elif typ == "result":
                    r = Result.from_json(ev)
                    ex.results.append(r)
                    if on_result:
                        on_result(r)
                elif typ == "error":
                    pending = ExecutionError.from_json(ev)
                elif typ == "end":
                    ex.execution_count = int(ev.get("execution_count", 0))
                    ex.context_restarted = bool(ev.get("context_restarted"))
                    return ex
        if pending is not None and pending.name == "GloveboxError":
            raise self._lost(pending.value)
        raise self._lost("the code stream ended before the cell did")

    def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> Context:
        """A new, isolated context (its own kernel and variables)."""
        body: Dict[str, Any] = {"language": language}
        if cwd is not None:
            body["cwd"] = cwd
        return Context.from_json(self._t.request("POST", self._path("/contexts"), json=body,
                                                 timeout=_budget(None, DEFAULT_COMMAND_TIMEOUT, _CELL_MARGIN)).json())

    def list_code_contexts(self) -> List[Context]:
        r = self._t.request("GET", self._path("/contexts")).json() or {}
        return [Context.from_json(c) for c in r.get("contexts", [])]

    def restart_code_context(self, context: Union[str, Context]) -> Context:
        """Restarts the context's kernel: its state is cleared."""
        cid = context.id if isinstance(context, Context) else str(context)
        return Context.from_json(self._t.request("POST", self._path(f"/contexts/{quote(cid, safe='')}/restart"),
                                                 timeout=_budget(None, DEFAULT_COMMAND_TIMEOUT, _CELL_MARGIN)).json())

    def remove_code_context(self, context: Union[str, Context]) -> None:
        cid = context.id if isinstance(context, Context) else str(context)
        self._t.request("DELETE", self._path(f"/contexts/{quote(cid, safe='')}"))

    # -- network and metrics (routes newer daemons add) --------------------------------

    def _optional_route(self, method: str, suffix: str, what: str, json: Any = None) -> Any:
        try:
            return self._t.request(method, self._path(suffix), json=json).json()
        except NotFoundError as e:
            if e.code == "not_found":  # no such route (a missing sandbox is sandbox_not_found)
                raise NotSupportedError(
                    f"{what} is not supported by this daemon ({method} /v1/sandboxes/{{id}}{suffix} is "
                    "not a route; upgrade glovebox)", code="not_supported", status=e.status) from e
            raise

    def update_network(
        self,
        network: Union[None, str, Mapping[str, Any]] = None,
        *,
        mode: Optional[str] = None,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> Any:
        """Replaces the sandbox's network policy (``PUT …/network``): ``mode`` is
        ``deny-all``, ``allow-list`` or ``allow-all``; ``allow``/``deny`` are rules like
        ``"198.51.100.0/24:443"``. ``network`` may give the whole policy object (the keywords
        override its fields). Returns the updated :class:`SandboxInfo` (or the daemon's
        answer as is, if it is not a sandbox). Raises ``NotSupportedError`` on daemons
        without the route."""
        body = _network_body(network) or {}
        for k, v in (("mode", mode), ("allow", allow), ("deny", deny)):
            if v is not None:
                body[k] = v if isinstance(v, str) else list(v)
        r = self._optional_route("PUT", "/network", "changing the network policy", json=body)
        if isinstance(r, dict) and "id" in r and "state" in r:
            self._info = SandboxInfo.from_json(r)
            return self._info
        return r

    def egress_log(self) -> Any:
        """Connections the sandbox attempted (``GET …/egress``), as the daemon returns them.
        Raises ``NotSupportedError`` on daemons without the route."""
        return self._optional_route("GET", "/egress", "the egress log")

    def metrics(self) -> Metrics:
        """CPU, memory, disk and process use against the sandbox's limits
        (``GET …/metrics``). Raises ``NotSupportedError`` on daemons without the route."""
        return Metrics.from_json(self._optional_route("GET", "/metrics", "sandbox metrics") or {})

    def usage(self) -> Dict[str, Any]:
        """Metered use (``GET …/usage``): ``cpu_seconds``, ``memory_gib_seconds``,
        ``memory_peak_bytes``, ``wall_seconds``, ``egress_bytes_up``/``down``; also after the
        sandbox ended."""
        return self._optional_route("GET", "/usage", "usage metering") or {}

    def events(self) -> List[Dict[str, Any]]:
        """The sandbox's lifecycle events (created, adopted, ended with a reason), oldest first;
        also after it ended."""
        r = self._optional_route("GET", "/events", "lifecycle events")
        if isinstance(r, dict):
            return list(r.get("events", []))
        return list(r or [])

    def keepalive(self) -> None:
        """Counts as activity for the idle clock (``POST …/keepalive``)."""
        self._optional_route("POST", "/keepalive", "keep-alive", json={})

    # -- helpers ------------------------------------------------------------------------

    def _lost(self, message: str) -> GloveboxError:
        """The error for a stream that broke off: the sandbox's end if it has ended."""
        try:
            self.info()
        except SandboxGoneError as gone:
            return gone
        except GloveboxError:
            pass
        return GloveboxError(message, code="stream_error")


def _create_body(template: Optional[str], timeout: Optional[float], cpus: Optional[float],
                 memory_mb: Optional[int], disk_mb: Optional[int], pids: Optional[int],
                 env: Optional[Mapping[str, str]], metadata: Optional[Mapping[str, str]],
                 network: Union[None, str, Mapping[str, Any]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if template is not None:
        body["template"] = template
    if timeout is not None:
        body["timeout_s"] = int(math.ceil(timeout))
    res = {k: v for k, v in (("cpus", cpus), ("memory_mb", memory_mb), ("disk_mb", disk_mb), ("pids", pids))
           if v is not None}
    if res:
        body["resources"] = res
    if env:
        body["env"] = dict(env)
    if metadata:
        body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    if network is not None:
        body["network"] = _network_body(network)
    return body


def _network_body(network: Union[None, str, Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if network is None:
        return None
    return {"mode": network} if isinstance(network, str) else dict(network)


class Commands:
    """``sb.commands``: run commands, inspect and steer background ones."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def run(
        self,
        cmd: Cmd,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[None, str, bytes] = None,
        background: bool = False,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        output_tail_bytes: Optional[int] = None,
    ) -> Any:
        """Runs ``cmd`` (a string for ``/bin/sh -c``, or an argv list) and returns its
        :class:`CommandResult`.

        ``timeout``: seconds (float; default 60, ``0`` = only the sandbox lifetime).
        ``stdin``: given, then closed. ``on_stdout``/``on_stderr`` get decoded text as it is
        produced. ``check=True`` raises ``CommandExitError`` for a non-zero exit and
        ``glovebox.TimeoutError`` for a timeout (default: both are just fields of the
        result, like ``subprocess.run``). ``background=True`` returns a
        :class:`CommandHandle` at once (stdin stays open for ``send_stdin``).
        ``max_output_bytes``: output kept per stream; past it the first part and the last
        ``output_tail_bytes`` (default half the cap; ``0``: the first part only) are kept,
        with a ``[glovebox: N bytes dropped]`` line between them.
        """
        body: Dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else [str(a) for a in cmd], "encoding": "base64"}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if stdin is not None:
            if isinstance(stdin, str):
                body["stdin"] = stdin
            else:
                body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
        if timeout is not None:
            body["timeout_ms"] = _ms(timeout, "timeout")
        if max_output_bytes is not None:
            body["max_output_bytes"] = int(max_output_bytes)
        if output_tail_bytes is not None:
            body["output_tail_bytes"] = int(output_tail_bytes)
        path = self._sb._path("/exec")
        if background:
            if on_stdout or on_stderr:
                raise InvalidArgumentError("output callbacks need a foreground command (background commands "
                                           "report their output with wait())", code="invalid_request")
            body["background"] = True
            r = self._sb._t.request("POST", path, json=body).json()
            return CommandHandle(self._sb, int(r["id"]), int(r.get("pid", 0)))
        budget = _budget(timeout, DEFAULT_COMMAND_TIMEOUT, _EXEC_MARGIN)
        if on_stdout or on_stderr:
            s = self._sb._t.stream("POST", path, json=body, headers={"Accept": "application/x-ndjson"},
                                   timeout=budget)
            return _check(self._read_exec_stream(s, on_stdout, on_stderr), check)
        r = self._sb._t.request("POST", path, json=body, timeout=budget).json()
        return _check(CommandResult.from_json(r), check)

    def _read_exec_stream(self, s: StreamResponse, on_stdout: Optional[OutputCallback],
                          on_stderr: Optional[OutputCallback]) -> CommandResult:
        raw: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        dec = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in raw}
        cbs = {"stdout": on_stdout, "stderr": on_stderr}
        with s:
            for ev in s.iter_lines():
                typ = ev.get("type")
                if typ in raw:
                    b = base64.b64decode(ev.get("data") or "")
                    raw[typ].append(b)
                    cb = cbs[typ]
                    if cb:
                        text = dec[typ].decode(b)
                        if text:
                            cb(text)
                elif typ == "exited":
                    for k, cb in cbs.items():
                        rest = dec[k].decode(b"", final=True)
                        if cb and rest:
                            cb(rest)
                    return CommandResult.from_json(ev, stdout_raw=b"".join(raw["stdout"]),
                                                   stderr_raw=b"".join(raw["stderr"]))
                elif typ == "error":
                    e = ev.get("error") or {}
                    err = errors.make_error(None, e.get("code"), str(e.get("message", "error")), e.get("reason"))
                    if err.code == "agent_error":
                        raise self._sb._lost(err.message)
                    raise err
        raise self._sb._lost("the output stream ended before the command did")

    def list(self) -> List[CommandInfo]:
        """Running background commands and the last finished ones."""
        r = self._sb._t.request("GET", self._sb._path("/commands")).json() or {}
        return [CommandInfo.from_json(c) for c in r.get("commands", [])]

    def connect(self, command_id: int, pid: int = 0) -> "CommandHandle":
        """A handle on a command by id (e.g. from :meth:`list`)."""
        return CommandHandle(self._sb, int(command_id), pid)

    def kill(self, command_id: int, signal: int = 9) -> None:
        CommandHandle(self._sb, int(command_id), 0).kill(signal)

    def send_stdin(self, command_id: int, data: Union[str, bytes], close: bool = False) -> None:
        CommandHandle(self._sb, int(command_id), 0).send_stdin(data, close=close)


class CommandHandle:
    """A background command: ``id`` and ``pid``, and what can be done to it."""

    def __init__(self, sandbox: Sandbox, id: int, pid: int) -> None:
        self._sb = sandbox
        self.id = id
        self.pid = pid

    def _path(self, suffix: str = "") -> str:
        return self._sb._path(f"/commands/{self.id}{suffix}")

    def wait(self, timeout: Optional[float] = None, check: bool = False) -> CommandResult:
        """Blocks until the command ends and returns its result. ``timeout`` bounds the
        wait in seconds (``glovebox.TimeoutError`` then; the command keeps running);
        without it, the command's own timeout bounds it."""
        r = self._sb._t.request("GET", self._path(), query={"wait": True, "encoding": "base64"},
                                timeout=timeout).json()
        return _check(CommandResult.from_json(r), check)

    def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (SIGKILL, the default, kills every process the command started)."""
        self._sb._t.request("POST", self._path("/kill"), json={"signal": int(signal)})

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> None:
        """Writes to the command's stdin; ``close=True`` then closes it (EOF)."""
        b = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._sb._t.request("POST", self._path("/stdin"), query={"close": True} if close else None, body=b,
                            headers={"Content-Type": "application/octet-stream"})

    def close_stdin(self) -> None:
        self.send_stdin(b"", close=True)

    def __repr__(self) -> str:
        return f"CommandHandle(id={self.id}, pid={self.pid})"


class Pty:
    """``sb.pty``: commands on a pseudo-terminal (a shell a person or an agent types into).

    A terminal command runs in the background; its output is read by attaching
    (:meth:`PtyHandle.wait` with ``on_data``, or :meth:`PtyHandle.read`). Nothing is kept
    while nobody is attached beyond a small backlog; past it the program waits to write."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def create(self, cols: int = 80, rows: int = 24, cmd: Optional[Cmd] = None, cwd: Optional[str] = None,
               envs: Optional[Mapping[str, str]] = None) -> "PtyHandle":
        """Starts ``cmd`` (default: a login shell) on a ``cols`` × ``rows`` terminal
        (1 to 1000 each); ``TERM`` defaults to ``xterm-256color``."""
        body: Dict[str, Any] = {"cols": int(cols), "rows": int(rows)}
        if cmd is not None:
            body["cmd"] = cmd if isinstance(cmd, str) else [str(a) for a in cmd]
        if cwd is not None:
            body["cwd"] = cwd
        if envs:
            body["env"] = dict(envs)
        r = self._sb._t.request("POST", self._sb._path("/pty"), json=body).json()
        return PtyHandle(self._sb, int(r["id"]), int(r.get("pid", 0)))

    def connect(self, command_id: int) -> "PtyHandle":
        return PtyHandle(self._sb, int(command_id), 0)

    def send_input(self, command_id: int, data: Union[str, bytes]) -> None:
        self.connect(command_id).send_input(data)

    def resize(self, command_id: int, cols: int, rows: int) -> None:
        self.connect(command_id).resize(cols, rows)

    def kill(self, command_id: int, signal: int = 9) -> None:
        self.connect(command_id).kill(signal)


class PtyHandle(CommandHandle):
    """A terminal command: what a :class:`CommandHandle` does, plus input, resize and its
    output over a WebSocket."""

    def __init__(self, sandbox: Sandbox, id: int, pid: int) -> None:
        super().__init__(sandbox, id, pid)
        self._ws: Any = None

    def send_input(self, data: Union[str, bytes]) -> None:
        """Types ``data`` into the terminal (``"\\x03"`` is Ctrl-C)."""
        self.send_stdin(data)

    def resize(self, cols: int, rows: int) -> None:
        self._sb._t.request("POST", self._sb._path(f"/pty/{self.id}/resize"),
                            json={"cols": int(cols), "rows": int(rows)})

    def _attached(self) -> Any:
        if self._ws is None:
            from . import _ws
            self._ws = _ws.connect(self._sb._t, self._sb._path(f"/pty/{self.id}/ws"), self._sb._t.request_timeout)
        return self._ws

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output bytes (attaching first if needed); ``None`` once the program
        ended or another client took the terminal over. ``timeout``: seconds to wait
        (``glovebox.TimeoutError``); default no limit."""
        from . import _ws
        ws = self._attached()
        while True:
            try:
                op, payload = ws.recv(timeout)
            except GloveboxError:
                # A frame may have been cut: this attachment is done (a next read re-attaches).
                self.disconnect()
                raise
            if op == _ws.BINARY:
                return payload
            if op == _ws.CLOSE:
                self._ws = None
                return None

    def wait(self, timeout: Optional[float] = None, check: bool = False,
             on_data: Optional[Callable[[bytes], None]] = None) -> CommandResult:
        """Blocks until the program ends and returns its result (output fields empty: a
        terminal's output is not kept). With ``on_data``, the output is attached to and
        passed on as it comes."""
        if on_data is not None:
            while True:
                b = self.read()
                if b is None:
                    break
                on_data(b)
        return super().wait(timeout=timeout, check=check)

    def disconnect(self) -> None:
        """Detaches (the program keeps running)."""
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def __repr__(self) -> str:
        return f"PtyHandle(id={self.id}, pid={self.pid})"


class FileStream:
    """A file being downloaded: iterate for chunks, or ``read()``. Close it (or use
    ``with``) if you stop early."""

    def __init__(self, s: StreamResponse) -> None:
        self._s = s
        length = s.headers.get("Content-Length")
        self.size: Optional[int] = int(length) if length and length.isdigit() else None

    def read(self, n: int = -1) -> bytes:
        return self._s.read(n)

    def __iter__(self) -> Iterator[bytes]:
        return self._s.iter_chunks(_CHUNK)

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _file_chunks(f: Any) -> Iterator[bytes]:
    while True:
        b = f.read(_CHUNK)
        if not b:
            return
        yield b.encode("utf-8") if isinstance(b, str) else bytes(b)


class Files:
    """``sb.files``: the sandbox's filesystem. Relative paths start at ``/home/user``; every
    path is resolved inside the sandbox (``..`` and symlinks cannot leave it)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _q(self, path: str, **extra: Any) -> Dict[str, Any]:
        return {"path": path, **extra}

    def write(self, path: str, data: Data, mode: Optional[int] = None) -> FileInfo:
        """Writes ``data`` (str as UTF-8, bytes, a file-like object, or an iterable of
        bytes) to ``path``; file-likes and iterables are streamed, never held in memory.
        Missing parent directories are created. ``mode``: e.g. ``0o755``."""
        if isinstance(data, str):
            body: Any = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif hasattr(data, "read"):
            body = _file_chunks(data)
        elif isinstance(data, Iterable):
            body = (c.encode("utf-8") if isinstance(c, str) else bytes(c) for c in data)
        else:
            raise InvalidArgumentError(f"cannot write a {type(data).__name__}: want str, bytes or a file",
                                       code="invalid_request")
        q = self._q(path, mode=None if mode is None else format(mode, "04o"))
        r = self._sb._t.request("PUT", self._sb._path("/files"), query=q, body=body,
                                headers={"Content-Type": "application/octet-stream"})
        return FileInfo.from_json(r.json())

    def read(self, path: str, format: str = "text") -> Any:
        """The file's contents: ``format="text"`` a str (invalid UTF-8 replaced),
        ``"bytes"``, or ``"stream"`` a :class:`FileStream` of chunks."""
        if format == "stream":
            return FileStream(self._sb._t.stream("GET", self._sb._path("/files"), query=self._q(path)))
        if format not in ("text", "bytes"):
            raise InvalidArgumentError("format must be 'text', 'bytes' or 'stream'", code="invalid_request")
        data = self._sb._t.request("GET", self._sb._path("/files"), query=self._q(path)).data
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def list(self, path: str, depth: int = 1) -> List[FileInfo]:
        """Entries under the directory ``path``, ``depth`` levels deep (1–32)."""
        r = self._sb._t.request("GET", self._sb._path("/files/list"), query=self._q(path, depth=depth)).json()
        return [FileInfo.from_json(e) for e in (r or {}).get("entries", [])]

    def exists(self, path: str) -> bool:
        try:
            self.get_info(path)
        except NotFoundError:
            return False
        except InvalidArgumentError as e:
            if e.code == "not_a_directory":  # a path through a regular file
                return False
            raise
        return True

    def get_info(self, path: str) -> FileInfo:
        """Type, size, mode, owner and mtime of ``path`` (a symlink is described, not followed)."""
        return FileInfo.from_json(self._sb._t.request("GET", self._sb._path("/files/stat"),
                                                      query=self._q(path)).json())

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file or an empty directory (any directory with ``recursive=True``)."""
        self._sb._t.request("DELETE", self._sb._path("/files"), query=self._q(path, recursive=recursive or None))

    def rename(self, src: str, dst: str) -> FileInfo:
        r = self._sb._t.request("POST", self._sb._path("/files/rename"), json={"from": src, "to": dst})
        return FileInfo.from_json(r.json())

    def make_dir(self, path: str) -> FileInfo:
        """Creates the directory and any missing parents."""
        r = self._sb._t.request("POST", self._sb._path("/files/mkdir"), json={"path": path})
        return FileInfo.from_json(r.json())
