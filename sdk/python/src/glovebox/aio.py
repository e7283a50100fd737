"""The asyncio client: the same surface as the synchronous one, every method a coroutine.

How: each call runs the synchronous client in a private thread pool (``GLOVEBOX_ASYNC_THREADS``
threads, default 64 — the default executor's handful would cap concurrent commands), so
behaviour and error mapping are exactly the sync client's and there is no second HTTP stack.
Callbacks (``on_stdout`` …) are run on the event loop, in order; they may be plain functions
or coroutine functions. Cancelling an awaiting task stops the wait, not the remote work: a
cancelled ``run`` leaves its command running until its timeout (kill it, or the sandbox).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Mapping, Optional, Sequence, TypeVar, Union

from ._http import DEFAULT_REQUEST_TIMEOUT
from .errors import GloveboxError
from .models import CommandInfo, CommandResult, Context, Execution, FileInfo, Metrics, SandboxInfo
from .snapshots import SnapshotInfo
from .volumes import VolumeSpec
from .sandbox import CommandHandle, Commands, Files, FileStream, Pty, PtyHandle, Sandbox

__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "AsyncFileStream"]

_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            n = int(os.environ.get("GLOVEBOX_ASYNC_THREADS", "64"))
            _executor = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="glovebox")
        return _executor


T = TypeVar("T")


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), functools.partial(fn, *args, **kwargs))


def _on_loop(loop: asyncio.AbstractEventLoop, cb: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], Any]]:
    """A callback for the worker thread that runs ``cb`` on the loop and waits for it (so
    events stay ordered and a slow callback slows the reader, not memory)."""
    if cb is None:
        return None

    async def run(x: Any) -> None:
        r = cb(x)
        if inspect.isawaitable(r):
            await r

    def call(x: Any) -> None:
        fut = asyncio.run_coroutine_threadsafe(run(x), loop)
        while True:
            try:
                return fut.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                # A loop that stopped will never run the callback: give up, don't hang.
                if loop.is_closed() or not loop.is_running():
                    fut.cancel()
                    raise GloveboxError("the event loop stopped while a callback was pending",
                                        code="loop_closed") from None

    return call


class AsyncSandbox:
    """``await AsyncSandbox.create()``; ``async with`` kills it on exit."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox
        self.commands = AsyncCommands(sandbox.commands)
        self.files = AsyncFiles(sandbox.files)
        self.pty = AsyncPty(sandbox.pty)

    @classmethod
    async def create(
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
    ) -> "AsyncSandbox":
        sb = await _call(Sandbox.create, template=template, timeout=timeout, cpus=cpus, memory_mb=memory_mb,
                         disk_mb=disk_mb, pids=pids, env=env, metadata=metadata, network=network, url=url,
                         api_key=api_key, request_timeout=request_timeout, idle_timeout=idle_timeout,
                         on_idle=on_idle, volumes=volumes, snapshot=snapshot, isolation=isolation)
        return cls(sb)

    @classmethod
    async def connect(cls, sandbox_id: str, url: Optional[str] = None, api_key: Optional[str] = None,
                      request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "AsyncSandbox":
        return cls(await _call(Sandbox.connect, sandbox_id, url=url, api_key=api_key,
                               request_timeout=request_timeout))

    @classmethod
    async def list(cls, metadata: Optional[Mapping[str, str]] = None, url: Optional[str] = None,
                   api_key: Optional[str] = None) -> List[SandboxInfo]:
        return await _call(Sandbox.list, metadata=metadata, url=url, api_key=api_key)

    @property
    def id(self) -> str:
        return self._sync.id

    @property
    def sandbox_id(self) -> str:
        return self._sync.id

    @property
    def sync(self) -> Sandbox:
        """The synchronous ``Sandbox`` behind this one."""
        return self._sync

    async def info(self) -> SandboxInfo:
        return await _call(self._sync.info)

    async def is_running(self) -> bool:
        return await _call(self._sync.is_running)

    async def set_timeout(self, seconds: float) -> SandboxInfo:
        return await _call(self._sync.set_timeout, seconds)

    async def set_metadata(self, metadata: Mapping[str, str]) -> SandboxInfo:
        return await _call(self._sync.set_metadata, metadata)

    async def set_idle_timeout(self, seconds: float) -> SandboxInfo:
        return await _call(self._sync.set_idle_timeout, seconds)

    async def pause(self) -> SandboxInfo:
        return await _call(self._sync.pause)

    async def resume(self) -> SandboxInfo:
        return await _call(self._sync.resume)

    async def snapshot(self, name: str) -> SnapshotInfo:
        return await _call(self._sync.snapshot, name)

    async def fork(self, count: int = 1) -> List["AsyncSandbox"]:
        """See :meth:`Sandbox.fork` (processes are not copied)."""
        return [AsyncSandbox(s) for s in await _call(self._sync.fork, count)]

    async def expose(self, port: int, public: bool = False) -> str:
        return await _call(self._sync.expose, port, public)

    async def kill(self) -> bool:
        return await _call(self._sync.kill)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, tp: Any, exc: Any, tb: Any) -> None:
        try:
            # Shielded: a cancelled task still gets its sandbox destroyed.
            await asyncio.shield(self.kill())
        except GloveboxError:
            if exc is None:
                raise

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"

    async def run_code(
        self,
        code: str,
        language: Optional[str] = "python",
        context: Union[None, str, Context] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[Callable[[Any], Any]] = None,
        on_error: Optional[Callable[[Any], Any]] = None,
    ) -> Execution:
        loop = asyncio.get_running_loop()
        return await _call(self._sync.run_code, code, language=language, context=context, timeout=timeout, env=env,
                           on_stdout=_on_loop(loop, on_stdout), on_stderr=_on_loop(loop, on_stderr),
                           on_result=_on_loop(loop, on_result), on_error=_on_loop(loop, on_error))

    async def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> Context:
        return await _call(self._sync.create_code_context, language, cwd)

    async def list_code_contexts(self) -> List[Context]:
        return await _call(self._sync.list_code_contexts)

    async def restart_code_context(self, context: Union[str, Context]) -> Context:
        return await _call(self._sync.restart_code_context, context)

    async def remove_code_context(self, context: Union[str, Context]) -> None:
        await _call(self._sync.remove_code_context, context)

    async def update_network(self, network: Union[None, str, Mapping[str, Any]] = None, *, mode: Optional[str] = None,
                             allow: Optional[List[str]] = None, deny: Optional[List[str]] = None) -> Any:
        return await _call(self._sync.update_network, network, mode=mode, allow=allow, deny=deny)

    async def egress_log(self) -> Any:
        return await _call(self._sync.egress_log)

    async def metrics(self) -> Metrics:
        return await _call(self._sync.metrics)

    async def usage(self) -> Any:
        return await _call(self._sync.usage)

    async def events(self) -> List[Any]:
        return await _call(self._sync.events)

    async def keepalive(self) -> None:
        await _call(self._sync.keepalive)


