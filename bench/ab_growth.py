#!/usr/bin/env python3
"""A/B of two running daemons (loopback, one API key) on create cost as sandboxes pile up.

  bench/ab_growth.py URL_A URL_B [--live N] [--rounds R]

Both daemons grow together, create by create, taking turns (A then B, then B then A, ...), to
N live sandboxes each (every other with bench/wave2.py's allow-list, 64 MiB, as the growth
curve makes them); each create is timed with the number its daemon had live before it. Printed
per round and daemon: create p50 of the first 50 and of those made at 400-449 live (the issue
27 row), and per 100 live. Every sandbox is destroyed after each round. The host holds both
daemons' sandboxes, so host-wide walks see twice N. Every request goes to 127.0.0.1.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import wave2  # noqa: E402


def body(i):
    return {"resources": {"memory_mb": 64}, "timeout_s": 3600, "metadata": {"bench": "ab_growth"},
            "network": wave2.ALLOW if i % 2 else {"mode": "deny-all"}}


def p50(xs):
    return statistics.median(xs) if xs else float("nan")


def one_round(apis, live, r):
    ids = ([], [])
    times = ([], [])
    try:
        for i in range(live):
            for k in ((0, 1) if (i + r) % 2 == 0 else (1, 0)):
                t0 = time.perf_counter_ns()
                ids[k].append(apis[k].create(body(i)))
                times[k].append((i, (time.perf_counter_ns() - t0) / 1e6))
    finally:
        load = os.getloadavg()
        for k in (0, 1):
            for sid in ids[k]:
                apis[k].destroy(sid)
    out = []
    for k in (0, 1):
        first = [ms for n, ms in times[k] if n < 50]
        at = [ms for n, ms in times[k] if 400 <= n < 450]
        per100 = [p50([ms for n, ms in times[k] if lo <= n < lo + 100]) for lo in range(0, live, 100)]
        out.append((first, at, per100))
        print(f"round {r} {'AB'[k]}: first 50 p50 {p50(first):.2f} ms, 400-449 p50 {p50(at):.2f} ms "
              f"({p50(at) / p50(first):.2f}x); per 100 live: " + " ".join(f"{v:.2f}" for v in per100))
    print(f"  load average at the top: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url_a")
    ap.add_argument("url_b")
    ap.add_argument("--live", type=int, default=450)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    a = ap.parse_args()
    apis = [bench.Api(u, a.key) for u in (a.url_a, a.url_b)]
    print(f"load average before: {os.getloadavg()}")
    res = [one_round(apis, a.live, r) for r in range(a.rounds)]
    for k in (0, 1):
        first = [ms for rr in res for ms in rr[k][0]]
        at = [ms for rr in res for ms in rr[k][1]]
        print(f"{'AB'[k]} all rounds: first 50 p50 {p50(first):.2f} ms (n={len(first)}), "
              f"400-449 p50 {p50(at):.2f} ms (n={len(at)}), {p50(at) / p50(first):.2f}x")


if __name__ == "__main__":
    main()
