"""The agent-sandbox Python SDK (k8s-agent-sandbox, pinned in setup.sh), unmodified, against a
Glovebox daemon: its direct-URL mode (commands and files, the python-runtime API, routed by
X-Sandbox-ID) and its shipped sandboxd ProcessService stubs (streaming output, stdin,
signals, a PTY) on the daemon's own port. Configuration only: the daemon's URL, its API key
as a header, the sandbox's id.

Environment: GLOVEBOX_URL, GLOVEBOX_API_KEY, GLOVEBOX_SANDBOX (the sandbox to use),
GLOVEBOX_OTHER_SANDBOX (a second one, for routing). Prints one `ok:` line a check.
"""

import hashlib
import io
import os
import threading
import time

import grpc
from google.protobuf import empty_pb2
import kubernetes
import requests

from k8s_agent_sandbox.commands._process_stubs import process_pb2 as pb
from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc
from k8s_agent_sandbox.k8s_helper import K8sHelper
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.sandbox import Sandbox

import sdkcheck
from sdkcheck import expect_status, ok, p50_ms

URL = os.environ["GLOVEBOX_URL"]
KEY = os.environ["GLOVEBOX_API_KEY"]
SB = os.environ["GLOVEBOX_SANDBOX"]
OTHER = os.environ["GLOVEBOX_OTHER_SANDBOX"]


def connect(sandbox_id, key=KEY):
    """The SDK's Sandbox in direct-URL mode, pointed at the daemon. Its K8sHelper is only used
    to look up a pod IP, which Glovebox does not need: its API client also points at the
    daemon, which answers the lookup 404 (no such object), and the SDK goes on without one."""
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=URL))
    cfg = SandboxDirectConnectionConfig(api_url=URL, extra_headers={"Authorization": f"Bearer {key}"})
    return Sandbox(claim_name=None, sandbox_id=sandbox_id, connection_config=cfg, k8s_helper=K8sHelper(api_client=api))


# --- direct-URL mode: commands and files ----------------------------------------------------

sb = connect(SB)
r = sb.commands.run("echo hello; echo oops >&2; exit 3")
assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hello\n", "oops\n", 3, False), r
ok("commands.run: stdout, stderr and the exit code")

r = sb.commands.run("echo $((6 * 7)) | tr 4 X && pwd")
assert r.exit_code == 0 and r.stdout.splitlines()[0] == "X2", r
root = r.stdout.splitlines()[1]
ok(f"commands.run is a shell command, run in the sandbox's root ({root})")

t0 = time.monotonic()
r = sb.commands.run("sleep 30", command_timeout=1)
took = time.monotonic() - t0
assert r.timed_out and took < 10, (r, took)
ok(f"command_timeout: the command is killed and reported timed_out ({took:.1f} s)")

payload = bytes(range(256)) * 41 + b"\x00end"
sb.files.write("work/data.bin", payload)
assert sb.files.read("work/data.bin") == payload
ok("files.write then files.read: binary content round-trips")

r = sb.commands.run("wc -c < work/data.bin; sha256sum work/data.bin")
assert r.stdout.split()[0] == str(len(payload)) and r.stdout.split()[1] == hashlib.sha256(payload).hexdigest(), r
ok("a file written through the SDK is where its commands run")

sb.commands.run("mkdir -p work/sub && printf abc > work/made.txt")
assert sb.files.read("work/made.txt") == b"abc"
names = {e.name: e for e in sb.files.list("work")}
assert set(names) == {"data.bin", "made.txt", "sub"}, names
assert names["sub"].type == "directory" and names["data.bin"].size == len(payload), names
ok("files.list: names, types and sizes")

assert sb.files.exists("work/made.txt") and not sb.files.exists("work/nope.txt")
ok("files.exists")

big = os.urandom(3 << 20)
sb.files.write("work/big.bin", io.BytesIO(big))
sink = io.BytesIO()
n = sb.files.read_to("work/big.bin", sink)
assert n == len(big) and sink.getvalue() == big
ok("a 3 MiB file streamed up (a binary file object) and down (read_to)")

e = expect_status(404, lambda: sb.files.read("work/nope.txt"))
ok("files.read of a missing file: 404")

expect_status(403, lambda: sb.files.read("../../etc/hostname", allow_unsafe_paths=True))
ok("a path above the sandbox's root is refused: 403")

