#!/usr/bin/env python3
"""A/B of two running daemons (loopback, one API key) on creates that come back to back.

  bench/ab_net.py URL_A URL_B ROUNDS [--block K] [--gap S] [--key KEY]

Each round runs a block of K back-to-back steps on each daemon (A then B, then B then A, ...),
S s of quiet before each block (default 0.1). A step is what bench.py's network group does:
create (deny-all, then an allow-list on the next step, alternating) and destroy at once.
Prints each side's p50 per kind and the median of the paired per-round differences B - A
(each round's median on one side against the same round's on the other) with a bootstrap
95 % interval. Every request goes to 127.0.0.1; the allow-list names 198.51.100.0/24
(TEST-NET-2), which nothing here sends to.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from ab_cycle import ci  # noqa: E402  (median of paired differences, bootstrap 95 %)

KINDS = {
    "deny_all": {"mode": "deny-all"},
    "allow_list": {"mode": "allow-list", "allow": ["198.51.100.0/24"]},
}


def block(api, k):
    """K back-to-back steps; the create and destroy times of each kind, in ms."""
    out = {f"{p}_{n}": [] for n in KINDS for p in ("create", "destroy")}
    names = list(KINDS)
    for i in range(k):
        name = names[i % len(names)]
        t0 = time.perf_counter()
        sid = api.create({"network": KINDS[name]})
        t1 = time.perf_counter()
        api.destroy(sid)
        t2 = time.perf_counter()
        out[f"create_{name}"].append((t1 - t0) * 1000)
        out[f"destroy_{name}"].append((t2 - t1) * 1000)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url_a")
    ap.add_argument("url_b")
    ap.add_argument("rounds", type=int)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.1)
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    a = ap.parse_args()
    apis = [bench.Api(a.url_a, a.key), bench.Api(a.url_b, a.key)]
    rows = [f"{p}_{n}" for n in KINDS for p in ("create", "destroy")]
    every = [{r: [] for r in rows} for _ in apis]
    per_round = [{r: [] for r in rows} for _ in apis]
    for i in range(a.rounds):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            time.sleep(a.gap)
            got = block(apis[k], a.block)
            for r in rows:
                every[k][r] += got[r]
                per_round[k][r].append(statistics.median(got[r]))
    print(f"{a.rounds} rounds of {a.block} back-to-back steps per side, {a.gap * 1000:.0f} ms quiet before each")
    for r in rows:
        xa, xb = every[0][r], every[1][r]
        med, lo, hi = ci([b - x for x, b in zip(per_round[0][r], per_round[1][r])])
        print(f"{r:20s} A p50 {statistics.median(xa):6.2f} | B p50 {statistics.median(xb):6.2f} | "
              f"B - A {med:+.3f} ms ({lo:+.3f} .. {hi:+.3f})")


if __name__ == "__main__":
    main()
