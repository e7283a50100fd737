"""The everyday surface of the official `daytona` SDK against Glovebox: conflicting network
options, exec, sessions and their logs, files, labels, stop/start keeping files, errors
raised as the SDK's own exception types."""

import json
import time
import urllib.request

from daytona import (
    CodeRunParams,
    DaytonaAuthenticationError,
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaBadRequestError,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    FileUpload,
    ListSandboxesQuery,
    SessionExecuteRequest,
    VolumeMount,
)

from checks import check, done, env, raises

daytona = Daytona(DaytonaConfig(api_key=env("DAYTONA_API_KEY"), api_url=env("DAYTONA_API_URL")))


def native(sid):
    """The sandbox as Glovebox's own API shows it."""
    url = env("DAYTONA_API_URL").removesuffix("/daytona/api") + f"/v1/sandboxes/{sid}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {env('DAYTONA_API_KEY')}"})
    return json.load(urllib.request.urlopen(req, timeout=10))


# The three egress options are mutually exclusive: a 400 in Daytona's shape.
e = raises(
    "block-all with an allow list is the SDK's bad-request error",
    DaytonaBadRequestError,
    daytona.create,
    CreateSandboxFromSnapshotParams(network_block_all=True, network_allow_list="10.0.0.0/8"),
)
check("...saying why", "mutually exclusive" in str(e), str(e))
check("...with status 400", e.status_code == 400, e.status_code)
e = raises(
    "an unsupported option is refused, not ignored",
    DaytonaError,
    daytona.create,
    CreateSandboxFromSnapshotParams(os_user="someone"),
)
check("...naming it", "choosing the OS user is not supported" in str(e), str(e))
e = raises("a bad key is the SDK's authentication error", DaytonaAuthenticationError, Daytona(DaytonaConfig(api_key="nope", api_url=env("DAYTONA_API_URL"))).create)
check("...a 401", e.status_code == 401, e.status_code)

sb = daytona.create(CreateSandboxFromSnapshotParams(labels={"team": "glovebox", "run": "t1"}, env_vars={"GREETING": "hi"}))
check("labels are kept", sb.labels.get("team") == "glovebox" and sb.labels.get("run") == "t1", sb.labels)
check("the language label the SDK adds is kept", sb.labels.get("code-toolbox-language") == "python", sb.labels)
n = native(sb.id)
check("the default auto-stop is a 15-minute idle clock that pauses", (n.get("idle_timeout_s"), n.get("on_idle")) == (900, "pause"), n)
check("labels are Glovebox metadata", n["metadata"].get("team") == "glovebox", n)
found = [s.id for s in daytona.list()]
check("list has it", sb.id in found, found)
other = daytona.create(CreateSandboxFromSnapshotParams(labels={"team": "other"}))
found = [s.id for s in daytona.list(ListSandboxesQuery(labels={"team": "glovebox"}))]
check("list filters by labels", found == [sb.id], found)
found = [s.id for s in daytona.list(ListSandboxesQuery(limit=1))]
check("list pages through all (limit 1 a page)", sorted(found) == sorted([sb.id, other.id]), found)
found = [s.id for s in daytona.list(ListSandboxesQuery(states=["stopped"]))]
check("list filters by state", found == [], found)
raises("a filter Glovebox cannot apply is refused", DaytonaError, lambda: list(daytona.list(ListSandboxesQuery(min_cpu=2))))
other.delete()
again = daytona.get(sb.id)
check("get answers it by id", again.id == sb.id and again.state == "started", again.state)
check("set_labels to the same labels is answered", sb.set_labels(dict(sb.labels)) is not None)
moved = {**sb.labels, "team": "moved"}
sb.set_labels(moved)
check("set_labels replaces the labels live", sb.labels == moved, sb.labels)
check("...as Glovebox metadata", native(sb.id)["metadata"] == moved, native(sb.id))
check("...which get answers", daytona.get(sb.id).labels == moved)
found = [s.id for s in daytona.list(ListSandboxesQuery(labels={"team": "moved"}))]
check("...and list filters by", found == [sb.id], found)

