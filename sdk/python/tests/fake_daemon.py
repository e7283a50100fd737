"""A stand-in daemon on loopback that knows only sandbox create/get (like a daemon that
predates network policies and metrics): everything else is the real daemon's 404
``not_found`` "no such route"."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SANDBOX = {
    "id": "fake123", "template": "base", "state": "running", "created_at": "2026-01-01T00:00:00Z",
    "expires_at": "2026-01-01T00:05:00Z", "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 1024, "pids": 256},
    "metadata": {}, "network": {"mode": "deny-all"},
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.server.drop_idle:
            # Close the kept-alive connection without saying so, as an idle timeout would.
            self.close_connection = True

    def _route(self):
        self.server.requests += 1  # before answering: the client may count right after
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        path = self.path.split("?")[0]
        if self.command == "POST" and path == "/v1/sandboxes":
            return self._send(201, SANDBOX)
        if self.command in ("GET", "DELETE") and path == "/v1/sandboxes/fake123":
            return self._send(200, SANDBOX)
        if path.startswith("/v1/sandboxes/") and path.count("/") == 3:
            return self._send(404, {"error": {"code": "sandbox_not_found", "message": "no such sandbox"}})
        return self._send(404, {"error": {"code": "not_found", "message": "no such route"}})

    do_GET = do_POST = do_PUT = do_DELETE = _route


class FakeDaemon:
    def __init__(self, drop_idle=False):
        self.drop_idle = drop_idle

    def __enter__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.drop_idle = self.drop_idle
        self.server.requests = 0
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
