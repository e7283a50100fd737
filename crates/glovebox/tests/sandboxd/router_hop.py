"""The router hop of docs/scale-out.md: the agent-sandbox Python SDK (k8s-agent-sandbox, pinned
in setup.sh), unmodified, through a stand-in for agent-sandbox's sandbox-router, to a Glovebox
daemon's router-facing listener (`glovebox serve --router-listen`).

The stand-in does what the router does with a request (sandbox-router at agent-sandbox
2fd412d5): reads X-Sandbox-ID / X-Sandbox-Namespace / X-Sandbox-Port, validates them as DNS
labels and a port, dials `{id}.{namespace}.svc.cluster.local:{port}` (cluster DNS is stood in
for by the Service the claims controller writes: every `*.svc.cluster.local` name resolves to
the daemon's router-facing listener, as its EndpointSlice makes it resolve to the node's pod
IP), sends that name as the Host, and strips headers as one of the two routers does:
- `python` (clients/python/.../sandbox_router.py): drops X-Sandbox-ID, -Namespace, -Port,
  -Pod-IP, -Timeout, Authorization, Host and the hop-by-hop headers;
- `go` (sandbox-router/proxy): drops Authorization and the hop-by-hop headers, replaces
  X-Forwarded-For and sets X-Forwarded-For/-Host/-Proto; X-Sandbox-* pass through.
The SDK's pod-IP lookup goes to a stand-in Kubernetes API answering 404 for everything: no
Sandbox object exists for a Glovebox claim (docs/scale-out.md), so the SDK sends no
X-Sandbox-Pod-IP, as on a cluster.

Environment: GLOVEBOX_ROUTER_LISTENER (host:port of the daemon's router-facing listener).
The daemon holds sandboxes made the way the controller makes them for claims team-a/demo and
team-b/demo (each has CLAIM=<namespace>/<name> in its environment, to tell them apart), and
a tenant's sandbox labelled as claim team-a/squatter. Prints one `ok:` line a check.
"""

import http.client
import io
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes

from k8s_agent_sandbox.k8s_helper import K8sHelper
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.sandbox import Sandbox

import sdkcheck
from sdkcheck import expect_status, ok, p50_ms

LISTENER = os.environ["GLOVEBOX_ROUTER_LISTENER"]
LISTENER_HOST, LISTENER_PORT = LISTENER.rsplit(":", 1)


# --- the stand-ins --------------------------------------------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailers", "trailer", "transfer-encoding", "upgrade"}
PYTHON_ROUTER_DROPS = {"x-sandbox-id", "x-sandbox-namespace", "x-sandbox-port", "x-sandbox-pod-ip",
                       "x-sandbox-timeout", "host", "authorization"}
GO_ROUTER_DROPS = {"host", "authorization", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
                   "forwarded"}


def cluster_dns(name):
    """`*.svc.cluster.local` → the node daemon's router-facing listener (the controller's
    headless Service and EndpointSlice); anything else does not resolve."""
    if not name.endswith(".svc.cluster.local"):
        raise OSError(f"NXDOMAIN {name}")
    return LISTENER_HOST, int(LISTENER_PORT)


class Router(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    mode = "python"
    forwarded = []  # (inbound header names, outbound headers) of every request, per class

    def log_message(self, *a):
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def route(self):
        h = self.headers
        sid, ns = h.get("X-Sandbox-ID"), h.get("X-Sandbox-Namespace", "default")
        body = self.body()
        if not sid:
            return self.reply(400, {"detail": "X-Sandbox-ID header is required."})
        if not DNS_LABEL.match(sid) or len(sid) > 63:
            return self.reply(400, {"detail": "Invalid sandbox ID format."})
        if not DNS_LABEL.match(ns) or len(ns) > 63:
            return self.reply(400, {"detail": "Invalid namespace format."})
        port = int(h.get("X-Sandbox-Port", "8888"))
        upstream = f"{sid}.{ns}.svc.cluster.local"
        drop = set(HOP_BY_HOP)
        drop |= {t.strip().lower() for t in h.get("Connection", "").split(",") if t.strip()}
        drop |= PYTHON_ROUTER_DROPS if self.mode == "python" else GO_ROUTER_DROPS
        out = [(k, v) for k, v in h.items() if k.lower() not in drop]
        if self.mode == "go":
            out += [("X-Forwarded-For", self.client_address[0]), ("X-Forwarded-Host", h.get("Host", "")),
                    ("X-Forwarded-Proto", "http")]
        out = [(k, v) for k, v in out if k.lower() != "content-length"] + [("Content-Length", str(len(body)))]
        type(self).forwarded.append(({k.lower() for k in h.keys()}, out))
        try:
            addr = cluster_dns(upstream)
            conn = http.client.HTTPConnection(*addr, timeout=120)
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"{upstream}:{port}")
            for k, v in out:
                conn.putheader(k, v)
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}]
            conn.close()
        except OSError:
            return self.reply(502, {"detail": f"Could not connect to the backend sandbox: {sid}"})
        self.send_response(resp.status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = route


class PythonRouter(Router):
    mode = "python"
    forwarded = []


class GoRouter(Router):
    mode = "go"
    forwarded = []


class KubeApi(BaseHTTPRequestHandler):
    """Every object asked for is missing: a Glovebox claim has no Sandbox object."""
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404, "message": "not found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


servers = [start(PythonRouter), start(GoRouter), start(KubeApi)]
(_, PY_ROUTER), (_, GO_ROUTER), (_, KUBE_API) = servers


def connect(router, name, namespace):
    """The SDK as an agent uses it behind the router: the sandbox's name and namespace, a
    router URL, and a token for the router (which it consumes: the daemon never sees it)."""
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=KUBE_API))
    cfg = SandboxDirectConnectionConfig(api_url=router, extra_headers={"Authorization": "Bearer router-token"})
    return Sandbox(claim_name=name, sandbox_id=name, namespace=namespace, connection_config=cfg,
                   k8s_helper=K8sHelper(api_client=api))