class AsyncCommands:
    def __init__(self, commands: Commands) -> None:
        self._c = commands

    async def run(
        self,
        cmd: Any,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[None, str, bytes] = None,
        background: bool = False,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        output_tail_bytes: Optional[int] = None,
    ) -> Any:
        """As :meth:`Commands.run`; ``background=True`` gives an :class:`AsyncCommandHandle`."""
        loop = asyncio.get_running_loop()
        r = await _call(self._c.run, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, background=background,
                        on_stdout=_on_loop(loop, on_stdout), on_stderr=_on_loop(loop, on_stderr), check=check,
                        max_output_bytes=max_output_bytes, output_tail_bytes=output_tail_bytes)
        return AsyncCommandHandle(r) if isinstance(r, CommandHandle) else r

    async def list(self) -> List[CommandInfo]:
        return await _call(self._c.list)

    def connect(self, command_id: int, pid: int = 0) -> "AsyncCommandHandle":
        return AsyncCommandHandle(self._c.connect(command_id, pid))

    async def kill(self, command_id: int, signal: int = 9) -> None:
        await _call(self._c.kill, command_id, signal)

    async def send_stdin(self, command_id: int, data: Union[str, bytes], close: bool = False) -> None:
        await _call(self._c.send_stdin, command_id, data, close)


