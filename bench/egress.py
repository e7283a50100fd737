#!/usr/bin/env python3
"""HTTPS through the egress proxy against the same HTTPS without it, in one run.

Builds a test "internet" of its own (a network namespace holding 198.51.100.10, TEST-NET-2,
with the test HTTPS server of crates/glovebox/tests/netfix.py and a certificate from a test
CA made here), starts one `glovebox serve` that trusts that CA upstream, and creates three
sandboxes that reach the same server:

  direct     allow-list "198.51.100.10:8443": routed by nftables, no proxy (the baseline)
  pass       allow-list "api.good.test:8443": the name proxy reads the SNI and relays bytes
  brokered   the same name with inject_headers: the proxy terminates TLS with the sandbox's CA,
             sets Authorization from a secret, and re-encrypts to the verified upstream

Clients run inside the sandboxes: curl downloads --mib MiB (throughput), and a Python client
times small GETs, on one keep-alive connection and on a new connection each (latency).
Configurations are interleaved round by round. Also times sandbox create + destroy with
deny-all, a CIDR allow-list, a name allow-list and a brokering policy.

Every packet stays on this machine: loopback, the sandboxes' links and the namespace made
here (removed at the end, whatever happens). Needs root. See docs/benchmarks.md.
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NETFIX = os.path.join(REPO, "crates/glovebox/tests/netfix.py")
ADDR = "198.51.100.10"

CLIENT = r"""
import json, socket, ssl, sys, time
host, ip, cafile, n_keep, n_new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
ctx = ssl.create_default_context(cafile=cafile if cafile != "-" else None)
if ip == "-":
    ip = socket.gethostbyname(host)
