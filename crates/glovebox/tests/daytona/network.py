"""Network rules through the official `daytona` SDK, enforced for real against the test's
own "internet" (a network namespace holding TEST-NET-2 addresses; tests/inet builds it):
block-all stops egress (the canary listener sees nothing), an allow list lets only its
addresses through, and updates apply live."""

import json
import os

from daytona import CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig

from checks import check, done, env

daytona = Daytona(DaytonaConfig(api_key=env("DAYTONA_API_KEY"), api_url=env("DAYTONA_API_URL")))
log = env("GLOVEBOX_TEST_CANARY_LOG")
other_log = env("GLOVEBOX_TEST_OTHER_LOG")
GOOD, OTHER = "198.51.100.10", "198.51.100.20"
PROBE = (
    "import urllib.request,sys\n"
    "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=3).status)\n"
    "except Exception as e:\n print('blocked', type(e).__name__)"
)


def seen(path=log):
    """Connections a canary listener logged (GOOD's, or OTHER's at `other_log`)."""
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def fetch(sb, addr):
    return sb.process.exec(f'python3 -c "$P" http://{addr}:8080/', env={"P": PROBE}, timeout=20).result.strip()


blocked = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, ephemeral=True))
before, other_before = len(seen()), len(seen(other_log))
check("block-all stops egress", fetch(blocked, GOOD).startswith("blocked"))
check("...to any address", fetch(blocked, OTHER).startswith("blocked"))
check("the canary saw nothing", len(seen()) == before, seen()[before:])
check("the other canary saw nothing", len(seen(other_log)) == other_before)

allowed = daytona.create(CreateSandboxFromSnapshotParams(network_allow_list=f"{GOOD}/32"))
check("the allow list is shown", allowed.network_allow_list == f"{GOOD}/32" and not allowed.network_block_all)
before, other_before = len(seen()), len(seen(other_log))
check("an allow list lets its address through", fetch(allowed, GOOD) == "200")
check("the canary saw that connection", len(seen()) > before)
check("...and nothing else", fetch(allowed, OTHER).startswith("blocked"))
check("the other canary saw nothing", len(seen(other_log)) == other_before)

# Live updates.
blocked.update_network_settings(network_allow_list=f"{GOOD}/32")
check("update_network_settings opens an allow list", fetch(blocked, GOOD) == "200")
check("...to that address only", fetch(blocked, OTHER).startswith("blocked"))
allowed.update_network_settings(network_block_all=True)
check("update_network_settings blocks all", fetch(allowed, GOOD).startswith("blocked"))
check("...as the sandbox shows", daytona.get(allowed.id).network_block_all)

for s in (blocked, allowed):
    s.delete()
done("network")
