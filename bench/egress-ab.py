#!/usr/bin/env python3
"""Two glovebox builds' egress proxies side by side, downloads interleaved (an A/B of a change).

Uses bench/egress.py's test namespace and HTTPS server; starts a daemon of each build (same
upstream, same CA), makes a pass-through and a brokered sandbox in each (and a direct one in
the first), then downloads --mib MiB with curl in each configuration, A and B alternating
which goes first, round after round. Prints the medians, every sample, the B/A ratio of each
round's pair, and each daemon's CPU per MiB. Every packet stays on this machine. Needs root.

    python3 bench/egress-ab.py --a OLD/glovebox --b NEW/glovebox [--mib 100 --rounds 8]
"""

import argparse
import fcntl
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("egress", os.path.join(HERE, "egress.py"))
eg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(eg)


def start_daemon(w, binary, tag, extra_env):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, GLOVEBOX_DNS_UPSTREAM=eg.ADDR + ":53", GLOVEBOX_UPSTREAM_CA=w.ca,
               RUST_LOG=os.environ.get("RUST_LOG", "warn"), **extra_env)
    log = open(os.path.join(w.tmp, f"daemon-{tag}.log"), "w")
    p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir",
                          os.path.join(w.tmp, f"data-{tag}"), "--api-key", w.key, "--warm-pool", "0"],
                         env=env, stdout=log, stderr=log)
    api = eg.Api(f"http://127.0.0.1:{port}", w.key)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(api.url + "/healthz", timeout=1)
            return p, api
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"egress-ab: daemon {tag} did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the first build's glovebox binary (the baseline)")
    ap.add_argument("--b", required=True, help="the second build's glovebox binary")
    ap.add_argument("--a-env", action="append", default=[], help="NAME=VALUE for daemon A (repeatable)")
    ap.add_argument("--b-env", action="append", default=[], help="NAME=VALUE for daemon B (repeatable)")
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--configs", default="direct,pass,brokered")
    ap.add_argument("--out", help="write the samples as JSON here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("egress-ab: needs root")
    # The test internet's addresses are host-wide: take turns with the tests that use them.
    turn = open("/run/glovebox-test-inet.lock", "a")
    fcntl.flock(turn, fcntl.LOCK_EX)
    w = eg.World(a.a)
    a_proc = b_proc = None
    try:
        w.start()  # the namespace, the server and a daemon, replaced by the two below
        w.daemon.send_signal(signal.SIGTERM)
        w.daemon.wait(20)
        w.daemon = None
        env = lambda kv: dict(x.split("=", 1) for x in kv)  # noqa: E731
        a_proc, a_api = start_daemon(w, a.a, "a", env(a.a_env))
        b_proc, b_api = start_daemon(w, a.b, "b", env(a.b_env))
        daemons = {"A": (a_proc, a_api), "B": (b_proc, b_api)}
        res = run(w, daemons, a)
    finally:
        for p in (a_proc, b_proc):
            if p:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        w.close()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


def run(w, daemons, a):
    configs = a.configs.split(",")
    broker = {"domain": "api.good.test:8443", "inject_headers": {"Authorization": "Bearer ${secret:bench_token}"}}
    pols = {
        "direct": {"mode": "allow-list", "allow": [eg.ADDR + ":8443"]},
        "pass": {"mode": "allow-list", "allow": ["api.good.test:8443"]},
        "brokered": {"mode": "allow-list", "allow": [broker]},
    }
    with open(w.ca, "rb") as f:
        ca = f.read()
    sbs = {}
    for d, (_, api) in daemons.items():
        api.ok("PUT", "/v1/secrets/bench_token", {"value": "bench-token"})
        for c in configs:
            if c == "direct" and d == "B":
                continue  # one baseline is enough
            sid = api.ok("POST", "/v1/sandboxes", {"timeout_s": 3600, "network": pols[c],
                                                   "resources": {"memory_mb": 1024}})["id"]
            if c != "brokered":
                api.ok("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/ca.pem", raw=ca)
            sbs[(d, c)] = sid
    url = f"https://api.good.test:8443/bytes/{a.mib << 20}"
    samples = {k: [] for k in sbs}
    cpu = {k: 0.0 for k in sbs}
    keys = list(sbs)
    for r in range(a.rounds):
        order = keys if r % 2 == 0 else list(reversed(keys))
        for k in order:
            d, c = k
            proc, api = daemons[d]
            curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", "--max-time", "120"]
            if c == "direct":
                curl += ["--resolve", f"api.good.test:8443:{eg.ADDR}"]
            if c != "brokered":
                curl += ["--cacert", "/tmp/ca.pem"]
            c0 = eg.cpu_s(proc.pid)
            size, total = api.exec(sbs[k], curl + [url]).split()
            cpu[k] += eg.cpu_s(proc.pid) - c0
            if int(size) != a.mib << 20:
                raise SystemExit(f"egress-ab: {k}: downloaded {size} bytes")
            samples[k].append(int(size) / float(total) / (1 << 20))
        print(f"  round {r + 1}/{a.rounds} (load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{d}.{c} {samples[(d, c)][-1]:.0f}" for d, c in keys), file=sys.stderr, flush=True)
    for (d, _), sid in sbs.items():
        daemons[d][1].call("DELETE", f"/v1/sandboxes/{sid}")
    print(f"\nMiB/s, {a.rounds} rounds of {a.mib} MiB (load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    base = statistics.median(samples[("A", "direct")]) if ("A", "direct") in samples else None
    for k in keys:
        med = statistics.median(samples[k])
        ratio = f"  {med / base:.2f} of direct" if base else ""
        print(f"{k[0]}.{k[1]:<9} median {med:6.0f}{ratio}  cpu/MiB {cpu[k] * 1000 / (a.mib * a.rounds):.2f} ms  "
              f"all {' '.join(f'{x:.0f}' for x in samples[k])}")
    for c in configs:
        if c == "direct":
            continue
        pairs = [b / x for x, b in zip(samples[("A", c)], samples[("B", c)])]
        print(f"B/A {c:<9} median of pairs {statistics.median(pairs):.3f}  "
              f"({' '.join(f'{p:.2f}' for p in pairs)})")
    return {f"{d}.{c}": v for (d, c), v in samples.items()} | {"cpu_ms_per_mib": {
        f"{d}.{c}": cpu[(d, c)] * 1000 / (a.mib * a.rounds) for d, c in keys}}


if __name__ == "__main__":
    main()
