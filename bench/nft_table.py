"""The daemon's base table as `nft` commands (what `net::nft::create_table` makes), for
bench/nft_rtt.py and bench/nft_commit_cost.py. Uses python3-nftables (libnftables in process, so a
commit's time is not a process start's), installed from Debian here when missing."""
import subprocess
import sys

try:
    import nftables
except ImportError:
    print("bench: installing python3-nftables (Debian) for the nft tools", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-qq", "python3-nftables"], check=True,
                   stdout=subprocess.DEVNULL)
    import nftables

nft = nftables.Nftables()


def run(cmd):
    """Runs `nft` commands (one transaction); exits with nft's error if they fail."""
    rc, _, err = nft.cmd(cmd)
    if rc != 0:
        raise SystemExit(f"nft: {err}\n{cmd[:400]}")


def base(t, ret=False):
    """Table `t` with the daemon's sets, maps and base chains; `ret`: with the early return
    first in `forward` and `input` (a packet with no own link in it)."""
    r = f"""
add table inet {t}
add set inet {t} ifaces {{ type ifname; }}
add map inet {t} out {{ type ifname : verdict; }}
add map inet {t} in {{ type ifname : verdict; }}
add map inet {t} nat {{ type ifname : verdict; }}
add chain inet {t} prerouting {{ type nat hook prerouting priority -100; }}
add chain inet {t} forward {{ type filter hook forward priority 0; }}
add chain inet {t} input {{ type filter hook input priority 0; }}
add chain inet {t} postrouting {{ type nat hook postrouting priority 100; }}
add rule inet {t} prerouting iifname @ifaces iifname vmap @nat
"""
    if ret:
        r += f"add rule inet {t} forward iifname != @ifaces oifname != @ifaces return\n"
    r += f"""add rule inet {t} forward iifname @ifaces iifname vmap @out
add rule inet {t} forward iifname @ifaces drop
add rule inet {t} forward oifname @ifaces ct state established,related accept
add rule inet {t} forward oifname @ifaces drop
"""
    if ret:
        r += f"add rule inet {t} input iifname != @ifaces return\n"
    return r + f"""add rule inet {t} input iifname @ifaces ct state established,related accept
add rule inet {t} input iifname @ifaces iifname vmap @in
add rule inet {t} input iifname @ifaces drop
add rule inet {t} postrouting iifname @ifaces oifname != @ifaces masquerade
"""
