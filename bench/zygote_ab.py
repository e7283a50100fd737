#!/usr/bin/env python3
"""Issue 27's two code-interpreter rows through the daemon, with and without `code_zygote`:
two pool-0 daemons of the same build side by side (--url without, --zygote-url with), the
same step on each (bench/wave2.py's ColdCode: create a code-interpreter sandbox, run the seed
cell and check its PNG, read the sandbox's memory cgroup, destroy it), interleaved with the
order alternating, and the host's cold python3 running the same cell as the peer.

The first --warmup steps on each daemon are not kept (the zygote daemon's first create starts
its zygote and gets the agent's kernel meanwhile).

    bench/zygote_ab.py --url http://127.0.0.1:A --zygote-url http://127.0.0.1:B --key KEY \
        --templates target/test-templates [--n 8] [--warmup 2]
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import wave2  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--zygote-url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--templates", required=True)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    sides = {}
    for name, url in (("today", args.url), ("zygote", args.zygote_url)):
        sides[name] = wave2.ColdCode(bench.Api(url, args.key, timeout=120), bench.SEED, bench.check_seed,
                                     bench.cgroup_memory_kb, warmup=args.warmup)
    host = bench.HostPlot(bench.code_interpreter_site(args.templates))
    rows = {"today": [], "zygote": [], "host": []}
    try:
        for _ in range(args.warmup):
            for s in sides.values():
                s.step(0)
            time.sleep(1.5)  # the zygote's imports, once
        for i in range(args.n):
            order = ["today", "zygote", "host"]
            if i % 2:
                order.reverse()
            for what in order:
                if what == "host":
                    r = {"code.cold_first_result": host.cold_step(i)["peer.host_plot_cold"]}
                else:
                    r = sides[what].step(i)
                rows[what].append(r)
                print(f"{i} {what}: {r}", file=sys.stderr)
    finally:
        host.teardown()
    p50 = lambda k, key: statistics.median(r[key] for r in rows[k])  # noqa: E731
    out = {
        "n": args.n,
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "first_result_ms_p50": {k: p50(k, "code.cold_first_result") for k in rows},
        "first_result_ms": {k: [round(r["code.cold_first_result"]) for r in v] for k, v in rows.items()},
        "memory_mib_p50": {k: statistics.median(s.mem_kib) / 1024 for k, s in sides.items()},
        "memory_mib": {k: [round(m / 1024, 1) for m in s.mem_kib] for k, s in sides.items()},
    }
    out["ratio_to_host"] = {k: out["first_result_ms_p50"][k] / out["first_result_ms_p50"]["host"]
                            for k in ("today", "zygote")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