# process.exec
r = sb.process.exec("echo $GREETING from $(pwd); echo oops >&2; exit 4")
check("exec returns the exit code", r.exit_code == 4, r.exit_code)
check("exec result has stdout and stderr", "hi from" in r.result and "oops" in r.result, r.result)
r = sb.process.exec("pwd", cwd="/tmp", env={"X": "y"})
check("exec honours cwd", r.result.strip() == "/tmp", r.result)
r = sb.process.exec("echo $X", env={"X": "y"})
check("exec honours env", r.result.strip() == "y", r.result)
raises("a command over its timeout is the SDK's timeout error", DaytonaTimeoutError, sb.process.exec, "sleep 5", timeout=1)
check("the sandbox is usable after a timeout", sb.process.exec("echo alive").result.strip() == "alive")

r = sb.process.code_run("import sys; print(sys.argv[1:])", params=CodeRunParams(argv=["a", "b"], env={"K": "v"}))
check("code_run passes argv", r.result.strip() == "['a', 'b']", r.result)
r = sb.process.code_run("import os; print(os.environ['K'])", params=CodeRunParams(env={"K": "v"}))
check("code_run passes env", r.result.strip() == "v", r.result)

# sessions
sb.process.create_session("s1")
out = sb.process.execute_session_command("s1", SessionExecuteRequest(command="echo one; echo two >&2; exit 3"))
check("a session command runs to its end", out.exit_code == 3, out.exit_code)
check("...with its output", "one" in out.stdout and "two" in out.stderr, (out.stdout, out.stderr))
bg = sb.process.execute_session_command("s1", SessionExecuteRequest(command="echo early; sleep 1; echo later", run_async=True))
check("an async command answers its id at once", bg.cmd_id is not None and bg.exit_code is None, bg)
running = sb.process.get_session_command_logs("s1", bg.cmd_id)
check("a running command's logs have its output so far", running.stdout.strip() == "early", running)


def finished():
    c = sb.process.get_session_command("s1", bg.cmd_id)
    return c.exit_code is not None and c


deadline = time.time() + 20
c = finished()
while not c and time.time() < deadline:
    time.sleep(0.2)
    c = finished()
check("the async command finishes", c and c.exit_code == 0, c)
logs = sb.process.get_session_command_logs("s1", bg.cmd_id)
check("its logs have its whole output", logs.stdout.split() == ["early", "later"], logs)
session = sb.process.get_session("s1")
check("the session lists both commands", len(session.commands) == 2, session.commands)
check("...with their commands", session.commands[0].command.startswith("echo one"), session.commands[0])
check("list_sessions has it", [s.session_id for s in sb.process.list_sessions()] == ["s1"])
sb.process.delete_session("s1")
raises("a deleted session is not found", DaytonaNotFoundError, sb.process.get_session, "s1")

# fs
sb.fs.create_folder("/tmp/work", "755")
info = sb.fs.get_file_info("/tmp/work")
check("create_folder makes a directory", info.is_dir, info)
check("...with its mode", info.permissions == "0755", info.permissions)
sb.fs.upload_file(b"alpha\nbeta\n", "/tmp/work/a.txt")
sb.fs.upload_files([FileUpload(b"\x00\x01\x02binary", "/tmp/work/b.bin"), FileUpload(b"gamma\n", "/tmp/work/sub/c.txt")])
check("upload/download round-trips text", sb.fs.download_file("/tmp/work/a.txt") == b"alpha\nbeta\n")
check("...and bytes", sb.fs.download_file("/tmp/work/b.bin") == b"\x00\x01\x02binary")
check("upload makes missing directories", sb.fs.download_file("/tmp/work/sub/c.txt") == b"gamma\n")
names = sorted(f.name for f in sb.fs.list_files("/tmp/work"))
check("list_files lists them", names == ["a.txt", "b.bin", "sub"], names)
info = sb.fs.get_file_info("/tmp/work/a.txt")
check("get_file_info has the size", info.size == 11 and not info.is_dir, info)
matches = sb.fs.find_files("/tmp/work", "beta")
check("find_files finds the line", [(m.file, m.line, m.content) for m in matches] == [("/tmp/work/a.txt", 2, "beta")], matches)
res = sb.fs.replace_in_files(["/tmp/work/a.txt"], "beta", "BETA")
check("replace_in_files reports success", res and res[0].success, res)
check("...and the file changed", sb.fs.download_file("/tmp/work/a.txt") == b"alpha\nBETA\n")
sb.fs.set_file_permissions("/tmp/work/a.txt", mode="600")
check("set_file_permissions changes the mode", sb.fs.get_file_info("/tmp/work/a.txt").permissions == "0600")
sb.fs.move_files("/tmp/work/a.txt", "/tmp/work/moved.txt")
check("move_files moves", sb.fs.download_file("/tmp/work/moved.txt") == b"alpha\nBETA\n")
raises("a missing file is the SDK's not-found error", DaytonaNotFoundError, sb.fs.get_file_info, "/tmp/work/a.txt")
raises("downloading a missing file raises", DaytonaError, sb.fs.download_file, "/tmp/work/a.txt")
found = sb.fs.search_files("/tmp/work", "*.txt").files
check("search_files finds names by glob", sorted(found) == ["/tmp/work/moved.txt", "/tmp/work/sub/c.txt"], found)
sb.fs.delete_file("/tmp/work/sub", recursive=True)
names = sorted(f.name for f in sb.fs.list_files("/tmp/work"))
check("delete_file removes a directory", names == ["b.bin", "moved.txt"], names)
check("home dir is the sandbox's", sb.get_user_home_dir().startswith("/"))