try:
    sb.files.delete("work/made.txt")
    raise AssertionError("delete in direct mode")
except NotImplementedError:
    ok("files.delete is the SDK's own refusal in direct mode (sandboxd only)")

other = connect(OTHER)
assert not other.files.exists("work/data.bin")
assert other.commands.run("test -e work/data.bin; echo $?").stdout.strip() == "1"
ok("X-Sandbox-ID routes: another sandbox does not see these files")

expect_status(401, lambda: connect(SB, key="not-a-key").commands.run("true"))
ok("a wrong API key: 401")

expect_status(404, lambda: connect("sb-does-not-exist").commands.run("true"))
ok("an unknown sandbox: 404")

p50 = p50_ms(lambda: sb.commands.run("true"))
print(f"round trip commands.run('true') (direct-URL mode): p50 {p50:.1f} ms")

# --- sandboxd: ProcessService through the SDK's own stubs ----------------------------------

host = URL.removeprefix("http://").rstrip("/")
channel = grpc.insecure_channel(host)
stub = process_pb2_grpc.ProcessServiceStub(channel)
md = [("x-sandbox-id", SB), ("authorization", f"Bearer {KEY}")]


def config(*argv, **kw):
    return pb.ProcessConfig(command=list(argv), **kw)


r = stub.Execute(pb.ExecuteRequest(config=config("sh", "-c", "echo out; echo err >&2; printf '\\377'; exit 5")), metadata=md, timeout=30)
assert (r.exit_code, r.stdout, r.stderr) == (5, b"out\n\xff", b"err\n"), r
ok("Execute: exit code, stdout and stderr as bytes")

r = stub.Execute(pb.ExecuteRequest(config=config("sh", "-c", "pwd; echo $GREETING", cwd="work/sub", env_vars={"GREETING": "hi"})), metadata=md, timeout=30)
assert r.stdout.decode().split() == [f"{root}/work/sub", "hi"], r
ok("Execute: cwd under the root and env_vars")

try:
    stub.Execute(pb.ExecuteRequest(config=config("sleep", "30")), metadata=md, timeout=1.5)
    raise AssertionError("no deadline")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
ok("Execute past its deadline: DEADLINE_EXCEEDED")

p50 = p50_ms(lambda: stub.Execute(pb.ExecuteRequest(config=config("true")), metadata=md, timeout=30))
print(f"round trip Execute(['true']) (gRPC): p50 {p50:.1f} ms")

# Start streams output as it is written.
events = []
for ev in stub.Start(pb.StartRequest(config=config("sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.4; done; echo bye >&2; exit 4")), metadata=md, timeout=30):
    events.append((time.monotonic(), ev))
kinds = [ev.WhichOneof("event") for _, ev in events]
assert kinds[0] == "init" and kinds[-1] == "exit" and events[-1][1].exit.exit_code == 4, kinds
out = b"".join(ev.stdout for _, ev in events if ev.WhichOneof("event") == "stdout")
err = b"".join(ev.stderr for _, ev in events if ev.WhichOneof("event") == "stderr")
assert out == b"1\n2\n3\n" and err == b"bye\n", (out, err)
first = next(t for t, ev in events if ev.WhichOneof("event") == "stdout")
assert events[-1][0] - first > 0.7, "output arrived as it was written, not at the end"
ok("Start: init, stdout and stderr streamed as written, then exit")

# stdin: a cat fed through WriteStdin, closed with EOF.
stream = stub.Start(pb.StartRequest(config=config("cat")), metadata=md, timeout=30)
pid = next(stream).init.process_id
stub.WriteStdin(pb.WriteStdinRequest(process_id=pid, input=b"ping\n"), metadata=md, timeout=10)
ev = next(stream)
assert ev.stdout == b"ping\n", ev
stub.WriteStdin(pb.WriteStdinRequest(process_id=pid, eof=empty_pb2.Empty()), metadata=md, timeout=10)
rest = list(stream)
assert rest[-1].exit.exit_code == 0, rest
ok("WriteStdin: input reaches the process, EOF ends it")

# SendSignal.
stream = stub.Start(pb.StartRequest(config=config("sleep", "60")), metadata=md, timeout=30)
pid = next(stream).init.process_id
stub.SendSignal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM), metadata=md, timeout=10)
rest = list(stream)
assert rest[-1].exit.exit_code == 128 + 15, rest
ok("SendSignal SIGTERM: the process ends, exit code 128 + 15")

