#!/usr/bin/python3
"""bench/nft_commit_cost.py [K,K,...] [REPS] [x]: kernel cost of one sandbox's allow-list commit as a function of the links already in its
nf_tables table: a table shaped like the daemon's (bench: python3-nftables, one process),
K sandboxes' chains, then R timed commits that add one more sandbox's chains + map entries
(as `nft::apply` does) and R that remove them. Prints p50 per K. Table: glovebox_cc_test.

The wall times include libnftables re-reading the table before each command (growing with K):
for the kernel's share, pass a third argument, which prints "ready" before the timed commits
of each K and waits 1.5 s, and attach `perf record -g -p PID` then (docs/benchmarks.md, "Shards
made as needed"). Needs root (python3-nftables: see bench/nft_table.py)."""
import os, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nft_table import base, nft, run  # noqa: E402

T = "glovebox_cc_test"
BASE = base(T)

def sandbox(i, add=True):
    c, dev = f"sb{i}", f"gbcc{i}"
    host = f"10.213.{(i * 4) >> 8 & 255}.{(i * 4 + 1) & 255}"
    if not add:
        return "\n".join([f"delete element inet {T} {s} {{ \"{dev}\" }}" for s in ("ifaces", "out", "in", "nat")] +
                         [f"delete chain inet {T} {x}" for x in (c, c + "_in", c + "_nat")])
    return f"""
add chain inet {T} {c}
add chain inet {T} {c}_in
add chain inet {T} {c}_nat
add rule inet {T} {c} ip daddr 198.51.100.0/24 accept
add rule inet {T} {c} ip daddr {{ 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16, 127.0.0.0/8 }} reject
add rule inet {T} {c} meta l4proto tcp reject with tcp reset
add rule inet {T} {c} reject
add rule inet {T} {c}_in ip daddr {host} udp dport 53 accept
add rule inet {T} {c}_in ip daddr {host} tcp dport 3128 accept
add rule inet {T} {c}_nat ip daddr != {host} tcp dport {{ 80, 443 }} dnat ip to {host}:3128
add element inet {T} out {{ "{dev}" : jump {c} }}
add element inet {T} in {{ "{dev}" : jump {c}_in }}
add element inet {T} nat {{ "{dev}" : jump {c}_nat }}
add element inet {T} ifaces {{ "{dev}" }}
"""

def main():
    ks = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0, 32, 64, 128, 256, 512]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    nft.cmd(f"delete table inet {T}")
    run(BASE)
    have = 0
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")
    try:
        for k in ks:
            while have < k:
                run(sandbox(have)); have += 1
            if len(sys.argv) > 3:
                print("ready", flush=True); time.sleep(1.5)
            add, rm = [], []
            for r in range(reps):
                i = 100000 + r
                s_add, s_rm = sandbox(i), sandbox(i, False)
                t0 = time.perf_counter_ns(); run(s_add); add.append((time.perf_counter_ns() - t0) / 1e6)
                t0 = time.perf_counter_ns(); run(s_rm); rm.append((time.perf_counter_ns() - t0) / 1e6)
            print(f"K={k:4d} links in the table: add commit p50 {statistics.median(add):.3f} ms, "
                  f"remove p50 {statistics.median(rm):.3f} ms (n={reps})", flush=True)
    finally:
        nft.cmd(f"delete table inet {T}")
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")

main()