# --- through each router --------------------------------------------------------------------

for label, router, cls in [("python router", PY_ROUTER, PythonRouter), ("go router", GO_ROUTER, GoRouter)]:
    sb = connect(router, "demo", "team-a")
    r = sb.commands.run("echo $CLAIM; echo oops >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("team-a/demo\n", "oops\n", 3, False), r
    ok(f"{label}: commands.run reaches claim team-a/demo's sandbox (stdout, stderr, exit code)")

    payload = bytes(range(256)) * 17 + label.encode()
    sb.files.write("work/from-sdk.bin", payload)
    assert sb.files.read("work/from-sdk.bin") == payload
    r = sb.commands.run("wc -c < work/from-sdk.bin")
    assert r.stdout.strip() == str(len(payload)), r
    ok(f"{label}: files.write then files.read round-trip, and the command sees the file")

    names = {e.name for e in sb.files.list("work")}
    assert "from-sdk.bin" in names and sb.files.exists("work/from-sdk.bin") and not sb.files.exists("work/nope")
    ok(f"{label}: files.list and files.exists")

    other = connect(router, "demo", "team-b")
    assert other.commands.run("echo $CLAIM").stdout == "team-b/demo\n"
    assert not other.files.exists("work/from-sdk.bin")
    ok(f"{label}: the same name in namespace team-b is team-b's sandbox, which does not see team-a's files")

    e = expect_status(404, lambda: connect(router, "demo", "team-c").commands.run("true"))
    assert json.loads(e.response.text)["code"] == "NOT_FOUND", e.response.text
    ok(f"{label}: a claim in another namespace that has no sandbox here: 404 ({json.loads(e.response.text)['message']})")

    expect_status(404, lambda: connect(router, "squatter", "team-a").commands.run("true"))
    ok(f"{label}: a tenant's sandbox labelled with a claim's name is not reachable: 404")

    expect_status(403, lambda: sb.files.read("../../etc/hostname", allow_unsafe_paths=True))
    ok(f"{label}: a path above the sandbox's root is refused: 403")

    seen_in, seen_out = cls.forwarded[-1]
    sent = {k.lower() for k, _ in seen_out}
    assert {"x-sandbox-id", "x-sandbox-namespace", "authorization"} <= seen_in, seen_in
    assert "authorization" not in sent and "host" not in sent, sent
    if cls.mode == "python":
        assert not any(k.startswith("x-sandbox-") for k in sent), sent
        ok("python router: the daemon got neither X-Sandbox-* nor Authorization, only the Host name")
    else:
        assert "x-sandbox-id" in sent and "x-forwarded-host" in sent, sent
        ok("go router: X-Sandbox-* and X-Forwarded-* passed on, Authorization not")

sb = connect(PY_ROUTER, "demo", "team-a")
big = os.urandom(3 << 20)
sb.files.write("work/big.bin", io.BytesIO(big))
sink = io.BytesIO()
assert sb.files.read_to("work/big.bin", sink) == len(big) and sink.getvalue() == big
ok("a 3 MiB file up and down through the router")

r = sb.commands.run("sleep 30", command_timeout=1)
assert r.timed_out, r
ok("command_timeout through the router: the command is killed and reported timed_out")

p50 = p50_ms(lambda: sb.commands.run("true"))
print(f"round trip commands.run('true') through the stand-in router: p50 {p50:.1f} ms")

for srv, _ in servers:
    srv.shutdown()
    srv.server_close()
print(f"router hop: {sdkcheck.checks} checks ok", flush=True)