try:
    stub.SendSignal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL), metadata=md, timeout=10)
    raise AssertionError("signal to an ended process")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
ok("a process whose stream ended is not found")

# A PTY session: a shell on a terminal, resized, interrupted, exited.
stream = stub.Start(pb.StartRequest(config=config("/bin/sh"), pty=pb.PTY(cols=100, rows=30)), metadata=md, timeout=60)
pid = next(stream).init.process_id
seen = bytearray()
lock = threading.Lock()


def reader():
    try:
        for ev in stream:
            with lock:
                if ev.WhichOneof("event") == "stdout":
                    seen.extend(ev.stdout)
                elif ev.WhichOneof("event") == "exit":
                    seen.extend(b"<exit %d>" % ev.exit.exit_code)
    except grpc.RpcError:
        pass


th = threading.Thread(target=reader, daemon=True)
th.start()


def wait_for(marker, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            if marker in seen:
                return
        time.sleep(0.05)
    with lock:
        raise AssertionError(f"{marker!r} not in {bytes(seen)!r}")


def typed(s):
    stub.WriteStdin(pb.WriteStdinRequest(process_id=pid, input=s), metadata=md, timeout=10)


typed(b"tty; stty size; echo A$((1+1))Z\n")
wait_for(b"A2Z")
with lock:
    assert b"/dev/pts/" in seen and b"30 100" in seen, bytes(seen)
ok("a PTY: the shell's stdin is a terminal of the size asked for")

stub.ResizeTTY(pb.ResizeTTYRequest(process_id=pid, cols=120, rows=40), metadata=md, timeout=10)
typed(b"stty size; echo B$((2+1))Z\n")
wait_for(b"B3Z")
with lock:
    assert b"40 120" in seen, bytes(seen)
ok("ResizeTTY: the terminal takes the new size")

typed(b"sleep 30; echo C$((3+1))Z\n")
time.sleep(0.5)
stub.SendSignal(pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGINT), metadata=md, timeout=10)
typed(b"echo D$((4+1))Z\n")
# Long before the sleep's 30 s: the interrupt ended it and the shell read the next line.
wait_for(b"D5Z", timeout=10)
ok("SendSignal SIGINT on a PTY: the foreground job is interrupted, the shell lives")

typed(b"exit 7\n")
wait_for(b"<exit 7>")
th.join(5)
ok("the PTY session ends with the shell's exit code")

stream = stub.Start(pb.StartRequest(config=config("true")), metadata=md, timeout=30)
pid = next(stream).init.process_id
try:
    stub.ResizeTTY(pb.ResizeTTYRequest(process_id=pid, cols=80, rows=24), metadata=md, timeout=10)
except grpc.RpcError as e:
    # Either refused for having no terminal, or already gone.
    assert e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND), e
list(stream)
stream = stub.Start(pb.StartRequest(config=config("sleep", "5")), metadata=md, timeout=30)
pid = next(stream).init.process_id
try:
    stub.ResizeTTY(pb.ResizeTTYRequest(process_id=pid, cols=80, rows=24), metadata=md, timeout=10)
    raise AssertionError("resize without a terminal")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "terminal" in e.details(), e
stream.cancel()
ok("ResizeTTY on a process without a terminal: FAILED_PRECONDITION")

# A Start stream the client drops kills its process (as sandboxd does).
stream = stub.Start(pb.StartRequest(config=config("sleep", "1007")), metadata=md, timeout=60)
next(stream)
stream.cancel()
count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1007' || true"
deadline = time.monotonic() + 10
while True:
    n = stub.Execute(pb.ExecuteRequest(config=config("sh", "-c", count)), metadata=md, timeout=30).stdout.strip()
    if n == b"0":
        break
    assert time.monotonic() < deadline, f"{n} sleep 1007 still running"
    time.sleep(0.1)
ok("a cancelled Start stream kills its process")

for bad_md, code in [
    ([("authorization", f"Bearer {KEY}")], grpc.StatusCode.INVALID_ARGUMENT),
    ([("x-sandbox-id", SB), ("authorization", "Bearer nope")], grpc.StatusCode.UNAUTHENTICATED),
    ([("x-sandbox-id", SB)], grpc.StatusCode.UNAUTHENTICATED),
    ([("x-sandbox-id", "sb-nope"), ("authorization", f"Bearer {KEY}")], grpc.StatusCode.NOT_FOUND),
]:
    try:
        stub.Execute(pb.ExecuteRequest(config=config("true")), metadata=bad_md, timeout=10)
        raise AssertionError(f"accepted {bad_md}")
    except grpc.RpcError as e:
        assert e.code() == code, (bad_md, e)
