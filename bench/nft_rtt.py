#!/usr/bin/python3
"""bench/nft_rtt.py [ROUNDS]: host loopback TCP round trip (C ping-pong, 20,000 round trips, p50) with n copies of the
daemon's base table (as nft::create_table makes it; `ret`: with the early return first in
forward and input), interleaved rounds. Tables glovebox_rt_test_*. Needs root, cc and python3-nftables."""
import os, subprocess, sys, tempfile, nftables, statistics
nft = nftables.Nftables()
def run(c):
    rc, o, e = nft.cmd(c)
    if rc: raise SystemExit(e)
def base(T, ret):
    r = f"""
add table inet {T}
add set inet {T} ifaces {{ type ifname; }}
add map inet {T} out {{ type ifname : verdict; }}
add map inet {T} in {{ type ifname : verdict; }}
add map inet {T} nat {{ type ifname : verdict; }}
add chain inet {T} prerouting {{ type nat hook prerouting priority -100; }}
add chain inet {T} forward {{ type filter hook forward priority 0; }}
add chain inet {T} input {{ type filter hook input priority 0; }}
add chain inet {T} postrouting {{ type nat hook postrouting priority 100; }}
add rule inet {T} prerouting iifname @ifaces iifname vmap @nat
"""
    if ret:
        r += f"add rule inet {T} forward iifname != @ifaces oifname != @ifaces return\n"
    r += f"""add rule inet {T} forward iifname @ifaces iifname vmap @out
add rule inet {T} forward iifname @ifaces drop
add rule inet {T} forward oifname @ifaces ct state established,related accept
add rule inet {T} forward oifname @ifaces drop
"""
    if ret:
        r += f"add rule inet {T} input iifname != @ifaces return\n"
    r += f"""add rule inet {T} input iifname @ifaces ct state established,related accept
add rule inet {T} input iifname @ifaces iifname vmap @in
add rule inet {T} input iifname @ifaces drop
add rule inet {T} postrouting iifname @ifaces oifname != @ifaces masquerade
add element inet {T} ifaces {{ "gbrt0" }}
"""
    return r
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
