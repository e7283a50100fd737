"""The issue's program, unmodified but for the URL and key: the official `daytona` SDK
creates a block-all, ephemeral sandbox with a 5-minute auto-stop, runs code in it, reads
`exit_code` and `result`, and deletes it."""

import json
import time
import urllib.request

from daytona import CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig

from checks import check, done, env

daytona = Daytona(DaytonaConfig(api_key=env("DAYTONA_API_KEY"), api_url=env("DAYTONA_API_URL")))
t = time.monotonic()
sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, ephemeral=True, auto_stop_interval=5))
print(f"create_ms: {(time.monotonic() - t) * 1000:.0f}", flush=True)
check("create answers a started sandbox", sandbox.state == "started", sandbox.state)
check("Daytona's defaults: 1 vCPU, 1 GiB", (sandbox.cpu, sandbox.memory) == (1, 1), (sandbox.cpu, sandbox.memory))
# 3 GiB is asked for: more than fits in 1 GiB of memory, so the disk is on the host's disk.
check("Daytona's default disk: 3 GiB (disk-backed)", sandbox.disk == 3, sandbox.disk)
check("block-all is kept", sandbox.network_block_all is True)
check("ephemeral is auto-delete 0", sandbox.auto_delete_interval == 0)
check("auto-stop is 5 minutes", sandbox.auto_stop_interval == 5)



def native(sid):
    """The sandbox as Glovebox's own API shows it."""
    url = env("DAYTONA_API_URL").removesuffix("/daytona/api") + f"/v1/sandboxes/{sid}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {env('DAYTONA_API_KEY')}"})
    return json.load(urllib.request.urlopen(req, timeout=10))


n = native(sandbox.id)
check("auto-stop 5 is a 300 s idle clock", n.get("idle_timeout_s") == 300, n)
check("...that deletes (ephemeral), not pauses", n.get("on_idle") is None, n)
check("block-all is Glovebox's deny-all", n["network"]["mode"] == "deny-all", n["network"])

response = sandbox.process.code_run('import sys\nprint("Hello from Glovebox", 6 * 7)\nprint("to stderr", file=sys.stderr)', timeout=10)
check("code_run exits 0", response.exit_code == 0, response.exit_code)
check("result has the output", "Hello from Glovebox 42" in response.result, response.result)
check("...and stderr, as Daytona combines them", "to stderr" in response.result, response.result)
failed = sandbox.process.code_run("raise SystemExit(3)")
check("a failing program's exit code", failed.exit_code == 3, failed.exit_code)

sandbox.delete()
ids = [s.id for s in daytona.list()]
check("delete removes it", sandbox.id not in ids, ids)
done("seed")
