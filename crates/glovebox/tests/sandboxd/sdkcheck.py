"""What the k8s-agent-sandbox SDK scripts here (sdk.py, router_hop.py) share: one `ok:` line a
check, an expected HTTP error from the SDK, and a round trip's median."""

import statistics
import time

from k8s_agent_sandbox import SandboxRequestError

checks = 0


def ok(what):
    global checks
    checks += 1
    print(f"ok: {what}", flush=True)


def expect_status(status, fn):
    """Runs `fn`, which must fail with the SDK's error for HTTP `status`; returns the error."""
    try:
        fn()
    except SandboxRequestError as e:
        assert e.status_code == status, (e.status_code, e.response.text if e.response is not None else None)
        return e
    raise AssertionError(f"expected HTTP {status}")


def p50_ms(fn, n=20):
    """The median of `n` timed calls of `fn`, in milliseconds."""
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        fn()
        times.append(time.monotonic() - t0)
    return statistics.median(times) * 1000