# stop keeps files, start resumes
sb.process.exec("echo kept > /tmp/work/state.txt")
sb.stop()
check("stop leaves it stopped", sb.state == "stopped", sb.state)
check("get shows it stopped", daytona.get(sb.id).state == "stopped")
sb.start()
check("start starts it again", sb.state == "started", sb.state)
check("files survive stop/start", sb.fs.download_file("/tmp/work/state.txt") == b"kept\n")
sb.set_autostop_interval(15)
check("set_autostop_interval to its interval is answered", sb.auto_stop_interval == 15)
sb.set_autostop_interval(30)
n = native(sb.id)
check("set_autostop_interval changes the idle clock live", (n.get("idle_timeout_s"), n.get("on_idle")) == (1800, "pause"), n)
check("...which get answers", daytona.get(sb.id).auto_stop_interval == 30)
sb.set_autostop_interval(0)
check("an interval of 0 turns the idle clock off", native(sb.id).get("idle_timeout_s") is None, native(sb.id))
check("...which get answers", daytona.get(sb.id).auto_stop_interval == 0)
# git, with the template's git
repo = "/tmp/repo"
sb.git.init(repo, initial_branch="main")
sb.fs.upload_file(b"hello\n", f"{repo}/README.md")
st = sb.git.status(repo)
check("git status sees an untracked file", [(f.name, str(f.worktree.value)) for f in st.file_status] == [("README.md", "Untracked")], st)
sb.git.add(repo, ["README.md"])
check("git add stages it", sb.git.status(repo).file_status[0].staging.value == "Added")
c = sb.git.commit(repo, "first", "Glovebox Test", "test@example.invalid")
check("git commit answers the hash", len(c.sha) == 40, c)
log = sb.process.exec(f"git -C {repo} log --format='%an <%ae> %s'").result.strip()
check("...with the author given", log == "Glovebox Test <test@example.invalid> first", log)
sb.git.create_branch(repo, "feature")
br = sb.git.branches(repo)
check("git branches lists both", sorted(br.branches) == ["feature", "main"], br)
sb.git.checkout_branch(repo, "feature")
check("git checkout switches", sb.git.status(repo).current_branch == "feature")
sb.git.clone(repo, "/tmp/clone")
check("git clone (a path inside the sandbox) copies the repo", sb.fs.download_file("/tmp/clone/README.md") == b"hello\n")
sb.git.checkout_branch(repo, "main")
sb.git.delete_branch(repo, "feature")
check("git delete_branch removes it", sb.git.branches(repo).branches == ["main"])
raises("git status outside a repository is the SDK's not-found error", DaytonaNotFoundError, sb.git.status, "/tmp/work")
e = raises("git push is answered as unsupported", DaytonaError, sb.git.push, repo)
check("...saying so", "not supported" in str(e), str(e))

# bad input is a 4xx in Daytona's shape, never a 5xx
import httpx  # noqa: E402

