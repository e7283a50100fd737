"""Sandbox lifecycle through the official `e2b` SDK: create (with timeout, envs, metadata),
list by metadata, connect, set_timeout, get_info, kill, a sandbox that ends at its timeout,
unknown templates, bad API keys, and sandbox access tokens."""

import time
import uuid

import httpx
from e2b import (
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    TimeoutException,
)

from checks import check, done, env, poll, raises

url = env("E2B_API_URL")
run = uuid.uuid4().hex[:8]

plain = Sandbox.create()
check("create() gives an id", len(plain.sandbox_id) > 8, plain.sandbox_id)
check("a fresh sandbox runs commands", plain.commands.run("echo hi").stdout == "hi\n")
check("is_running", plain.is_running())

sb = Sandbox.create(timeout=120, envs={"GREETING": "hello e2b"}, metadata={"run": run, "role": "main"})
check("create(envs=…) reaches commands", sb.commands.run("echo $GREETING").stdout.strip() == "hello e2b")
other = Sandbox.create(timeout=60, metadata={"run": run, "role": "other"})

# get_host(port) names the daemon's preview host of that port (Host-routed, on the daemon's
# own listener; the name is sent as a Host header so nothing is resolved); the sandbox's
# traffic token opens it, and without it the port is private.
sb.commands.run("cd /tmp && python3 -m http.server 8000 >/dev/null 2>&1", background=True)
preview = sb.get_host(8000)
port = url.rsplit(":", 1)[1].strip("/")
check("get_host(8000) is the preview host", preview == f"8000-{sb.sandbox_id}.localhost:{port}", preview)
through = lambda h: httpx.get(url.rstrip("/") + "/", headers={"Host": preview, **h}, timeout=10)  # noqa: E731
r = poll(lambda: (lambda r: r if r.status_code == 200 else None)(through({"e2b-traffic-access-token": sb.traffic_access_token})), 20)
check("get_host(8000) with the traffic token reaches the server", r is not None and "Directory listing" in r.text)
check("get_host(8000) without it is private", through({}).status_code == 401)

ids = lambda q: {s.sandbox_id for s in Sandbox.list(query=q).next_items()}  # noqa: E731
from e2b.sandbox.sandbox_api import SandboxQuery  # noqa: E402

check("list() filters by metadata", ids(SandboxQuery(metadata={"run": run})) == {sb.sandbox_id, other.sandbox_id})
check("list() filters by two keys", ids(SandboxQuery(metadata={"run": run, "role": "main"})) == {sb.sandbox_id})
check("list() filter with no match", ids(SandboxQuery(metadata={"run": "nope " + run})) == set())
listed = [s for s in Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items() if s.sandbox_id == sb.sandbox_id][0]
check("listed metadata", listed.metadata == {"run": run, "role": "main"}, listed.metadata)
check("listed state", str(listed.state).lower().endswith("running"), listed.state)

metrics = sb.get_metrics()
check("get_metrics", len(metrics) == 1 and metrics[0].mem_total > 0 and metrics[0].cpu_count >= 1, metrics)

info = sb.get_info()
check("get_info metadata", info.metadata == {"run": run, "role": "main"})
end1 = info.end_at
sb.set_timeout(600)
end2 = sb.get_info().end_at
check("set_timeout moves the end", (end2 - end1).total_seconds() > 400, f"{end1} -> {end2}")

again = Sandbox.connect(sb.sandbox_id)
check("connect(id) reaches the same sandbox", again.commands.run("echo $GREETING").stdout.strip() == "hello e2b")
again.files.write("/tmp/from-connect", "x")
check("connect shares files", sb.files.read("/tmp/from-connect") == "x")

raises("connect(unknown id) -> NotFoundException", NotFoundException, Sandbox.connect, "nosuchsandbox0000")
raises("get_info(unknown id) -> NotFoundException", NotFoundException, Sandbox.get_info, "nosuchsandbox0000")
check("kill(unknown id) is False", Sandbox.kill("nosuchsandbox0000") is False)

e = raises("unknown template -> SandboxException", SandboxException, Sandbox.create, "no-such-template-" + run)
check("unknown template says 404 not found", "404" in str(e) and "not found" in str(e), str(e))
raises("a wrong API key -> AuthenticationException", AuthenticationException, Sandbox.create, api_key="e2b_wrong")
raises("list with a wrong key -> AuthenticationException", AuthenticationException,
       lambda: Sandbox.list(api_key="e2b_wrong").next_items())

