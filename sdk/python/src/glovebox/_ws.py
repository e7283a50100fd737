"""A minimal WebSocket client (RFC 6455) over the stdlib, for terminals: the handshake with
the API key, binary and text frames both ways (client frames masked), ping answered, close.
Enough for ``/v1/sandboxes/{id}/pty/{cid}/ws``; not a general-purpose client."""

from __future__ import annotations

import base64
import hashlib
import json as _json
import os
import socket
import ssl
import struct
from typing import Any, Optional, Tuple

from . import errors
from .errors import GloveboxError

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: Largest frame accepted from the daemon (its output chunks are 64 KiB).
_MAX_FRAME = 16 << 20
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class WebSocket:
    def __init__(self, sock: socket.socket, rest: bytes) -> None:
        self._sock = sock
        self._buf = rest
        self.close_code: Optional[int] = None

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout:
                raise errors.TimeoutError("no terminal output in time", code="request_timeout") from None
            except OSError as e:
                raise GloveboxError(f"terminal connection: {e}", code="connection_error") from None
            if not chunk:
                raise GloveboxError("the daemon closed the terminal connection", code="connection_error")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def send(self, opcode: int, payload: bytes) -> None:
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._sock.sendall(head + mask + body)

    def send_json(self, v: Any) -> None:
        self.send(TEXT, _json.dumps(v).encode("utf-8"))

    def recv(self, timeout: Optional[float] = None) -> Tuple[int, bytes]:
        """The next data message as (opcode, payload); (CLOSE, b"") once closed. ``timeout``
        bounds the wait for each frame (``glovebox.TimeoutError``)."""
        self._sock.settimeout(timeout)
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._read(8))
            if n > _MAX_FRAME:
                raise GloveboxError(f"terminal frame of {n} bytes is too large", code="protocol_error")
            if b1 & 0x80:
                raise GloveboxError("the daemon sent a masked frame", code="protocol_error")
            payload = self._read(n)
            if opcode == PING:
                self.send(PONG, payload)
            elif opcode == CLOSE:
                self.close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close()
                return CLOSE, b""
            elif opcode in (TEXT, BINARY):
                # The daemon sends whole messages (no continuation frames).
                return opcode, payload

    def close(self) -> None:
        try:
            self.send(CLOSE, struct.pack(">H", 1000))
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


def connect(transport: Any, path: str, timeout: Optional[float]) -> WebSocket:
    """Opens ``path`` (a ``/v1/…`` route) on the transport's daemon as a WebSocket."""
    host, port, https = transport._host, transport._port, transport._https
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {transport._prefix}{path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if transport.api_key:
            lines.append(f"Authorization: Bearer {transport.api_key}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk or len(buf) > 65536:
                raise GloveboxError("bad WebSocket handshake from the daemon", code="protocol_error")
            buf += chunk
    except socket.timeout:
        raise errors.TimeoutError("timed out opening the terminal", code="request_timeout") from None
    except OSError as e:
        raise GloveboxError(f"cannot reach the glovebox daemon: {e}", code="connection_error") from None
    head, rest = buf.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines if ":" in h)}
    if status != 101:
        length = int(headers.get("content-length", "0") or 0)
        ws = WebSocket(sock, rest)
        try:
            body = ws._read(length) if length else b""
        except GloveboxError:
            body = rest
        sock.close()
        try:
            parsed: Any = _json.loads(body) if body else None
        except ValueError:
            parsed = body
        raise errors.error_from_body(status, parsed)
    want = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    if headers.get("sec-websocket-accept") != want:
        sock.close()
        raise GloveboxError("bad WebSocket handshake from the daemon", code="protocol_error")
    sock.settimeout(None)
    return WebSocket(sock, rest)