class AsyncCommandHandle:
    def __init__(self, handle: CommandHandle) -> None:
        self._h = handle
        self.id = handle.id
        self.pid = handle.pid

    async def wait(self, timeout: Optional[float] = None, check: bool = False) -> CommandResult:
        return await _call(self._h.wait, timeout, check)

    async def kill(self, signal: int = 9) -> None:
        await _call(self._h.kill, signal)

    async def send_stdin(self, data: Union[str, bytes], close: bool = False) -> None:
        await _call(self._h.send_stdin, data, close)

    async def close_stdin(self) -> None:
        await _call(self._h.close_stdin)

    def __repr__(self) -> str:
        return f"AsyncCommandHandle(id={self.id}, pid={self.pid})"


class AsyncPty:
    """``sb.pty`` of an :class:`AsyncSandbox` (see :class:`glovebox.Pty`)."""

    def __init__(self, pty: Pty) -> None:
        self._p = pty

    async def create(self, cols: int = 80, rows: int = 24, cmd: Any = None, cwd: Optional[str] = None,
                     envs: Optional[Mapping[str, str]] = None) -> "AsyncPtyHandle":
        return AsyncPtyHandle(await _call(self._p.create, cols, rows, cmd, cwd, envs))

    def connect(self, command_id: int) -> "AsyncPtyHandle":
        return AsyncPtyHandle(self._p.connect(command_id))

    async def send_input(self, command_id: int, data: Union[str, bytes]) -> None:
        await _call(self._p.send_input, command_id, data)

    async def resize(self, command_id: int, cols: int, rows: int) -> None:
        await _call(self._p.resize, command_id, cols, rows)

    async def kill(self, command_id: int, signal: int = 9) -> None:
        await _call(self._p.kill, command_id, signal)


class AsyncPtyHandle(AsyncCommandHandle):
    """A terminal command of an :class:`AsyncSandbox` (see :class:`glovebox.PtyHandle`)."""

    def __init__(self, handle: PtyHandle) -> None:
        super().__init__(handle)
        self._p = handle

    async def send_input(self, data: Union[str, bytes]) -> None:
        await _call(self._p.send_input, data)

    async def resize(self, cols: int, rows: int) -> None:
        await _call(self._p.resize, cols, rows)

    async def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        return await _call(self._p.read, timeout)

    async def wait(self, timeout: Optional[float] = None, check: bool = False,
                   on_data: Optional[Callable[[bytes], Any]] = None) -> CommandResult:
        cb = _on_loop(asyncio.get_running_loop(), on_data)
        return await _call(self._p.wait, timeout, check, cb)

    async def disconnect(self) -> None:
        await _call(self._p.disconnect)

    def __repr__(self) -> str:
        return f"AsyncPtyHandle(id={self.id}, pid={self.pid})"


class AsyncFileStream:
    """``async for chunk in stream``; or ``await stream.read()``."""

    def __init__(self, s: FileStream) -> None:
        self._s = s
        self._it = iter(s)
        self.size = s.size

    async def read(self, n: int = -1) -> bytes:
        return await _call(self._s.read, n)

    def __aiter__(self) -> "AsyncFileStream":
        return self

    async def __anext__(self) -> bytes:
        b: Optional[bytes] = await _call(next, self._it, None)
        if b is None:
            raise StopAsyncIteration
        return b

    async def close(self) -> None:
        await _call(self._s.close)

    async def __aenter__(self) -> "AsyncFileStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncFiles:
    def __init__(self, files: Files) -> None:
        self._f = files

    async def write(self, path: str, data: Any, mode: Optional[int] = None) -> FileInfo:
        """As :meth:`Files.write` (file-likes are read in a worker thread)."""
        return await _call(self._f.write, path, data, mode)

    async def read(self, path: str, format: str = "text") -> Any:
        r = await _call(self._f.read, path, format)
        return AsyncFileStream(r) if isinstance(r, FileStream) else r

    async def list(self, path: str, depth: int = 1) -> List[FileInfo]:
        return await _call(self._f.list, path, depth)

    async def exists(self, path: str) -> bool:
        return await _call(self._f.exists, path)

    async def get_info(self, path: str) -> FileInfo:
        return await _call(self._f.get_info, path)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await _call(self._f.remove, path, recursive)

    async def rename(self, src: str, dst: str) -> FileInfo:
        return await _call(self._f.rename, src, dst)

    async def make_dir(self, path: str) -> FileInfo:
        return await _call(self._f.make_dir, path)