api = env("DAYTONA_API_URL")
native_url = api.removesuffix("/daytona/api")
auth = {"Authorization": f"Bearer {env('DAYTONA_API_KEY')}"}
tb = f"{sb.toolbox_proxy_url}/{sb.id}"
bad = [
    httpx.post(f"{api}/sandbox", headers=auth, content=b"{not json"),
    httpx.post(f"{api}/sandbox", headers=auth, json={"cpu": 1000}),
    httpx.post(f"{api}/sandbox", headers=auth, json={"memory": 0}),
    httpx.post(f"{api}/sandbox", headers=auth, json={"autoStopInterval": -1}),
    httpx.post(f"{api}/sandbox", headers=auth, json={"networkAllowList": "not-an-address"}),
    httpx.post(f"{api}/sandbox", headers=auth, json={"snapshot": "no-such-template"}),
    httpx.post(f"{api}/sandbox/{sb.id}/autostop/minus", headers=auth),
    httpx.post(f"{tb}/process/execute", headers=auth, content=b"[]"),
    httpx.post(f"{tb}/process/execute", headers=auth, json={"command": "true", "timeout": 10**12}),
    httpx.post(f"{tb}/process/code-run", headers=auth, json={"code": "1", "language": "cobol"}),
    httpx.post(f"{tb}/files/bulk-upload", headers=auth, content=b"plain"),
    httpx.post(f"{tb}/files/bulk-upload", headers={**auth, "Content-Type": "multipart/form-data; boundary=x"}, content=b"--x\r\nbroken"),
    httpx.get(f"{tb}/files/info", headers=auth),
    httpx.get(f"{tb}/files", headers=auth, params={"path": "/tmp", "depth": "0"}),
    httpx.post(f"{tb}/files/folder", headers=auth, params={"path": "/tmp/x", "mode": "999"}),
    httpx.get(f"{tb}/files/search", headers=auth, params={"path": "-delete", "pattern": "*"}),
    httpx.post(f"{tb}/git/branches", headers=auth, json={"path": "/tmp/repo", "name": "--force"}),
    httpx.get(f"{tb}/process/session/nope", headers=auth),
    httpx.get(f"{api}/sandbox/{sb.id}", headers={"Authorization": "Bearer wrong"}),
]
codes = [r.status_code for r in bad]
check("bad input is answered 4xx", all(400 <= c < 500 for c in codes), codes)
check("...in Daytona's error shape", all(isinstance(r.json().get("message"), str) and r.json().get("statusCode") == r.status_code for r in bad), [(r.status_code, r.text) for r in bad])

# unknown sandboxes
raises("an unknown sandbox is the SDK's not-found error", DaytonaNotFoundError, daytona.get, "no-such-sandbox")

eph = daytona.create(CreateSandboxFromSnapshotParams(ephemeral=True))
eph.stop()
check("stopping an ephemeral sandbox deletes it", eph.state == "destroyed", eph.state)
raises("...so it is not found", DaytonaNotFoundError, daytona.get, eph.id)
# volumes: a Glovebox volume, named by volume_id, outlives the sandboxes that mount it
vol = f"dtvol{int(time.time() * 1000) % 100000}"
made = httpx.post(f"{native_url}/v1/volumes", headers=auth, json={"name": vol, "size_mb": 32})
check("a Glovebox volume is made (native API)", made.status_code in (200, 201), made.text)
one = daytona.create(CreateSandboxFromSnapshotParams(volumes=[VolumeMount(volume_id=vol, mount_path="/data")]))
check("the sandbox shows the volume", [(v.volume_id, v.mount_path) for v in one.volumes] == [(vol, "/data")], one.volumes)
one.process.exec("echo persisted > /data/note.txt")
one.delete()
two = daytona.create(CreateSandboxFromSnapshotParams(volumes=[VolumeMount(volume_id=vol, mount_path="/mnt/v")]))
check("a volume's files outlive the sandbox", two.fs.download_file("/mnt/v/note.txt") == b"persisted\n")
two.delete()
raises("a volume subpath is refused", DaytonaError, daytona.create, CreateSandboxFromSnapshotParams(volumes=[VolumeMount(volume_id=vol, mount_path="/d", subpath="x")]))
raises("an unknown volume is not found", DaytonaNotFoundError, daytona.create, CreateSandboxFromSnapshotParams(volumes=[VolumeMount(volume_id="no-such-volume", mount_path="/d")]))
gone = httpx.delete(f"{native_url}/v1/volumes/{vol}", headers=auth)
check("the volume is deleted after (native API)", gone.status_code in (200, 204), gone.text)

short = daytona.create(CreateSandboxFromSnapshotParams(ttl_minutes=2))
n = native(short.id)
left_s = time.mktime(time.strptime(n["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(time.gmtime())
check("ttl_minutes is the lifetime clock", 60 < left_s <= 120, (n["expires_at"], left_s))
short.delete()

sb.delete()
raises("a deleted sandbox is not found", DaytonaNotFoundError, daytona.get, sb.id)
left = [s.id for s in daytona.list()]
check("nothing left", left == [], left)
done("everyday")