ok("gRPC: no sandbox id, a wrong or missing key, an unknown sandbox: refused by name")

try:
    stub.WriteStdin(pb.WriteStdinRequest(process_id=999999, input=b"x"), metadata=md, timeout=10)
    raise AssertionError("unknown process")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
ok("WriteStdin to an unknown process: NOT_FOUND")

# --- sandboxd REST (files, health, metadata), as any HTTP client speaks it -----------------

h = {"X-Sandbox-ID": SB, "X-Sandbox-Port": "8080", "Authorization": f"Bearer {KEY}"}
rest = f"{URL}/v1"
r = requests.put(f"{rest}/files/src%2Fmain.sh?mode=0755", data=b"#!/bin/sh\necho from-rest\n", headers=h)
assert r.status_code == 204, r.text
r = stub.Execute(pb.ExecuteRequest(config=config("./src/main.sh")), metadata=md, timeout=30)
assert r.stdout == b"from-rest\n", r
ok("PUT /v1/files with mode=0755: an executable file, parents made")

r = requests.get(f"{rest}/files/src/main.sh", headers=h)
assert r.status_code == 200 and r.content == b"#!/bin/sh\necho from-rest\n" and r.headers["content-type"] == "application/octet-stream"
r = requests.head(f"{rest}/files/src/main.sh", headers=h)
assert r.status_code == 200 and r.headers["content-length"] == "25", r.headers
assert requests.head(f"{rest}/files/src/none", headers=h).status_code == 404
ok("GET and HEAD /v1/files: bytes, length, 404 for a missing file")

r = requests.get(f"{rest}/files/src", headers=h)
listing = r.json()
assert listing["path"] == "/src" and [(e["name"], e["type"], e["mode"]) for e in listing["entries"]] == [("main.sh", "file", "0755")], listing
assert listing["entries"][0]["modified_at"].endswith("Z"), listing
ok("GET /v1/files on a directory: a DirectoryListing")

files = {"file": ("x", b"form-bytes")}
assert requests.put(f"{rest}/files/src/form.txt", files=files, headers=h).status_code == 204
assert requests.get(f"{rest}/files/src/form.txt", headers=h).content == b"form-bytes"
ok("PUT /v1/files as multipart/form-data")

r = requests.delete(f"{rest}/files/src", headers=h)
assert r.status_code == 409 and r.json()["code"] == "CONFLICT", r.text
assert requests.delete(f"{rest}/files/src?recursive=true", headers=h).status_code == 204
assert requests.get(f"{rest}/files/src", headers=h).status_code == 404
assert requests.delete(f"{rest}/files/src", headers=h).status_code == 404
ok("DELETE /v1/files: 409 on a non-empty directory, recursive=true removes it, then 404")

r = requests.get(f"{rest}/files/..%2F..%2Fetc%2Fpasswd", headers=h)
assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED", r.text
assert requests.put(f"{rest}/files/a?mode=777", data=b"x", headers=h).status_code == 400
ok("REST refusals: traversal 403, a bad mode 400")

r = requests.get(f"{rest}/health", headers=h).json()
assert r["status"] == "ok" and isinstance(r["uptime_seconds"], int), r
r = requests.get(f"{rest}/metadata", headers=h).json()
assert r == {"env": {"SANDBOX_REGION": "test-region"}}, r
ok("/v1/health, and /v1/metadata shows SANDBOX_* variables but no credential")

r = requests.get(f"{rest}/files/x", headers={**h, "X-Sandbox-Port": "3000"})
assert r.status_code == 400 and "port" in r.json()["message"], r.text
r = requests.get(f"{rest}/files/x", headers={"X-Sandbox-ID": SB})
assert r.status_code == 401, r.text
r = requests.post(f"{URL}/frobnicate", headers=h)
assert r.status_code == 404 and "docs/sandboxd.md" in r.json()["message"], r.text
ok("HTTP refusals: another port 400, no key 401, an unknown route 404 naming the protocol")

print(f"sandboxd {sdkcheck.checks} checks ok")
