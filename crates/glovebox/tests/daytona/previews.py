"""Preview links through the official `daytona` SDK against Glovebox: `get_preview_link`
(the port's preview host, opened by its token in `X-Daytona-Preview-Token`), signed preview
URLs (expiring, revocable, the token in the URL), and public sandboxes (`public=True`,
`set_public`). A server inside a block-all sandbox answers with what it saw."""

import http.client
import json
import time
import urllib.parse

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaBadRequestError,
    DaytonaConfig,
    DaytonaNotFoundError,
    SessionExecuteRequest,
)

from checks import check, done, env, poll, raises

API = env("DAYTONA_API_URL")
daytona = Daytona(DaytonaConfig(api_key=env("DAYTONA_API_KEY"), api_url=API))
DAEMON = urllib.parse.urlsplit(API)

# Answers every request with its port, path and the headers that could carry a credential.
SERVER = b"""
import http.server, json, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        seen = {"port": self.server.server_port, "path": self.path,
                "token": self.headers.get("X-Daytona-Preview-Token"), "cookie": self.headers.get("Cookie")}
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
servers = [http.server.ThreadingHTTPServer(("127.0.0.1", p), H) for p in (3000, 3001)]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""


def get(url, headers=None):
    """GET `url` on the daemon: `*.localhost` names are resolved by browsers, not by this
    host's resolver, so connect to the daemon and send the URL's host as `Host`."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(DAEMON.hostname, DAEMON.port, timeout=10)
    try:
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        conn.request("GET", path, headers={"Host": u.netloc, **(headers or {})})
        r = conn.getresponse()
        body = r.read().decode(errors="replace")
        try:
            seen = json.loads(body)
        except ValueError:
            seen = None
        return r.status, seen, body
    finally:
        conn.close()


sb = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
try:
    check("a sandbox is private unless asked", sb.public is False, sb.public)
    sb.fs.upload_file(SERVER, "/tmp/server.py")
    sb.process.create_session("web")
    sb.process.execute_session_command("web", SessionExecuteRequest(command="python3 /tmp/server.py", run_async=True))

    link = sb.get_preview_link(3000)
    want = f"http://3000-{sb.id}.localhost:{DAEMON.port}"
    check("get_preview_link answers the port's preview host", link.url == want, link.url)
    check("...for this sandbox", link.sandbox_id == sb.id, link.sandbox_id)
    check("...with a token", link.token.startswith("gbp_"), link.token)
    hdr = {"X-Daytona-Preview-Token": link.token}

    def first():
        r = get(link.url + "/api/x?q=1", hdr)
        return r if r[0] == 200 else None

    # The server starts in the background: the first answers may be 502 (nothing listens).
    status, seen, body = poll(first, 15) or get(link.url + "/api/x?q=1", hdr)
    check("the link with the header reaches the server", status == 200, (status, body))
    check("...at the path asked", seen["path"] == "/api/x?q=1" and seen["port"] == 3000, seen)
    check("...and the token is not passed on", seen["token"] is None and "gbp_" not in body, seen)
    status, _, body = get(link.url + "/api/x")
    check("without the header: 401", status == 401, (status, body))
    other = sb.get_preview_link(3001)
    check("each port has its own token", other.token != link.token)
    status, _, body = get(link.url + "/api/x", {"X-Daytona-Preview-Token": other.token})
    check("another port's token: 401", status == 401, (status, body))
    status, seen, _ = get(other.url + "/", {"X-Daytona-Preview-Token": other.token})
    check("port 3001 with its own token", status == 200 and seen["port"] == 3001, seen)
    status, _, _ = get(link.url + "/", {"X-Daytona-Preview-Token": "gbp_" + "0" * 64})
    check("a made-up token: 401", status == 401, status)

    # Signed preview URLs: the token is in the URL, no header needed.
    signed = sb.create_signed_preview_url(3000, expires_in_seconds=60)
    check("a signed URL names its sandbox and port", (signed.sandbox_id, signed.port) == (sb.id, 3000), signed)
    check("...on the port's preview host", signed.url.startswith(want + "/") and signed.token in signed.url, signed.url)
    status, seen, body = get(signed.url + "/api/y")
    check("a signed URL opens the port by itself", status == 200 and seen["path"] == "/api/y", (status, body))
    status, seen, _ = get(signed.url)
    check("...and alone it is the server's /", status == 200 and seen["path"] == "/", seen)
    status, _, _ = get(other.url + "/" + signed.token)
    check("a signed URL opens no other port", status == 401, status)
    second = sb.create_signed_preview_url(3000, expires_in_seconds=60)
    sb.expire_signed_preview_url(3000, signed.token)
    status, _, _ = get(signed.url + "/api/y")
    check("an expired (revoked) signed URL: 401", status == 401, status)
    status, _, _ = get(second.url + "/api/y")
    check("...while another signed URL still works", status == 200, status)
    short = sb.create_signed_preview_url(3000, expires_in_seconds=2)
    status, _, _ = get(short.url)
    check("a 2-second signed URL works at first", status == 200, status)
    expired = poll(lambda: get(short.url)[0] == 401, 6)
    check("...and not after its expiry", expired)
    raises("expires_in_seconds=0 is the SDK's bad-request error", DaytonaBadRequestError, sb.create_signed_preview_url, 3000, 0)
    raises("a bad port is the SDK's bad-request error", DaytonaBadRequestError, sb.get_preview_link, 70000)
    raises("expiring an unknown token is the SDK's not-found error", DaytonaNotFoundError, sb.expire_signed_preview_url, 3000, "gbs_1_x")

    # A public sandbox: every port opens without credentials.
    sb.set_public(True)
    check("set_public(True) is reported", sb.public is True and daytona.get(sb.id).public is True)
    status, seen, _ = get(link.url + "/open")
    check("a public sandbox's preview needs no token", status == 200 and seen["path"] == "/open", status)
    status, seen, _ = get(other.url + "/open")
    check("...on every port", status == 200 and seen["port"] == 3001, status)
    sb.set_public(False)
    check("set_public(False) is reported", daytona.get(sb.id).public is False)
    status, _, _ = get(link.url + "/open")
    check("...and the preview is private again", status == 401, status)
finally:
    sb.delete()
status, _, _ = get(link.url + "/", {"X-Daytona-Preview-Token": link.token})
check("after delete the preview answers 410", status == 410, status)

pub = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, public=True))
try:
    check("public=True at create is reported", pub.public is True and daytona.get(pub.id).public is True)
    # Nothing listens: access was granted without a token, so the answer is 502, not 401.
    status, _, body = get(pub.get_preview_link(3000).url + "/")
    check("a public sandbox's port is open without a token (502: nothing listens)", status == 502, (status, body))
finally:
    pub.delete()

done("previews")
