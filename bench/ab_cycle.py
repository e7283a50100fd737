#!/usr/bin/env python3
"""A/B of two running daemons (loopback, one API key) on the create -> exec true -> destroy cycle.

  bench/ab_cycle.py URL_A URL_B N [--gap S] [--key KEY]

N rounds; each round runs one cycle on each daemon (A then B, then B then A, ...), each after
S s of quiet (default 0.02). Prints each phase's p50/p95 per side and the median of the paired
differences B - A with a bootstrap 95 % interval. A gap of a second or more shows what a create
or destroy pays after a quiet spell (how an agent's calls arrive). See docs/benchmarks.md,
"The destroy's wait and the store's log restarts". Every request goes to 127.0.0.1.
"""
import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

PHASES = ("create", "exec", "destroy", "cycle")


def ci(diffs):
    """Median of `diffs` and its bootstrap 95 % interval."""
    meds = sorted(statistics.median(random.choices(diffs, k=len(diffs))) for _ in range(500))
    return statistics.median(diffs), meds[12], meds[487]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url_a")
    ap.add_argument("url_b")
    ap.add_argument("n", type=int)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    a = ap.parse_args()
    apis = [bench.Api(a.url_a, a.key), bench.Api(a.url_b, a.key)]
    res = [{p: [] for p in PHASES} for _ in apis]
    for i in range(a.n):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            time.sleep(a.gap)
            api = apis[k]
            t0 = time.perf_counter()
            sid = api.create()
            t1 = time.perf_counter()
            api.exec_true(sid)
            t2 = time.perf_counter()
            api.destroy(sid)
            t3 = time.perf_counter()
            for p, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                res[k][p].append(v * 1000)
    print(f"n = {a.n} per side, {a.gap * 1000:.0f} ms quiet before each cycle")
    for p in PHASES:
        xa, xb = res[0][p], res[1][p]
        med, lo, hi = ci([b - x for x, b in zip(xa, xb)])
        p95 = lambda v: sorted(v)[int(len(v) * 0.95)]  # noqa: E731
        print(f"{p:8s} A p50 {statistics.median(xa):6.2f} p95 {p95(xa):6.2f} | "
              f"B p50 {statistics.median(xb):6.2f} p95 {p95(xb):6.2f} | B - A {med:+.3f} ms ({lo:+.3f} .. {hi:+.3f})")


if __name__ == "__main__":
    main()
