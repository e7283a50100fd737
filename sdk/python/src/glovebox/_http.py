"""The HTTP/1.1 transport: stdlib ``http.client``, one keep-alive connection per thread
(so one ``Sandbox`` may be used from many threads), and a dedicated connection for every
streamed request or response (NDJSON output, file downloads and uploads) so a half-read
stream never blocks other calls.

Error mapping is done here, once: an HTTP error becomes the typed exception of its
``code``; a socket timeout becomes ``glovebox.TimeoutError``; anything else that keeps the
request from completing becomes ``GloveboxError(code="connection_error")``.
"""

from __future__ import annotations

import http.client
import json as _json
import os
import socket
import threading
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from . import errors
from .errors import GloveboxError

__version__ = "0.1.0"

DEFAULT_URL = "http://127.0.0.1:7171"
#: Socket timeout of ordinary (non-command) requests, in seconds.
DEFAULT_REQUEST_TIMEOUT = 60.0
_BLOCK = 64 * 1024

# Sentinel: "use the transport's default timeout" (None means "no timeout").
_DEFAULT: Any = object()

Body = Union[None, bytes, Iterable[bytes]]


def resolve_config(url: Optional[str], api_key: Optional[str]) -> Tuple[str, Optional[str]]:
    """URL and key the way the CLI finds them: arguments, then ``$GLOVEBOX_URL`` /
    ``$GLOVEBOX_API_KEY``, then the key file the daemon writes
    (``$GLOVEBOX_DATA_DIR/api-key``, default ``/var/lib/glovebox/api-key``) if readable."""
    url = url or os.environ.get("GLOVEBOX_URL") or DEFAULT_URL
    if api_key is None:
        api_key = os.environ.get("GLOVEBOX_API_KEY")
    if api_key is None:
        d = os.environ.get("GLOVEBOX_DATA_DIR") or "/var/lib/glovebox"
        try:
            with open(os.path.join(d, "api-key"), encoding="utf-8") as f:
                api_key = f.read().strip() or None
        except OSError:
            api_key = None
    return url, api_key


class Response:
    """A finished response: status, headers, the whole body."""

    def __init__(self, status: int, headers: "http.client.HTTPMessage", data: bytes) -> None:
        self.status = status
        self.headers = headers
        self.data = data

    def json(self) -> Any:
        if not self.data:
            return None
        try:
            return _json.loads(self.data)
        except ValueError as e:
            raise GloveboxError(f"the daemon sent invalid JSON: {e}", code="protocol_error",
                                status=self.status) from None


class StreamResponse:
    """A response being read: owns its connection and closes it when done."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    def read(self, n: int = -1) -> bytes:
        with _mapped("reading the response"):
            return self._resp.read(None if n is None or n < 0 else n)

    def iter_chunks(self, size: int = _BLOCK) -> Iterator[bytes]:
        try:
            while True:
                with _mapped("reading the response"):
                    b = self._resp.read1(size) if hasattr(self._resp, "read1") else self._resp.read(size)
                if not b:
                    return
                yield b
        finally:
            self.close()

    def iter_lines(self) -> Iterator[Any]:
        """NDJSON: one parsed object per non-empty line."""
        try:
            while True:
                with _mapped("reading the stream"):
                    line = self._resp.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                try:
                    yield _json.loads(line)
                except ValueError as e:
                    raise GloveboxError(f"bad line in the daemon's stream: {e}", code="protocol_error") from None
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _mapped:
    """Turns socket and protocol failures into SDK errors (as a context manager)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: Any, e: Any, tb: Any) -> None:
        if e is None or isinstance(e, GloveboxError):
            return
        if isinstance(e, socket.timeout):
            raise errors.TimeoutError(f"no answer from the daemon in time ({self.what})",
                                      code="request_timeout") from e
        if isinstance(e, (OSError, http.client.HTTPException)):
            raise GloveboxError(f"{self.what}: {e.__class__.__name__}: {e}", code="connection_error") from e


class Transport:
    """Talks to one daemon. Thread-safe: connections are per thread."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None,
                 request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.url, self.api_key = resolve_config(url, api_key)
        u = urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise errors.InvalidArgumentError(f"bad daemon URL {self.url!r} (want http://host:port)",
                                              code="invalid_url")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self.request_timeout = request_timeout
        self._local = threading.local()

    # -- connections ------------------------------------------------------------------

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout, blocksize=_BLOCK)

    def _pooled(self) -> Optional[http.client.HTTPConnection]:
        return getattr(self._local, "conn", None)

    def _drop_pooled(self) -> None:
        c = self._pooled()
        self._local.conn = None
        if c is not None:
            c.close()

    def close(self) -> None:
        """Closes this thread's idle connection (others close when their thread ends)."""
        self._drop_pooled()

    # -- requests ---------------------------------------------------------------------

    def path(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        p = self._prefix + path
        if query:
            q = {k: _qv(v) for k, v in query.items() if v is not None}
            if q:
                p += "?" + urlencode(q, quote_via=quote)
        return p

    def _headers(self, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        h = {"User-Agent": f"glovebox-python/{__version__}"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json: Any = None,
        body: Body = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = _DEFAULT,
    ) -> Response:
        """A request whose whole response is read. Raises the typed error on >= 400."""
        timeout = self.request_timeout if timeout is _DEFAULT else timeout
        url = self.path(path, query)
        h = self._headers(headers)
        if json is not None:
            body = _json.dumps(json).encode("utf-8")
            h["Content-Type"] = "application/json"
        if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            # A streamed body cannot be replayed: fresh connection, no retry.
            conn = self._connect(timeout)
            try:
                with _mapped(f"{method} {path}"):
                    conn.request(method, url, body=body, headers=h, encode_chunked=True)
                    resp = conn.getresponse()
                    data = resp.read()
                return _finish(resp, data)
            finally:
                conn.close()
        for attempt in (0, 1):
            pooled = self._pooled()
            reused = pooled is not None
            if pooled is None:
                conn = self._connect(timeout)
                self._local.conn = conn
            else:
                conn = pooled
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            try:
                conn.request(method, url, body=body, headers=h)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self._drop_pooled()
                # An idle keep-alive connection the server had closed: nothing was processed.
                if reused and attempt == 0:
                    continue
                with _mapped(f"{method} {path}"):
                    raise e
            except BaseException as e:
                self._drop_pooled()
                with _mapped(f"{method} {path}"):
                    raise e
                raise  # not an I/O error (e.g. KeyboardInterrupt): as it is
            if resp.will_close:
                self._drop_pooled()
            return _finish(resp, data)
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = _DEFAULT,
    ) -> StreamResponse:
        """A request whose response is read incrementally, on its own connection. Raises
        the typed error on >= 400 (the body of an error is read whole)."""
        timeout = self.request_timeout if timeout is _DEFAULT else timeout
        h = self._headers(headers)
        body = None
        if json is not None:
            body = _json.dumps(json).encode("utf-8")
            h["Content-Type"] = "application/json"
        conn = self._connect(timeout)
        try:
            with _mapped(f"{method} {path}"):
                conn.request(method, self.path(path, query), body=body, headers=h)
                resp = conn.getresponse()
                if resp.status >= 400:
                    data = resp.read()
                    _finish(resp, data)
        except BaseException:
            conn.close()
            raise
        return StreamResponse(conn, resp)


def _finish(resp: http.client.HTTPResponse, data: bytes) -> Response:
    if resp.status >= 400:
        try:
            parsed: Any = _json.loads(data) if data else None
        except ValueError:
            parsed = data
        raise errors.error_from_body(resp.status, parsed)
    return Response(resp.status, resp.headers, data)


def _qv(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