def conn():
    s = socket.create_connection((ip, 8443), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(s, server_hostname=host)
req = ("GET / HTTP/1.1\r\nHost: %s:8443\r\n\r\n" % host).encode()
def one(t):
    t.sendall(req)
    buf = b""
    while b"\r\n\r\nok" not in buf:
        d = t.recv(4096)
        if not d:
            raise SystemExit("connection closed: %r" % buf[:200])
        buf += d
keep, new = [], []
t = conn()
one(t)
for _ in range(n_keep):
    t0 = time.perf_counter(); one(t); keep.append((time.perf_counter() - t0) * 1000)
t.close()
for _ in range(n_new):
    t0 = time.perf_counter(); t = conn(); one(t); new.append((time.perf_counter() - t0) * 1000); t.close()
print(json.dumps({"keep": keep, "new": new}))
"""


def sh(*argv, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)
    if check and r.returncode != 0:
        raise SystemExit(f"egress bench: {' '.join(argv)} failed: {r.stderr.strip()}")
    return r


class Api:
    def __init__(self, url, key):
        self.url, self.key = url, key

    def call(self, method, path, body=None, raw=None, timeout=300):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ok(self, method, path, body=None, raw=None):
        st, v = self.call(method, path, body, raw)
        if st >= 300:
            raise SystemExit(f"egress bench: {method} {path} -> {st} {v}")
        return v

    def exec(self, sid, argv, timeout_ms=300_000):
        r = self.ok("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": argv, "timeout_ms": timeout_ms})
        if r["exit_code"] != 0:
            raise SystemExit(f"egress bench: {argv[:3]} in {sid}: {r}")
        return r["stdout"]


def cpu_s(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(xs):
    return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "p99": pct(xs, 0.99)}


class World:
    """The namespace, its server, the daemon; torn down by close() whatever happened."""

    def __init__(self, glovebox):
        self.tag = secrets.token_hex(3)
        self.ns, self.veth = f"gbbench-{self.tag}", f"gbb{self.tag}"
        self.tmp = tempfile.mkdtemp(prefix="glovebox-egress-")
        self.server = self.daemon = None
        self.glovebox = glovebox

    def start(self):
        t = self.tmp
        ca, ca_key, cert, key = (os.path.join(t, n) for n in ("ca.pem", "ca.key", "cert.pem", "key.pem"))
        ext = os.path.join(t, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:api.good.test,DNS:pypi.good.test\nbasicConstraints=CA:FALSE\n"
                    "extendedKeyUsage=serverAuth\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        sh("openssl", "req", "-x509", *ec, "-subj", "/CN=Glovebox bench CA", "-days", "2", "-keyout", ca_key,
           "-out", ca, "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
        sh("openssl", "req", "-new", *ec, "-subj", "/CN=api.good.test", "-keyout", key, "-out", t + "/req.csr")
        sh("openssl", "x509", "-req", "-in", t + "/req.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
           "-days", "2", "-extfile", ext, "-out", cert)
        self.ca = ca
        peer = self.veth + "p"
        for cmd in (
            ["ip", "netns", "add", self.ns],
            ["ip", "link", "add", self.veth, "type", "veth", "peer", "name", peer],
            ["ip", "link", "set", peer, "netns", self.ns],
            ["ip", "addr", "add", "198.51.100.1/24", "dev", self.veth],
            ["ip", "link", "set", self.veth, "up"],
            ["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"],
            ["ip", "netns", "exec", self.ns, "ip", "addr", "add", ADDR + "/24", "dev", peer],
            ["ip", "netns", "exec", self.ns, "ip", "link", "set", peer, "up"],
            ["ip", "netns", "exec", self.ns, "ip", "route", "add", "default", "via", "198.51.100.1"],
        ):
            sh(*cmd)
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "python3", NETFIX, ADDR, os.path.join(t, "inet.log"), cert, key],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.server.stdout.readline().strip() != "ready":
            raise SystemExit("egress bench: the test server did not start")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        self.key = "bench-" + secrets.token_hex(16)
        env = dict(os.environ, GLOVEBOX_DNS_UPSTREAM=ADDR + ":53", GLOVEBOX_UPSTREAM_CA=ca,
                   RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        self.log = open(os.path.join(t, "daemon.log"), "w")
        self.daemon = subprocess.Popen(
            [self.glovebox, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(t, "data"),
             "--api-key", self.key, "--warm-pool", "0"], env=env, stdout=self.log, stderr=self.log)
        self.api = Api(f"http://127.0.0.1:{port}", self.key)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.api.url + "/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("egress bench: the daemon did not start")

    def close(self):
        if self.daemon:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        if self.server:
            self.server.kill()
            self.server.wait()
        sh("ip", "link", "del", self.veth, check=False)
        sh("ip", "netns", "del", self.ns, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glovebox", required=True, help="the glovebox binary (release build)")
    ap.add_argument("--out", help="write results as JSON here")
    ap.add_argument("--mib", type=int, default=100, help="download size for throughput (MiB)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--n", type=int, default=400, help="keep-alive requests per configuration and round")
    ap.add_argument("--new", type=int, default=40, help="new-connection requests per configuration and round")
    ap.add_argument("--create-n", type=int, default=15, help="creates per policy")
    ap.add_argument("--quick", action="store_true", help="--mib 32 --rounds 2 --n 100 --new 10 --create-n 5")
    a = ap.parse_args()
    if a.quick:
        a.mib, a.rounds, a.n, a.new, a.create_n = 32, 2, 100, 10, 5
    if os.geteuid() != 0:
        raise SystemExit("egress bench: needs root")
    w = World(a.glovebox)
    try:
        w.start()
        res = run(w, a)
    finally:
        w.close()
    report(res)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


def run(w, a):
    api = w.api
    api.ok("PUT", "/v1/secrets/bench_token", {"value": "bench-" + secrets.token_hex(16)})
    broker = {"domain": "api.good.test:8443", "inject_headers": {"Authorization": "Bearer ${secret:bench_token}"}}
    cfgs = {
        "direct": {"mode": "allow-list", "allow": [ADDR + ":8443"]},
        "pass": {"mode": "allow-list", "allow": ["api.good.test:8443"]},
        "brokered": {"mode": "allow-list", "allow": [broker]},
    }
    sbs = {}
    for name, pol in cfgs.items():
        sbs[name] = api.ok("POST", "/v1/sandboxes", {"timeout_s": 3600, "network": pol,
                                                     "resources": {"memory_mb": 1024}})["id"]
    with open(w.ca, "rb") as f:
        ca = f.read()
    for name in ("direct", "pass"):
        api.ok("PUT", f"/v1/sandboxes/{sbs[name]}/files?path=/tmp/ca.pem", raw=ca)
    # host, ip, cafile for each: the baseline dials the address (no name rules, so no DNS).
    how = {"direct": ("api.good.test", ADDR, "/tmp/ca.pem"), "pass": ("api.good.test", "-", "/tmp/ca.pem"),
           "brokered": ("api.good.test", "-", "-")}
    tput = {k: [] for k in cfgs}
    cpu = {k: 0.0 for k in cfgs}
    keep = {k: [] for k in cfgs}
    new = {k: [] for k in cfgs}
    url = f"https://api.good.test:8443/bytes/{a.mib << 20}"
    for r in range(a.rounds):
        order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
        for name in order:
            host, ip, cafile = how[name]
            curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", "--max-time", "120"]
            if ip != "-":
                curl += ["--resolve", f"{host}:8443:{ip}"]
            if cafile != "-":
                curl += ["--cacert", cafile]
            c0 = cpu_s(w.daemon.pid)
            size, total = api.exec(sbs[name], curl + [url]).split()
            cpu[name] += cpu_s(w.daemon.pid) - c0
            if int(size) != a.mib << 20:
                raise SystemExit(f"egress bench: {name}: downloaded {size} bytes")
            tput[name].append(int(size) / float(total) / (1 << 20))
            out = json.loads(api.exec(sbs[name], ["python3", "-c", CLIENT, host, ip, cafile, str(a.n), str(a.new)]))
            keep[name] += out["keep"]
            new[name] += out["new"]
        print(f"  round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {tput[k][-1]:.0f} MiB/s" for k in cfgs),
              file=sys.stderr, flush=True)
    for sid in sbs.values():
        api.call("DELETE", f"/v1/sandboxes/{sid}")

    # Create + destroy cost per policy, interleaved.
    create_pols = {
        "deny_all": {"mode": "deny-all"},
        "cidr_allow_list": {"mode": "allow-list", "allow": ["198.51.100.0/24"]},
        "name_allow_list": {"mode": "allow-list", "allow": ["api.good.test:8443"]},
        "brokering": {"mode": "allow-list", "allow": [broker]},
    }
    create = {k: [] for k in create_pols}
    destroy = {k: [] for k in create_pols}
    for i in range(a.create_n + 1):
        for name, pol in create_pols.items():
            t0 = time.perf_counter()
            sid = api.ok("POST", "/v1/sandboxes", {"network": pol})["id"]
            t1 = time.perf_counter()
            api.call("DELETE", f"/v1/sandboxes/{sid}")
            t2 = time.perf_counter()
            if i > 0:  # the first round warms caches (skeleton, nft table)
                create[name].append((t1 - t0) * 1000)
                destroy[name].append((t2 - t1) * 1000)
    med = {k: statistics.median(v) for k, v in tput.items()}
    res = {
        "params": vars(a),
        "throughput_mib_s": {k: {"median": med[k], "all": v} for k, v in tput.items()},
        "throughput_ratio": {k: med[k] / med["direct"] for k in ("pass", "brokered")},
        # Daemon CPU per MiB downloaded (the proxy's work; the exec round trip adds a little).
        "daemon_cpu_ms_per_mib": {k: cpu[k] * 1000 / (a.mib * a.rounds) for k in cfgs},
        "keepalive_ms": {k: summary(v) for k, v in keep.items()},
        "new_connection_ms": {k: summary(v) for k, v in new.items()},
        "added_p50_ms": {
            "keepalive": {k: summary(keep[k])["p50"] - summary(keep["direct"])["p50"] for k in ("pass", "brokered")},
            "new_connection": {k: summary(new[k])["p50"] - summary(new["direct"])["p50"] for k in ("pass", "brokered")},
        },
        "create_ms": {k: summary(v) for k, v in create.items()},
        "destroy_ms": {k: summary(v) for k, v in destroy.items()},
    }
    return res


def report(r):
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print("\nHTTPS through the egress proxy vs direct (same run, interleaved)")
    print(f"{'config':<10} {'MiB/s':>8} {'ratio':>6} {'keep p50':>9} {'p95':>7} {'p99':>7} "
          f"{'new p50':>8} {'p95':>7} {'p99':>7}")
    for k in ("direct", "pass", "brokered"):
        t, ka, nc = r["throughput_mib_s"][k]["median"], r["keepalive_ms"][k], r["new_connection_ms"][k]
        ratio = 1.0 if k == "direct" else r["throughput_ratio"][k]
        print(f"{k:<10} {t:>8.0f} {ratio:>6.2f} {f(ka['p50']):>9} {f(ka['p95']):>7} {f(ka['p99']):>7} "
              f"{f(nc['p50']):>8} {f(nc['p95']):>7} {f(nc['p99']):>7}")
    c = r["daemon_cpu_ms_per_mib"]
    print("daemon CPU per MiB downloaded (ms): " + ", ".join(f"{k} {c[k]:.2f}" for k in c)
          + f"  (brokered: the proxy alone could relay {1000 / max(c['brokered'], 1e-9):.0f} MiB/s per core)")
    ad = r["added_p50_ms"]
    print(f"added p50 (ms): keep-alive pass {f(ad['keepalive']['pass'])}, brokered {f(ad['keepalive']['brokered'])}; "
          f"new connection pass {f(ad['new_connection']['pass'])}, brokered {f(ad['new_connection']['brokered'])}")
    print("\nsandbox create / destroy by policy (ms)")
    for k, c in r["create_ms"].items():
        d = r["destroy_ms"][k]
        print(f"{k:<16} create p50 {f(c['p50'])} p95 {f(c['p95'])}   destroy p50 {f(d['p50'])} p95 {f(d['p95'])}")


if __name__ == "__main__":
    main()
