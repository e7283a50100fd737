#!/usr/bin/env python3
"""Latency distributions (empirical CDFs, log time axis) from bench.py's JSON; needs matplotlib.

    plot.py bench/results/latest.json docs/bench-latency.png
"""

import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

LABELS = {
    "api.create_exec_destroy": "Glovebox API create+exec+destroy",
    "api.exec_roundtrip": "Glovebox API exec (live sandbox)",
    "cli.run_daemon": "glovebox run (daemon)",
    "cli.run_embedded": "glovebox run (embedded)",
    "peer.bwrap": "bwrap --unshare-all (ro /usr)",
    "peer.bwrap_host": "bwrap --unshare-all --bind / /",
    "peer.unshare": "unshare (6 namespaces)",
    "peer.runc": "runc run",
    "peer.runsc": "runsc run (gVisor)",
    "peer.true": "fork/exec true (baseline)",
}


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    for key, label in LABELS.items():
        s = sorted(r["samples_ms"].get(key, []))
        if not s:
            continue
        y = [(i + 1) / len(s) for i in range(len(s))]
        glovebox = key.startswith(("api.", "cli."))
        ax.step(s, y, where="post", lw=2.2 if glovebox else 1.4, ls="-" if glovebox else "--",
                label=f"{label} (p50 {r['benchmarks'][key]['p50']:.1f} ms)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of runs ≤ latency")
    ax.axhline(0.5, color="grey", lw=0.6)
    ax.axhline(0.99, color="grey", lw=0.6, ls=":")
    m = r["machine"]
    ax.set_title(f"Glovebox {r['glovebox_rev']}: running `true` — {m['nproc']} CPUs, "
                 f"kernel {m['kernel']}, n={r['settings']['n']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    fig.savefig(dst)
    print(f"plot: {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
