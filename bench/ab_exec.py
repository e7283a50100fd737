#!/usr/bin/env python3
"""A/B of two running daemons (loopback, one API key) on the exec path.

  bench/ab_exec.py URL_A URL_B pairs N [--gap S]   exec `true` in one live sandbox of each,
        alternating (A then B, then B then A, ...), each after S s of quiet (default 0); the
        verdict is the median of the paired differences B - A with a bootstrap 95 % interval
  bench/ab_exec.py URL_A URL_B blocks R [--blk K]  R rounds of K back-to-back execs on each
        (order alternates, 20 ms apart; the first two of each block dropped): a change that
        moves work to just after a command measures against the next command of its own
        daemon, not the other daemon's
  bench/ab_exec.py URL_A URL_B load R [--secs S] [--clients C]  R rounds of bench.py's load
        phase (C client threads doing create -> exec true -> destroy for S s) on each, order
        alternating

Run two `glovebox serve` with different binaries (or temporary switches) side by side; see
docs/benchmarks.md, "Exec round trip and throughput". Every request goes to 127.0.0.1.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def ci(diffs):
    """Median of `diffs` and its bootstrap 95 % interval."""
    meds = sorted(statistics.median(random.choices(diffs, k=len(diffs))) for _ in range(500))
    return statistics.median(diffs), meds[12], meds[487]


def timed_exec(api, sid):
    t0 = time.perf_counter_ns()
    api.exec_true(sid)
    return (time.perf_counter_ns() - t0) / 1e6


def pairs(apis, sids, n, gap):
    res, peer = ([], []), []
    for i in range(n):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            time.sleep(gap)
            res[k].append(timed_exec(apis[k], sids[k]))
        t0 = time.perf_counter_ns()
        subprocess.run(["true"], check=True)
        peer.append((time.perf_counter_ns() - t0) / 1e6)
    for k in (0, 1):
        print(f"{'AB'[k]} exec true p50 {statistics.median(res[k]):.3f} ms (n={n}, {gap * 1000:.0f} ms quiet before each)")
    print(f"  host fork/exec of true (Python) p50 {statistics.median(peer):.3f} ms")
    med, lo, hi = ci([b - a for a, b in zip(*res)])
    print(f"  paired B - A: median {med:+.3f} ms (95 % {lo:+.3f} .. {hi:+.3f})")


def blocks(apis, sids, rounds, blk):
    res, per_round = ([], []), ([], [])
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            time.sleep(0.02)
            mine = [timed_exec(apis[k], sids[k]) for _ in range(blk)][2:]
            res[k].extend(mine)
            per_round[k].append(statistics.median(mine))
    for k in (0, 1):
        print(f"{'AB'[k]} exec true back to back p50 {statistics.median(res[k]):.3f} ms (n={len(res[k])})")
    med, lo, hi = ci([b - a for a, b in zip(*per_round)])
    print(f"  per-round p50, B - A: median {med:+.3f} ms (95 % {lo:+.3f} .. {hi:+.3f}), {rounds} rounds")


def load(apis, rounds, secs, clients):
    rates = ([], [])
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            x = bench.load_phase(apis[k], clients, secs)
            if x["errors"]:
                raise bench.BenchError(f"load on {'AB'[k]}: {x['first_errors']}")
            rates[k].append(x["rate_per_s"])
    for k in (0, 1):
        print(f"{'AB'[k]} {clients} clients: cycles/s " + " ".join(f"{v:.1f}" for v in rates[k]))
    print("  B / A per round pair: " + " ".join(f"{b / a:.3f}" for a, b in zip(*rates)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url_a")
    ap.add_argument("url_b")
    ap.add_argument("mode", choices=["pairs", "blocks", "load"])
    ap.add_argument("count", type=int, help="pairs, or rounds")
    ap.add_argument("--gap", type=float, default=0.0)
    ap.add_argument("--blk", type=int, default=40)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    a = ap.parse_args()
    apis = [bench.Api(u, a.key) for u in (a.url_a, a.url_b)]
    print(f"load average before: {os.getloadavg()}")
    if a.mode == "load":
        load(apis, a.count, a.secs, a.clients)
    else:
        sids = [api.create() for api in apis]
        try:
            for api, sid in zip(apis, sids):
                for _ in range(20):
                    api.exec_true(sid)
            if a.mode == "pairs":
                pairs(apis, sids, a.count, a.gap)
            else:
                blocks(apis, sids, a.count, a.blk)
        finally:
            for api, sid in zip(apis, sids):
                api.destroy(sid)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
