#!/usr/bin/env python3
"""Template benchmark: does a template's size show in create latency, and what do many
sandboxes of one template cost on disk?

  bench/templates.py [--bin target/x86_64-unknown-linux-gnu/release/glovebox] [--n 100]
                     [--density 100] [--templates target/test-templates]

Starts its own `glovebox serve` (warm pool 0, throwaway data dir, loopback port), then
1. builds `bench-big` (host base + ~250 MB in 2 000 files) through the API;
2. create latency (POST /v1/sandboxes until it answers, then DELETE), `base` vs `bench-big`
   vs `code-interpreter` (a ~250 MB layer; its create also starts a python kernel in the
   background), interleaved, N rounds each; p50/p90 per template;
3. density: DENSITY sandboxes of `bench-big` alive at once, each writing 1 MiB; the
   data dir's size and the root filesystem's used bytes before and after (a sandbox's writes
   go to its own RAM-backed upper, so only they should cost, and not on disk).
Needs root and the code-interpreter layer (scripts/build-code-interpreter). Loopback only.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Api:
    def __init__(self, url, key):
        self.url, self.key = url, key

    def call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.key)
        if data is not None:
            req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return json.loads(raw) if raw else None


def du(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(repo, "target/x86_64-unknown-linux-gnu/release/glovebox"))
    ap.add_argument("--templates", default=os.path.join(repo, "target/test-templates"))
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--density", type=int, default=100)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.templates, "templates/code-interpreter.json")):
        sys.exit(f"no code-interpreter template in {a.templates}: run scripts/build-code-interpreter {a.templates}")
    data = tempfile.mkdtemp(prefix="gb-tplbench-")
    port, key = free_port(), "bench-" + os.urandom(8).hex()
    env = dict(os.environ, GLOVEBOX_TEMPLATES_DIR=a.templates, GLOVEBOX_LOG="warn")
    log = open(os.path.join(data, "..", os.path.basename(data) + ".log"), "w")
    d = subprocess.Popen([a.bin, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
                          "--api-key", key, "--warm-pool", "0"], env=env, stdout=log, stderr=log)
    api = Api(f"http://127.0.0.1:{port}", key)
    try:
        for _ in range(150):
            try:
                urllib.request.urlopen(api.url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        layer = du(os.path.join(a.templates, "layers"))
        # A big template without kernels: ~250 MB in 2 000 files, built through the API.
        spec = ("FROM host\nRUN mkdir -p /opt/big && cd /opt/big && "
                "for i in $(seq 1 2000); do head -c 131072 /dev/urandom > f$i; done\n")
        t0 = time.perf_counter()
        api.call("POST", "/v1/templates", {"name": "bench-big", "dockerfile": spec}, timeout=600)
        build_s = time.perf_counter() - t0
        big = du(os.path.join(data, "layers"))
        lat = {"base": [], "bench-big": [], "code-interpreter": []}
        for i in range(a.n + 5):
            for t in lat:
                t0 = time.perf_counter()
                sb = api.call("POST", "/v1/sandboxes", {"template": t, "timeout_s": 60})
                ms = (time.perf_counter() - t0) * 1000
                api.call("DELETE", f"/v1/sandboxes/{sb['id']}")
                if i >= 5:  # warm-up rounds
                    lat[t].append(ms)
        res = {"code_interpreter_layer_bytes": layer, "bench_big_layer_bytes": big,
               "bench_big_build_s": round(build_s, 1), "create_ms": {}}
        for t, xs in lat.items():
            res["create_ms"][t] = {"p50": round(pct(xs, 0.5), 2), "p90": round(pct(xs, 0.9), 2), "n": len(xs)}
        for t in ("bench-big", "code-interpreter"):
            res[f"create_p50_diff_ms_{t}_vs_base"] = round(res["create_ms"][t]["p50"] - res["create_ms"]["base"]["p50"], 2)

        st0 = shutil.disk_usage("/").used
        dd0 = du(data)
        ids = []
        for _ in range(a.density):
            sb = api.call("POST", "/v1/sandboxes", {"template": "bench-big", "timeout_s": 600, "resources": {"memory_mb": 64}})
            ids.append(sb["id"])
            api.call("POST", f"/v1/sandboxes/{sb['id']}/exec",
                     {"cmd": ["sh", "-c", "head -c 1048576 /dev/urandom > /tmp/own; cat /opt/big/f1 > /dev/null"]})
        st1 = shutil.disk_usage("/").used
        dd1 = du(data)
        for i in ids:
            api.call("DELETE", f"/v1/sandboxes/{i}")
        res["density"] = {
            "sandboxes": a.density,
            "template": "bench-big",
            "template_layer_bytes": big,
            "data_dir_growth_bytes": dd1 - dd0,
            "root_fs_growth_bytes": st1 - st0,
            "own_writes_bytes": a.density << 20,
        }
        print(json.dumps(res, indent=2))
    finally:
        d.terminate()
        try:
            d.wait(20)
        except subprocess.TimeoutExpired:
            d.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