# The in-sandbox API wants the sandbox's own access token.
hdr = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"}
r = httpx.post(f"{url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers=hdr)
check("envd without a token is 401", r.status_code == 401, r.status_code)
r = httpx.post(f"{url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers={**hdr, "X-Access-Token": "wrong"})
check("envd with a wrong token is 401", r.status_code == 401, r.status_code)
r = httpx.post(f"{url}/filesystem.Filesystem/Stat", json={"path": "/"},
               headers={**hdr, "X-Access-Token": sb._envd_access_token})
check("envd with the token works", r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", r.text)

# A tenant's key (made with the native API) sees only its own sandboxes.
admin = env("E2B_API_KEY")
r = httpx.post(f"{url}/v1/keys", json={"tenant": "e2b-" + run}, headers={"Authorization": f"Bearer {admin}"})
check("a tenant key is made", r.status_code == 201, r.text)
tkey = r.json()["key"]
mine = Sandbox.create(api_key=tkey, timeout=60, metadata={"run": run, "role": "tenant"})
check("a tenant's list shows only its sandboxes",
      {s.sandbox_id for s in Sandbox.list(api_key=tkey).next_items()} == {mine.sandbox_id})
raises("a tenant cannot connect to another's sandbox", NotFoundException, Sandbox.connect, sb.sandbox_id, api_key=tkey)
check("a tenant cannot kill another's sandbox", Sandbox.kill(sb.sandbox_id, api_key=tkey) is False)
check("the admin key sees the tenant's sandbox", mine.sandbox_id in ids(SandboxQuery(metadata={"run": run})))
mine.kill()

check("kill() is True", sb.kill() is True)
check("a killed sandbox is not listed", sb.sandbox_id not in ids(SandboxQuery(metadata={"run": run})))
raises("get_info after kill -> NotFoundException", NotFoundException, Sandbox.get_info, sb.sandbox_id)
raises("commands after kill -> SandboxNotRunningException", SandboxNotRunningException,
       again.commands.run, "echo hi")
check("is_running after kill", again.is_running() is False)
other.kill()
plain.kill()

# Pause and resume: list shows the paused sandbox, connect resumes it, its files and
# processes are as they were.
from e2b import SandboxState  # noqa: E402

ps = Sandbox.create(timeout=120, metadata={"run": run, "role": "paused"})
ps.commands.run("echo kept > /tmp/state")
ps.commands.run("sleep 600", background=True)
check("pause() is True", ps.pause() is True)
check("a second pause() is False", Sandbox.pause(ps.sandbox_id) is False)
paused = lambda: ids(SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED]))  # noqa: E731
check("list(state=paused) shows it", paused() == {ps.sandbox_id}, paused())
check("list(state=running) does not", ps.sandbox_id not in ids(SandboxQuery(metadata={"run": run}, state=[SandboxState.RUNNING])))
check("get_info says paused", str(Sandbox.get_info(ps.sandbox_id).state).lower().endswith("paused"))
back = Sandbox.connect(ps.sandbox_id)
check("connect() resumes it", str(Sandbox.get_info(ps.sandbox_id).state).lower().endswith("running"))
check("its files are kept", back.commands.run("cat /tmp/state").stdout == "kept\n")
check("its processes are kept", back.commands.run("pgrep -x sleep").exit_code == 0)
ps.pause()
# As in E2B, traffic does not wake a paused sandbox unless it was created with auto_resume.
from e2b import TimeoutException  # noqa: E402
check("is_running() of a paused sandbox is False", ps.is_running() is False)
raises("a command on a paused sandbox (no auto_resume) -> TimeoutException", TimeoutException,
       ps.commands.run, "echo awake")
check("and it stays paused", str(Sandbox.get_info(ps.sandbox_id).state).lower().endswith("paused"))
ps.kill()
ar = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True}, metadata={"run": run})
ar.pause()
check("with auto_resume, a command on a paused sandbox resumes it", ar.commands.run("echo awake").stdout == "awake\n")
check("and it runs again", str(Sandbox.get_info(ar.sandbox_id).state).lower().endswith("running"))
ar.kill()

# on_timeout pause (autoPause): idle past its timeout, the sandbox is paused, not killed.
ap = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"}, metadata={"run": run, "role": "autopause"})
check("an auto-pause sandbox runs", ap.commands.run("echo up").stdout == "up\n")
check("it is paused after its timeout", poll(lambda: ap.sandbox_id in paused(), 15), paused())
check("connect() resumes it", Sandbox.connect(ap.sandbox_id).commands.run("echo again").stdout == "again\n")
ap.kill()

# A sandbox really ends at its timeout.
short = Sandbox.create(timeout=3, metadata={"run": run, "role": "short"})
check("a short sandbox runs", short.commands.run("echo up").stdout == "up\n")
t0 = time.time()
gone = poll(lambda: short.sandbox_id not in ids(SandboxQuery(metadata={"run": run})), 20)
check("the sandbox is gone at its timeout", gone, f"after {time.time() - t0:.1f}s")
check("it lived about its timeout", time.time() - t0 < 15, f"{time.time() - t0:.1f}s")
raises("get_info after the timeout -> NotFoundException", NotFoundException, Sandbox.get_info, short.sandbox_id)
raises("commands after the timeout -> TimeoutException", TimeoutException, short.commands.run, "echo hi")

done("lifecycle")
