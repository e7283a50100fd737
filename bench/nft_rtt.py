#!/usr/bin/python3
"""bench/nft_rtt.py [ROUNDS]: host loopback TCP round trip (C ping-pong, 20,000 round trips, p50) with n copies of the
daemon's base table (as nft::create_table makes it; `ret`: with the early return first in
forward and input), interleaved rounds. Tables glovebox_rt_test_*. Needs root and cc (python3-nftables: see bench/nft_table.py)."""
import os, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nft_table import base as base_table, nft, run  # noqa: E402


def base(t, ret):
    return base_table(t, ret) + f'add element inet {t} ifaces {{ "gbrt0" }}\n'


def clear():
    for i in range(64):
        nft.cmd(f"delete table inet glovebox_rt_test_{i}")
TMP = tempfile.mkdtemp(prefix="nft-rtt-")
PP = os.path.join(TMP, "pingpong")
subprocess.run(["cc", "-O2", "-o", PP, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pingpong.c")], check=True)
def pp():
    out = subprocess.run([PP, "20000"], capture_output=True, text=True, check=True).stdout
    return float(out.split()[1])
configs = [(0, False), (1, False), (1, True), (4, True), (16, True)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
res = {c: [] for c in configs}
print("load average", open("/proc/loadavg").read().split()[:3])
try:
    for r in range(rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            clear()
            for i in range(c[0]):
                run(base(f"glovebox_rt_test_{i}", c[1]))
            res[c].append(pp())
finally:
    clear()
    os.unlink(PP)
    os.rmdir(TMP)
print("load average", open("/proc/loadavg").read().split()[:3])
for c in configs:
    print(f"{c[0]:2d} tables{' (early return)' if c[1] else ''}: p50 per round " + " ".join(f"{v:.2f}" for v in res[c]) + f" us; median {statistics.median(res[c]):.2f}")
