"""The everyday calls of the `modal` client against Glovebox: exec with streams, stdin, exit
codes and a per-exec timeout that kills the process tree; a sandbox's lifetime; env,
secrets and workdir; tags, from_id, list; an entrypoint; image steps; the network policy,
enforced against the test's own "internet" (a network namespace the test made, whose canary
listener logs every connection); and the refusals (a clear error, never a hang)."""

import json
import os
import time

import modal
import modal.exception

from checks import check, done, env, raises, timed

app = modal.App.lookup("glovebox-everyday", create_if_missing=True)
image = modal.Image.debian_slim().pip_install("pandas")
log = env("GLOVEBOX_TEST_CANARY_LOG")
GOOD, OTHER = "198.51.100.10", "198.51.100.20"
PROBE = (
    "import urllib.request,sys\n"
    "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=3).status)\n"
    "except Exception as e:\n print('blocked', type(e).__name__)"
)


def seen(path=log):
    """Connections the canary listener at GOOD logged (OTHER's go to `path`.evil)."""
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def fetch(sb, addr):
    p = sb.exec("python", "-c", PROBE, f"http://{addr}:8080/", timeout=20)
    return p.stdout.read().strip()


# --- exec: streams, exit codes, stdin -------------------------------------------------------
sb = modal.Sandbox.create(app=app, image=image, timeout=300, block_network=True)
p = sb.exec("bash", "-c", "echo out; echo err >&2; exit 3")
check("exec: stdout", p.stdout.read() == "out\n")
check("exec: stderr", p.stderr.read() == "err\n")
check("exec: exit code", p.wait() == 3)
p = sb.exec("cat")
p.stdin.write(b"hello from stdin")
p.stdin.write_eof()
p.stdin.drain()
check("exec: stdin reaches the process", p.stdout.read() == "hello from stdin")
check("exec: poll after the exit", p.wait() == 0 and p.poll() == 0)
p = sb.exec("python", "-c", "import pandas; print(pandas.__version__)")
check("the image's pip_install is there", p.stdout.read().strip()[:1].isdigit() and p.wait() == 0)
p = sb.exec("bash", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done")
lines = list(p.stdout)
check("exec: output streams line by line", lines == ["line 1\n", "line 2\n", "line 3\n"], lines)
p = sb.exec("python", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))", text=False)
check("exec: binary output (text=False)", p.stdout.read() == bytes(range(256)))

# --- the per-exec timeout kills the whole process tree --------------------------------------
p = sb.exec("bash", "-c", "sleep 300 & echo $! > /tmp/child; echo started; sleep 300", timeout=2)
code, took = timed(p.wait)
check("exec timeout: wait returns at the deadline", took < 10, f"{took:.1f}s")
check("exec timeout: reported as killed or timed out", code in (-1, 137), code)
alive = sb.exec("bash", "-c", "sleep 0.5; kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo dead")
check("exec timeout: the background child is killed too", alive.stdout.read().strip() == "dead")

# --- network: block_network is enforced; the default is open; an allow list allows -------
before = len(seen())
check("block_network: egress is blocked", fetch(sb, GOOD).startswith("blocked"))
check("block_network: the canary saw nothing", len(seen()) == before, seen()[before:])
opened = modal.Sandbox.create(app=app, image=image, timeout=120)
check("the default network is open (Modal's default)", fetch(opened, GOOD) == "200")
check("...and the canary saw that connection", len(seen()) > before)
listed = modal.Sandbox.create(app=app, image=image, timeout=120, outbound_cidr_allowlist=[f"{GOOD}/32"])
other_before = len(seen(log + ".evil"))
check("outbound_cidr_allowlist: its address is reached", fetch(listed, GOOD) == "200")
check("outbound_cidr_allowlist: others are not", fetch(listed, OTHER).startswith("blocked"))
check("...and their canary saw nothing", len(seen(log + ".evil")) == other_before)
opened.terminate()
listed.terminate()

# --- env, secrets, workdir -------------------------------------------------------------------
sb2 = modal.Sandbox.create(
    app=app,
    image=image,
    timeout=120,
    workdir="/work",
    env={"A": "1"},
    secrets=[modal.Secret.from_dict({"TOKEN": "s3cret"})],
    tags={"team": "glovebox"},
)
p = sb2.exec("bash", "-c", 'pwd; echo "$A $TOKEN"')
check("workdir, env and secrets reach commands", p.stdout.read() == "/work\n1 s3cret\n")
p = sb2.exec("pwd", workdir="/tmp", env={"B": "2"})
check("exec(workdir=...)", p.stdout.read() == "/tmp\n")

