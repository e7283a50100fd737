#!/usr/bin/env python3
"""How much of a code-interpreter kernel's memory could be shared between sandboxes.

Issue 27 asks for <= 25 MiB per code-interpreter sandbox after its first pandas cell (69-105 MiB
measured in its memory cgroup) and names two ways to share the imported libraries' pages:
a per-template kernel zygote forked into each sandbox, or KSM. This measures both on the host,
outside any sandbox, with the code-interpreter template's own packages (its layer's
dist-packages on PYTHONPATH), so the design can be chosen on numbers:

  fork  one process imports what the kernel preloads (IPython's shell, numpy, pandas,
        matplotlib, one throwaway figure), then forks N children; each runs the seed cell and
        reports; each child's Private_Dirty / Pss / Anonymous from /proc/PID/smaps_rollup is
        what it would cost a sandbox, the zygote's Pss what the template pays once.
  ksm   N independent processes do the same (the kernel as it is today), each opted in to KSM
        with prctl(PR_SET_MEMORY_MERGE); KSM is switched on for --ksm-s seconds with a high
        scan rate, then every merged page is unmerged and KSM put back as it was. Reports the
        pages merged, each process's memory before and after, and ksmd's CPU time.

Host-wide side effect: --ksm changes /sys/kernel/mm/ksm (restored at the end, also on errors);
only the processes this script opts in are merged. Needs root for --ksm. No network.

    bench/kernel_memory.py --templates target/test-templates [--n 4] [--ksm] [--ksm-s 20]
"""

import argparse
import glob
import io
import json
import os
import statistics
import subprocess
import sys
import time

SEED = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt, io\n"
    "s = pd.Series(np.random.rand(100))\n"
    "stats = (s.mean(), s.median(), s.std())\n"
    "plt.hist(s)\n"
    "buf = io.BytesIO(); plt.savefig(buf, format='png', bbox_inches='tight'); plt.close('all')\n"
)
PR_SET_MEMORY_MERGE = 67
KSM = "/sys/kernel/mm/ksm"


def rollup(pid="self"):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return out


def warm_shell():
    """What the python kernel has before its first cell: IPython's shell and the preloads."""
    from IPython.core.interactiveshell import InteractiveShell
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    shell = InteractiveShell.instance()
    fig = plt.figure()
    plt.plot([1, 2])
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)
    return shell


def run_seed(shell):
    r = shell.run_cell(SEED, silent=True)
    if not r.success:
        raise SystemExit(f"the seed cell failed: {r.error_in_exec or r.error_before_exec}")


def child_fork(n):
    """The zygote: one warm process, N forked children that each run the seed cell."""
    import gc

    shell = warm_shell()
    gc.collect()
    gc.freeze()  # the collector's own writes would unshare every tracked object's page
    kids = []
    for _ in range(n):
        done_r, done_w = os.pipe()
        go_r, go_w = os.pipe()
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            run_seed(shell)
            os.write(done_w, b"x")
            os.read(go_r, 1)
            os._exit(0)
        os.read(done_r, 1)
        kids.append((pid, go_w, (time.perf_counter() - t) * 1000))
    time.sleep(0.3)
    rows = [dict(rollup(pid), cell_ms=ms) for pid, _, ms in kids]
    zygote = rollup()
    for pid, go, _ in kids:
        os.write(go, b"x")
        os.waitpid(pid, 0)
    print(json.dumps({"children": rows, "zygote": zygote}))


def child_one(ksm):
    import ctypes

    if ksm and ctypes.CDLL(None).prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_MEMORY_MERGE) failed (kernel older than 6.4?)")
    run_seed(warm_shell())
    print("ready", flush=True)
    sys.stdin.read()


def ksmd_ticks():
    out = subprocess.run(["pgrep", "-x", "ksmd"], capture_output=True, text=True).stdout.split()
    if not out:
        return 0
    with open(f"/proc/{out[0]}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def ksm_read(name):
    with open(f"{KSM}/{name}") as f:
        return int(f.read())


def ksm_write(name, value):
    with open(f"{KSM}/{name}", "w") as f:
        f.write(str(value))


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def run_ksm(env, n, seconds):
    procs = [
        subprocess.Popen([sys.executable, __file__, "--child-one", "--ksm"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    saved = {k: ksm_read(k) for k in ("run", "pages_to_scan", "sleep_millisecs")}
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a kernel process did not get ready")
        before = [rollup(p.pid) for p in procs]
        t0 = ksmd_ticks()
        ksm_write("pages_to_scan", 5000)
        ksm_write("sleep_millisecs", 20)
        ksm_write("run", 1)
        time.sleep(seconds)
        ticks = ksmd_ticks() - t0
        merged = {k: ksm_read(k) for k in ("pages_shared", "pages_sharing", "full_scans")}
        after = [rollup(p.pid) for p in procs]
    finally:
        ksm_write("run", 2)  # unmerge what was merged
        ksm_write("run", saved["run"])
        ksm_write("pages_to_scan", saved["pages_to_scan"])
        ksm_write("sleep_millisecs", saved["sleep_millisecs"])
        for p in procs:
            p.kill()
            p.wait()
    hz = os.sysconf("SC_CLK_TCK")
    print(f"ksm, {n} processes, {seconds} s at 5000 pages / 20 ms:")
    print(f"  per process before: Private_Dirty {med(before, 'Private_Dirty'):.1f} MiB, Pss {med(before, 'Pss'):.1f}")
    print(f"  per process after:  Private_Dirty {med(after, 'Private_Dirty'):.1f} MiB, Pss {med(after, 'Pss'):.1f}")
    print(f"  pages_shared {merged['pages_shared']}, pages_sharing {merged['pages_sharing']} "
          f"({merged['pages_sharing'] * 4 / 1024 / n:.1f} MiB saved per process), full scans {merged['full_scans']}")
    print(f"  ksmd CPU {ticks / hz:.2f} s in {seconds} s ({ticks / hz / seconds * 100:.0f} % of a core)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--templates", default="target/test-templates")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--ksm", action="store_true", help="also measure KSM (root; restores its settings)")
    ap.add_argument("--ksm-s", type=int, default=20)
    ap.add_argument("--child-fork", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_fork:
        return child_fork(a.n)
    if a.child_one:
        return child_one(a.ksm)
    found = glob.glob(os.path.join(os.path.abspath(a.templates), "layers", "*", "fs", "usr", "local", "lib",
                                   "python3*", "dist-packages", "IPython"))
    if not found:
        raise SystemExit(f"no code-interpreter layer under {a.templates} (scripts/build-code-interpreter DIR)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.path.dirname(found[0]), "OPENBLAS_NUM_THREADS": "1",
           "MPLBACKEND": "Agg", "HOME": "/tmp"}
    out = subprocess.run([sys.executable, __file__, "--child-fork", "--n", str(a.n)], env=env,
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    kids = r["children"]
    print(f"fork from a warm zygote, {a.n} children, after the seed cell (medians):")
    print(f"  child Private_Dirty {med(kids, 'Private_Dirty'):.1f} MiB, Anonymous {med(kids, 'Anonymous'):.1f}, "
          f"Pss {med(kids, 'Pss'):.1f}, Rss {med(kids, 'Rss'):.1f}; fork + seed cell {med(kids, 'cell_ms'):.0f} ms")
    print(f"  zygote Pss {r['zygote']['Pss']:.1f} MiB, Anonymous {r['zygote']['Anonymous']:.1f}")
    if a.ksm:
        run_ksm(env, a.n, a.ksm_s)


if __name__ == "__main__":
    main()
