#!/usr/bin/env python3
"""Latency distributions (empirical CDFs, log time axis) from bench.py's JSON; needs matplotlib.

    plot.py bench/results/latest.json docs/bench-latency.png

Top: create + exec `true` + destroy with both warm-pool settings, against the peers running
`true`. Bottom: single operations (create, exec, run_code, network-policy creates) and the
code-interpreter plot against the same cell on the host.
"""

import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PANELS = [
    ("running `true`: a whole sandbox against the peers", {
        "api.create_exec_destroy": "Glovebox create+exec+destroy, warm pool 0",
        "pool.create_exec_destroy": "Glovebox create+exec+destroy, warm pool 2",
        "cli.run_daemon": "glovebox run (daemon)",
        "cli.run_embedded": "glovebox run (embedded)",
        "peer.bwrap": "bwrap --unshare-all (ro /usr)",
        "peer.bwrap_host": "bwrap --unshare-all --bind / /",
        "peer.unshare": "unshare (6 namespaces)",
        "peer.runc": "runc run",
        "peer.runsc": "runsc run (gVisor)",
        "peer.true": "fork/exec true (baseline)",
    }),
    ("single operations and the code interpreter", {
        "api.create": "create, warm pool 0",
        "pool.create": "create, warm pool 2",
        "api.get_roundtrip": "GET /v1/sandboxes/{id} (HTTP floor)",
        "api.exec_roundtrip": "exec true (live sandbox)",
        "api.exec_after_idle": "exec true after 50 ms idle",
        "api.run_code": "run_code 1+1 (warm context)",
        "net.create_deny_all": "create, deny-all (pool 0)",
        "net.create_allow_list": "create, allow-list CIDR (pool 0)",
        "code.plot_first_result": "code-interpreter create -> first plot",
        "code.plot_cell_again": "the plot cell again (quiet)",
        "peer.host_plot_first": "host python: the plot cell, first run",
        "peer.host_plot_warm": "host python: the plot cell, second run",
    }),
]


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    fig, axes = plt.subplots(2, 1, figsize=(11, 9), dpi=110)
    for ax, (title, labels) in zip(axes, PANELS):
        for key, label in labels.items():
            s = sorted(r["samples_ms"].get(key, []))
            if not s:
                continue
            y = [(i + 1) / len(s) for i in range(len(s))]
            glovebox = not key.startswith("peer.")
            ax.step(s, y, where="post", lw=2.2 if glovebox else 1.4, ls="-" if glovebox else "--",
                    label=f"{label} (n={len(s)}, p50 {r['benchmarks'][key]['p50']:.1f} ms)")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("fraction of runs ≤ latency")
        ax.axhline(0.5, color="grey", lw=0.6)
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        if ax.lines:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    m = r["machine"]
    fig.suptitle(f"Glovebox {r['glovebox_rev']} — {m['nproc']} CPUs, kernel {m['kernel']}, "
                 f"n={r['settings']['n']} per latency row unless noted", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    fig.savefig(dst)
    print(f"plot: {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