# --- tags, from_id, list, poll, terminate ---------------------------------------------------
check("tags given at create", sb2.get_tags() == {"team": "glovebox"})
sb2.set_tags({"team": "glovebox", "run": "2"})
check("set_tags / get_tags", sb2.get_tags() == {"team": "glovebox", "run": "2"})
again = modal.Sandbox.from_id(sb2.object_id)
check("Sandbox.from_id reaches the same sandbox", again.exec("cat", "/proc/1/cmdline").wait() == 0)
ids = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"run": "2"})]
check("Sandbox.list by app and tags", ids == [sb2.object_id], ids)
check("poll: running", sb2.poll() is None)
sb2.terminate()
sb2.wait(raise_on_termination=False)
check("terminate: the sandbox ends", sb2.returncode == 137 and sb2.poll() == 137)
raises("a terminated sandbox takes no exec", modal.exception.Error, lambda: sb2.exec("true").wait())

# --- the sandbox's lifetime ends it ---------------------------------------------------------
short = modal.Sandbox.create(app=app, image=image, timeout=3)
short.exec("sleep", "100")
_, took = timed(raises, "timeout: wait raises SandboxTimeoutError", modal.exception.SandboxTimeoutError, short.wait)
check("timeout: the sandbox ends at its lifetime", took < 15 and short.poll() == 124, (took, short.poll()))

# --- an entrypoint: its output and its exit are the sandbox's --------------------------------
ep = modal.Sandbox.create("bash", "-c", "sleep 1; echo from the entrypoint; exit 7", app=app, image=image)
check("entrypoint: stdout", ep.stdout.read() == "from the entrypoint\n")
ep.wait(raise_on_termination=False)
check("entrypoint: its exit code is the sandbox's", ep.returncode == 7, ep.returncode)

# --- image steps: run_commands, env, workdir ------------------------------------------------
stepped = modal.Image.debian_slim().run_commands("echo built > /opt/marker").env({"GREETING": "hello world"}).workdir("/opt")
sb3 = modal.Sandbox.create(app=app, image=stepped, timeout=60)
p = sb3.exec("bash", "-c", 'cat marker; echo "$GREETING"; pwd')
check("run_commands, env and workdir build into the image", p.stdout.read() == "built\nhello world\n/opt\n")
sb3.terminate()

# --- an ephemeral app (app.run(), output on): its sandboxes end when the client leaves it ----
eph = modal.App("glovebox-ephemeral")
with modal.enable_output():
    with eph.run():
        inside = modal.Sandbox.create(app=eph, image=image, timeout=120)
        check("app.run(): a sandbox in the ephemeral app runs", inside.exec("true").wait() == 0)
check("app.run(): leaving the app terminates its sandboxes", inside.poll() == 137, inside.poll())

# --- refusals: a clear error naming the feature, never a hang ------------------------------
# The client turns any refusal of its filesystem tool into a generic SandboxFilesystemError
# (the daemon's message naming the feature is in the client's debug log).
raises(
    "sb.filesystem: refused, not hung",
    modal.exception.SandboxFilesystemError,
    lambda: sb.filesystem.read_text("/etc/hostname"),
)
e = raises(
    "Modal Volumes: UNIMPLEMENTED",
    modal.exception.UnimplementedError,
    lambda: modal.Volume.from_name("v", create_if_missing=True).hydrate(),
)
check("...naming the feature", "Modal Volumes" in str(e), str(e))
e = raises(
    "GPUs: refused",
    modal.exception.ConflictError,
    lambda: modal.Sandbox.create(app=app, image=image, gpu="T4"),
)
check("...naming GPUs", "GPUs" in str(e), str(e))
e = raises(
    "apt_install on debian_slim: refused",
    modal.exception.ConflictError,
    lambda: modal.Sandbox.create(app=app, image=modal.Image.debian_slim().apt_install("cowsay")),
)
check("...naming apt_install", "apt_install" in str(e), str(e))

sb.terminate()
done("everyday")
