"""Network options through the official `e2b` SDK, against the test's own "internet" (a
network namespace holding TEST-NET-2 addresses; tests/inet builds it): no internet
blocks egress (the canary listener sees nothing), allow lists map to Glovebox policies, and
updates apply live."""

import json
import os

import httpx
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC

from checks import check, done, env

url, key = env("E2B_API_URL"), env("E2B_API_KEY")
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
    return sb.commands.run(f"python3 -c \"$P\" http://{addr}:8080/", envs={"P": PROBE}, timeout=20).stdout.strip()


def native(sb):
    """The sandbox's policy as Glovebox's own API shows it."""
    r = httpx.get(f"{url}/v1/sandboxes/{sb.sandbox_id}", headers={"Authorization": f"Bearer {key}"})
    return r.json()["network"]


# The fixture answers when the policy allows it (so a block below is the policy's doing).
open_sb = Sandbox.create(timeout=120, allow_internet_access=True)
before = len(seen())
check("allow_internet_access=True reaches the test internet", fetch(open_sb, GOOD) == "200")
check("the canary saw that connection", len(seen()) > before)
check("...which is Glovebox's allow-all", native(open_sb)["mode"] == "allow-all", native(open_sb))

closed = Sandbox.create(timeout=120, allow_internet_access=False)
before = len(seen())
check("allow_internet_access=False blocks egress", fetch(closed, GOOD).startswith("blocked"))
other_before = len(seen(other_log))
check("...by IP too, to another address", fetch(closed, OTHER).startswith("blocked"))
check("the canary saw nothing", len(seen()) == before, seen()[before:])
check("the other canary saw nothing", len(seen(other_log)) == other_before)
check("...which is Glovebox's deny-all", native(closed)["mode"] == "deny-all", native(closed))

allow = Sandbox.create(timeout=120, network={"allow_out": [GOOD], "deny_out": [ALL_TRAFFIC]})
other_before = len(seen(other_log))
check("an allow list lets its address through", fetch(allow, GOOD) == "200")
check("...and nothing else", fetch(allow, OTHER).startswith("blocked"))
check("the other address saw nothing", len(seen(other_log)) == other_before, seen(other_log))
pol = native(allow)
check("the allow list is Glovebox's allow-list policy", pol["mode"] == "allow-list" and pol["allow"] == [GOOD], pol)

# Live update: close the open sandbox, then open the closed one to one address.
open_sb.update_network({"allow_internet_access": False})
check("update_network closes a sandbox", fetch(open_sb, GOOD).startswith("blocked"))
check("...as deny-all", native(open_sb)["mode"] == "deny-all", native(open_sb))
closed.update_network({"allow_out": [GOOD], "deny_out": [ALL_TRAFFIC]})
check("update_network opens an allow list", fetch(closed, GOOD) == "200")
check("...to that address only", fetch(closed, OTHER).startswith("blocked"))

for s in (open_sb, closed, allow):
    s.kill()
done("network")
