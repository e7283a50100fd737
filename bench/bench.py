#!/usr/bin/env python3
"""Benchmarks of Glovebox against its peers, in one run (Python standard library only).

bench/run starts two daemons on loopback: one with `--warm-pool 0` (--url) and one with
`--warm-pool 2` and the code-interpreter template (--pool-url). Measured, each after a
warm-up (`--warmup`, default 10) that is not counted:

Latency, interleaved in rounds (p50/p95/p99 of n iterations):
  api.create_exec_destroy    warm pool 0: POST /v1/sandboxes, POST .../exec ["true"],
                             DELETE .../{id} on one keep-alive connection; each phase is
                             recorded too (api.create, api.exec_first, api.destroy)
  pool.create_exec_destroy   the same against the warm-pool-2 daemon (pool.create, ...);
                             after each iteration the harness waits, unmeasured, until the
                             pool is full again (pool.refill: create returned -> pool full)
  api.exec_roundtrip         POST .../exec ["true"] again and again in one live sandbox, each
                             followed by GET .../{id} (api.get_roundtrip: the HTTP floor)
  api.run_code               POST .../code {"code":"1+1"} in a warm python context
  cli.run_daemon             `glovebox run -- true` with GLOVEBOX_URL set
  cli.run_embedded           `glovebox run -- true` with no daemon
  peer.*                     bwrap, unshare, runc, runsc running `true`, and a plain
                             fork/exec of `true` (the cost every subprocess peer shares)
Own groups, after the rounds:
  code.plot_first_result     warm pool: create (template code-interpreter) -> the first PNG
                             result of the seed cell (numpy + pandas + matplotlib); the pool
                             is left to refill between iterations (few iterations)
  peer.host_plot_*           the same cell on the host: first and second run in a python
                             preloaded as the kernel is, and a cold python3
  code.cold_*                no warm sandbox (pool 0): create a code-interpreter sandbox, the
                             seed cell's first PNG (the kernel's imports included), then its
                             memory cgroup's charge (code_memory); the peer is the cold python3
  code.zygote_*              the same against a third pool-0 daemon with code_zygote on
                             (--zygote-url; code_memory_zygote): its kernel forked from the
                             tenant's and template's zygote
  net.create_*               create with network deny-all vs an allow-list (pool 0)
  vol.create_*               create without a volume vs with one (pool 0; each create mounts
                             the volume's image on the host afresh: no other sandbox holds it),
                             and with a disk-backed 2 GiB disk (its ext4 image made at create)
  snap.*                     snapshot of a sandbox that wrote 100 MiB (10 files of 10 MiB;
                             POST .../snapshots, the snapshot deleted unmeasured so each copy
                             is fresh), and fork into 10 children per child (the fork's own
                             snapshot included; children destroyed unmeasured), beside
                             peer.cp_a_100mib: `cp -a` of the same-sized tree from the host's
                             /dev/shm to the bench's work dir (warm pool 0)
  api.*_after_idle           exec true, GET .../{id} and a host fork/exec of true (the peer),
                             each after IDLE_GAP_S of quiet: what a call costs when the
                             machine was idle before it, as an agent's calls, seconds apart, find it
  runc, runsc                alone (their asynchronous teardown spills into the next run);
                             gvisor.* (create + exec true + destroy with isolation gvisor)
                             runs in runsc's group, beside `runsc run` of the same `true`
Phases with their own units:
  files     PUT then GET of 1 MiB and 100 MiB: MiB/s (host tmpfs from Python as the peer)
  syscall   100k os.stat("/") (and os.getppid()) in /usr/bin/python3, inside vs outside
  syscall_gvisor  the same loop in an isolation-gvisor sandbox, under `runsc run` directly,
            and on the host (the tier's syscall tax beside gVisor's own), 10 rounds
  load      8 and 32 client threads doing create -> exec true -> destroy for --load-s s
  density   N idle 64 MiB sandboxes: daemon RSS and MemAvailable per sandbox, then none left
  growth    sandboxes pile up to --growth (every other with an allow-list): create and exec p50
            at each level (0, 100, 250, 500, 1000), the first 50 creates against those at 400
            live; all destroyed and checked gone (bench/wave2.py)

Every row of issue 27's table (performance, wave 2) is evaluated on the run's own numbers
(bench/wave2.py): bench/run adds bench/egress.py's rows once it has run (`--summary`).

Peers and CLI runs are spawned from this Python process, so they carry Python's own spawn
cost; `peer.true` measures exactly that cost. Results: a table on stdout, a JSON file
(`--out`) and the Markdown tables beside it.
"""

import argparse
import datetime
import hashlib
import http.client
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import wave2

BWRAP_MIN = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib",
             "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "true"]
BWRAP_HOST = ["bwrap", "--unshare-all", "--bind", "/", "/", "true"]
UNSHARE = ["unshare", "--fork", "--pid", "--mount", "--net", "--uts", "--ipc", "--user",
           "--map-root-user", "true"]

# Targets from the performance issues. Each is evaluated on the measured numbers; a miss is
# reported with its size, never hidden.
TARGET_CED_P50_MS = 10.0
# Pause and resume of a sandbox with a busy process (issue 22's freezer target).
TARGET_PAUSE_P50_MS = 20.0
TARGET_CED_VS_BWRAP = 1.5
TARGET_POOL_CREATE_P50_MS = 2.0
TARGET_EXEC_P50_MS = 2.0
TARGET_RUN_CODE_P50_MS = 2.0
TARGET_PLOT_P50_MS = 150.0
TARGET_RATE_PER_S = 100.0
TARGET_SYSCALL_TAX_PCT = 5.0
TARGET_TAIL_RATIO = 3.0

# The hosted services' published time-to-interactive medians (seconds). Context only:
# they are not measured here and include the network to their regions.
HOSTED_PUBLISHED_S = {"Daytona": 0.11, "E2B": 0.44, "Vercel": 1.75, "Modal": 2.66}

# The seed example: numpy + pandas + matplotlib, one histogram shown as a PNG result.
SEED = """\
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
data = pd.Series(np.random.default_rng(7).normal(size=100))
print(f"mean={data.mean():.3f} median={data.median():.3f} std={data.std():.3f}")
plt.hist(data, bins=10)
plt.title("histogram")
plt.show()
"""

# The host peer of the seed cell: the same python, the same packages (the template's layer on
# PYTHONPATH), the kernel's warm-up figure and its plt.show (every open figure saved as a PNG
# with bbox_inches="tight", base64-encoded, closed). One line on stdin runs the cell once and
# answers its milliseconds; with --once it runs the cell once from a cold start.
HOST_PLOT = r'''
import base64, io, sys, time
import matplotlib
matplotlib.use("Agg")
import numpy, pandas, matplotlib.pyplot as plt
def show(*a, **k):
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        base64.b64encode(buf.getvalue())
        plt.close(fig)
plt.show = show
cell = compile(sys.argv[1], "<cell>", "exec")
def run():
    out, sys.stdout = sys.stdout, io.StringIO()
    try:
        exec(cell, {"__name__": "__main__"})
    finally:
        sys.stdout = out
if "--once" in sys.argv:
    run()
    sys.exit(0)
fig = plt.figure(); plt.hist([1, 2, 2, 3]); plt.title("warm-up")
fig.savefig(io.BytesIO(), format="png"); plt.close(fig)
print("ready", flush=True)
for _ in sys.stdin:
    t = time.perf_counter_ns()
    run()
    print((time.perf_counter_ns() - t) / 1e6, flush=True)
'''

# 100k stat("/"), 100k getppid() (no path walk: the bare syscall and seccomp cost) and 100k
# stat of the interpreter's os.py (a path walked through /usr, an overlay in a sandbox), each
# timed inside the process so the interpreter's start is not counted.
SYSCALL_LOOP = """\
import os, time
n = 100000
f = os.stat
t = time.perf_counter_ns()
for _ in range(n):
    f("/")
a = time.perf_counter_ns() - t
g = os.getppid
t = time.perf_counter_ns()
for _ in range(n):
    g()
b = time.perf_counter_ns() - t
u = os.__file__
t = time.perf_counter_ns()
for _ in range(n):
    f(u)
c = time.perf_counter_ns() - t
print(a / 1e6, b / 1e6, c / 1e6)
"""
SYSCALL_WHAT = ("stat", "getppid", "stat_usr")

PYTHON = "/usr/bin/python3"
MIB = 1 << 20


class BenchError(Exception):
    pass


wave2.Error = BenchError


# ---------------------------------------------------------------------------- statistics

def percentile(sorted_ms, q):
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not sorted_ms:
        return float("nan")
    if len(sorted_ms) == 1:
        return sorted_ms[0]
    pos = (len(sorted_ms) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def summarize(samples_ms):
    s = sorted(samples_ms)
    return {
        "n": len(s),
        "p50": percentile(s, 50),
        "p95": percentile(s, 95),
        "p99": percentile(s, 99),
        "mean": statistics.fmean(s) if s else float("nan"),
        "min": s[0] if s else float("nan"),
        "max": s[-1] if s else float("nan"),
    }


def ms_since(t0):
    return (time.perf_counter_ns() - t0) / 1e6


# ---------------------------------------------------------------------------- HTTP client

class Api:
    """A keep-alive client of the native API on loopback. Reconnects once if the server
    closed an idle connection; any other failure is a BenchError with the server's words."""

    def __init__(self, url, key, timeout=60.0):
        if not url.startswith("http://"):
            raise BenchError(f"only http:// URLs are supported, got {url}")
        hostport = url[len("http://"):].rstrip("/")
        host, _, port = hostport.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "[::1]") and not host.startswith("127."):
            # The benchmark only ever talks to a daemon on this machine.
            raise BenchError(f"refusing to benchmark a non-loopback daemon: {host}")
        self.url, self.key = url, key
        self.host, self.port, self.timeout = host.strip("[]"), int(port), timeout
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.conn = None

    def clone(self):
        """A client with its own connection (one per thread)."""
        return Api(self.url, self.key, self.timeout)

    def _connect(self):
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self.conn.connect()
        # http.client sets TCP_NODELAY itself; set it again so the numbers never depend on
        # that detail of the Python version (Nagle + delayed ACK would add ~40 ms).
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, method, path, body=None, raw=None):
        if raw is not None:
            data, headers = raw, dict(self.headers, **{"Content-Type": "application/octet-stream"})
        else:
            data, headers = (None if body is None else json.dumps(body).encode()), self.headers
        for attempt in (0, 1):
            if self.conn is None:
                self._connect()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                got = resp.read()
                return resp.status, got
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable: the loop returns or raises")

    def expect(self, method, path, body, status, raw=None):
        try:
            got, data = self.request(method, path, body, raw)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise BenchError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if got != status:
            raise BenchError(f"{method} {path}: HTTP {got} (want {status}): {data[:300]!r}")
        return data

    def expect_json(self, method, path, body, status):
        data = self.expect(method, path, body, status)
        return json.loads(data) if data else None

    def create(self, body=None):
        return self.expect_json("POST", "/v1/sandboxes", body or {}, 201)["id"]

    def exec_true(self, sid):
        r = self.expect_json("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, 200)
        if r.get("exit_code") != 0:
            raise BenchError(f"exec true in {sid}: {r}")

    def exec_out(self, sid, cmd, timeout_ms=60000):
        r = self.expect_json("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": cmd, "timeout_ms": timeout_ms}, 200)
        if r.get("exit_code") != 0:
            raise BenchError(f"exec {cmd[0]} in {sid}: exit {r.get('exit_code')}: {r.get('stderr', '')[-300:]}")
        return r["stdout"]

    def run_code(self, sid, code):
        r = self.expect_json("POST", f"/v1/sandboxes/{sid}/code", {"code": code}, 200)
        if r.get("error"):
            raise BenchError(f"run_code in {sid}: {r['error'].get('name')}: {r['error'].get('value')}")
        return r

    def destroy(self, sid):
        self.expect("DELETE", f"/v1/sandboxes/{sid}", None, 204)

    def list_ids(self):
        return [s["id"] for s in self.expect_json("GET", "/v1/sandboxes", None, 200)["sandboxes"]]

    def metrics(self):
        """The daemon's Prometheus text as {series: value} (histogram buckets included)."""
        out = {}
        for line in self.expect("GET", "/metrics", None, 200).decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def warm(self):
        return int(self.metrics().get('glovebox_sandboxes{state="warm"}', 0))

    def wait_warm(self, want, timeout_s, poll_s=0.002):
        """Waits until the daemon's pool holds `want` sandboxes; returns when it did (the
        perf_counter_ns of the observation). A pool that does not fill in time is an error."""
        deadline = time.monotonic() + timeout_s
        while True:
            have = self.warm()
            if have >= want:
                return time.perf_counter_ns()
            if time.monotonic() > deadline:
                raise BenchError(f"the warm pool holds {have} sandboxes after {timeout_s:g} s (want {want})")
            time.sleep(poll_s)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ---------------------------------------------------------------------------- benchmarks
#
# Each benchmark is a Bench: `step(i)` does one iteration and returns {name: ms} (one
# iteration of create+exec+destroy yields the total and each phase). The scheduler warms every
# bench of a group, then runs the group interleaved in rounds, so a burst of load from
# elsewhere on the machine (a build, a test suite) lands on all of them alike and the ratios
# stay fair. The main group holds the fast benchmarks; runc and runsc run alone afterwards
# (their asynchronous teardown -- gVisor's sandbox and gofer processes, runc's cgroups --
# spills into whatever runs next and inflated the others' p95 by a third when interleaved);
# the code-interpreter plot and the network-policy creates have their own groups.

class Bench:
    def __init__(self, name, n, warmup, step, setup=None, teardown=None, group="main"):
        self.name, self.n, self.warmup, self.group = name, n, warmup, group
        self.step, self.setup, self.teardown = step, setup, teardown
        self.samples = {}
        self.done = 0
        self.elapsed_s = 0.0

    def once(self, i, keep):
        t0 = time.monotonic()
        got = self.step(i)
        self.elapsed_s += time.monotonic() - t0
        if keep:
            for k, v in got.items():
                self.samples.setdefault(k, []).append(v)
            self.done += 1


def ced_step(api, prefix, pool_want=None, body=None):
    """create + exec true + destroy. With `pool_want` (the pool daemon), the pool is full
    before the create, and the harness waits after the iteration, unmeasured, until it is
    full again: every create finds a warm sandbox, and no refill runs under the next bench.
    `body`: the create's body (`{"isolation": "gvisor"}` for the gVisor tier)."""
    def step(_i):
        if pool_want:
            api.wait_warm(pool_want, 30)
        t0 = time.perf_counter_ns()
        sid = api.create(body)
        t1 = time.perf_counter_ns()
        api.exec_true(sid)
        t2 = time.perf_counter_ns()
        api.destroy(sid)
        t3 = time.perf_counter_ns()
        out = {f"{prefix}.create_exec_destroy": (t3 - t0) / 1e6, f"{prefix}.create": (t1 - t0) / 1e6,
               f"{prefix}.exec_first": (t2 - t1) / 1e6, f"{prefix}.destroy": (t3 - t2) / 1e6}
        if pool_want:
            out[f"{prefix}.refill"] = (api.wait_warm(pool_want, 30) - t1) / 1e6
        return out
    return step


class PausedSandbox:
    """One sandbox with a busy process, resumed and paused again (the cgroup freezer) over the
    API. It is left paused between its steps: running, its loop took one of the machine's
    cores from every other benchmark of the group for the whole run (on 2 cores the exec round
    trip measured 2.6 ms with it beside, 1.2 ms alone)."""

    def __init__(self, api):
        self.live = LiveSandbox(api)

    def _expect_state(self, verb, state):
        base = f"/v1/sandboxes/{self.live.sid}"
        got = self.live.api.expect_json("POST", f"{base}/{verb}", None, 200).get("state")
        if got != state:
            raise BenchError(f"{verb} did not answer state {state} (got {got})")

    def setup(self):
        self.live.setup()
        body = {"cmd": ["sh", "-c", "while :; do :; done"], "background": True, "timeout_ms": 0}
        self.live.api.expect_json("POST", f"/v1/sandboxes/{self.live.sid}/exec", body, 202)
        self._expect_state("pause", "paused")

    def step(self, _i):
        t0 = time.perf_counter_ns()
        self._expect_state("resume", "running")
        t1 = time.perf_counter_ns()
        self._expect_state("pause", "paused")
        return {"api.resume": (t1 - t0) / 1e6, "api.pause": ms_since(t1)}


class LiveSandbox:
    """One sandbox kept for the exec and run_code round-trip benchmarks."""

    def __init__(self, api, code=False):
        self.api, self.sid, self.code = api, None, code

    def setup(self):
        self.sid = self.api.create()
        if self.code:
            self.api.run_code(self.sid, "1+1")  # starts the kernel: the context is warm after it

    def step(self, _i):
        if not self.code:
            t0 = time.perf_counter_ns()
            self.api.exec_true(self.sid)
            t1 = time.perf_counter_ns()
            self.api.expect("GET", f"/v1/sandboxes/{self.sid}", None, 200)
            return {"api.exec_roundtrip": (t1 - t0) / 1e6, "api.get_roundtrip": ms_since(t1)}
        t0 = time.perf_counter_ns()
        r = self.api.run_code(self.sid, "1+1")
        ms = ms_since(t0)
        main = [x for x in r.get("results", []) if x.get("is_main_result")]
        if not main or main[0]["data"].get("text/plain") != "2":
            raise BenchError(f"run_code 1+1 gave {r}")
        return {"api.run_code": ms}

    def teardown(self):
        if self.sid is not None:
            self.api.destroy(self.sid)
            self.sid = None


IDLE_GAP_S = 0.05


class AfterIdle:
    """exec true, GET and a host fork/exec of true, each after IDLE_GAP_S with nothing sent
    (the back-to-back loops above keep the machine busy between calls; an agent's calls come
    seconds apart). The host spawn is the peer: what the same idle costs without Glovebox."""

    def __init__(self, api):
        self.live = LiveSandbox(api)

    def step(self, _i):
        api, sid = self.live.api, self.live.sid
        time.sleep(IDLE_GAP_S)
        t0 = time.perf_counter_ns()
        api.exec_true(sid)
        out = {"api.exec_after_idle": ms_since(t0)}
        time.sleep(IDLE_GAP_S)
        t0 = time.perf_counter_ns()
        api.expect("GET", f"/v1/sandboxes/{sid}", None, 200)
        out["api.get_after_idle"] = ms_since(t0)
        time.sleep(IDLE_GAP_S)
        ms, rc = run_once(["true"], None)
        if rc != 0:
            raise BenchError("true failed on the host")
        out["peer.true_after_idle"] = ms
        return out


def check_seed(r):
    pngs = [x for x in r.get("results", []) if "image/png" in x.get("data", {})]
    if not pngs or not any("median=" in s for s in r.get("logs", {}).get("stdout", [])):
        raise BenchError(f"the seed cell gave no PNG or no statistics: {json.dumps(r)[:300]}")


def plot_step(api, pool_want, settle_s):
    """Warm pool: create a code-interpreter sandbox, run the seed cell, check it gave a PNG.
    Then (unmeasured) wait until the pool has a warm kernel again (taking one starts a refill,
    which imports pandas and matplotlib on the other core while the cell runs), settle, and
    run the same cell again in the same sandbox on a quiet machine (code.plot_cell_again:
    the sandbox's own cost, without the refill beside it); then destroy it."""
    def step(_i):
        api.wait_warm(pool_want, 60)
        t0 = time.perf_counter_ns()
        sid = api.create({"template": "code-interpreter"})
        t1 = time.perf_counter_ns()
        r = api.run_code(sid, SEED)
        t2 = time.perf_counter_ns()
        check_seed(r)
        api.wait_warm(pool_want, 60)
        time.sleep(settle_s)
        t3 = time.perf_counter_ns()
        check_seed(api.run_code(sid, SEED))
        again = ms_since(t3)
        api.destroy(sid)
        time.sleep(settle_s / 2)
        return {"code.plot_first_result": (t2 - t0) / 1e6, "code.plot_create": (t1 - t0) / 1e6,
                "code.plot_cell": (t2 - t1) / 1e6, "code.plot_cell_again": again}
    return step


def code_interpreter_site(store):
    """PYTHONPATH for the host peers: the code-interpreter template's dist-packages dirs, from
    the template store `glovebox template build` keeps (templates/<name>.json, layers/<id>/fs),
    top-most layer first. None if the template is not built."""
    try:
        with open(os.path.join(store, "templates", "code-interpreter.json")) as f:
            layers = json.load(f)["layers"]
    except (OSError, ValueError, KeyError):
        return None
    dirs = []
    for layer in layers:
        lib = os.path.join(store, "layers", layer, "fs", "usr", "local", "lib")
        for py in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
            d = os.path.join(lib, py, "dist-packages")
            if py.startswith("python3") and os.path.isdir(d):
                dirs.append(d)
    return os.pathsep.join(dirs) or None


class HostPlot:
    """The seed cell on the host (no sandbox), with the template's packages on PYTHONPATH.
    Each iteration starts a python that preloads and renders the warm-up figure as the
    kernel does, then times the cell's first run (the peer of code.plot_cell) and its second
    (the peer of code.plot_cell_again). `cold_step` times a python3 that does nothing ahead:
    start, imports and the cell, what a user pays without a warm kernel."""

    def __init__(self, site):
        self.site, self.mpl_dir = site, None

    def env(self):
        if self.mpl_dir is None:
            self.mpl_dir = tempfile.mkdtemp(prefix="gb-bench-mpl-")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MPL"))}
        env.update(PYTHONPATH=self.site, MPLBACKEND="Agg", MPLCONFIGDIR=self.mpl_dir)
        return env

    def step(self, _i):
        p = subprocess.Popen([PYTHON, "-c", HOST_PLOT, SEED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=self.env())
        try:
            if p.stdout.readline().strip() != "ready":
                raise BenchError(f"host python with the template's packages: {p.stderr.read()[-300:]}")
            got = []
            for _ in range(2):
                p.stdin.write("go\n")
                p.stdin.flush()
                line = p.stdout.readline()
                if not line:
                    raise BenchError(f"host plot process died: {p.stderr.read()[-300:]}")
                got.append(float(line))
        finally:
            p.stdin.close()
            p.wait(timeout=30)
        return {"peer.host_plot_first": got[0], "peer.host_plot_warm": got[1]}

    def cold_step(self, _i):
        t0 = time.perf_counter_ns()
        p = subprocess.run([PYTHON, "-c", HOST_PLOT, SEED, "--once"], capture_output=True, text=True,
                           env=self.env(), check=False)
        ms = ms_since(t0)
        if p.returncode != 0:
            raise BenchError(f"host python seed cell: {p.stderr[-300:]}")
        return {"peer.host_plot_cold": ms}

    def teardown(self):
        if self.mpl_dir is not None:
            shutil.rmtree(self.mpl_dir, ignore_errors=True)
            self.mpl_dir = None


def net_step(api, name, network):
    def step(_i):
        t0 = time.perf_counter_ns()
        sid = api.create({"network": network})
        t1 = time.perf_counter_ns()
        api.destroy(sid)
        return {f"net.create_{name}": (t1 - t0) / 1e6, f"net.destroy_{name}": ms_since(t1)}
    return step


class VolumeCreate:
    """Creates with no volume and with one 64 MiB volume at /data (made in setup, deleted in
    teardown); the sandbox is destroyed after each create, so each mounts the image afresh."""

    NAME = "bench-vol"

    def __init__(self, api):
        self.api = api

    def setup(self):
        got, data = self.api.request("POST", "/v1/volumes", {"name": self.NAME, "size_mb": 64})
        if got not in (201, 409):
            raise BenchError(f"POST /v1/volumes: HTTP {got}: {data[:300]!r}")

    def step_for(self, name, body):
        def step(_i):
            t0 = time.perf_counter_ns()
            sid = self.api.create(body)
            t1 = time.perf_counter_ns()
            self.api.destroy(sid)
            return {f"vol.create_{name}": (t1 - t0) / 1e6}
        return step

    def teardown(self):
        # The last sandbox's release (and the unmount) finish just after its destroy answers.
        deadline = time.monotonic() + 10
        while True:
            got, _ = self.api.request("DELETE", f"/v1/volumes/{self.NAME}")
            if got in (204, 404) or time.monotonic() > deadline:
                return
            time.sleep(0.05)


class SnapshotBench:
    """One sandbox that wrote 100 MiB (10 x 10 MiB of random bytes) under /data: snapshots of
    it, and forks of it into FORK_N children; beside `cp -a` of a tree of the same sizes from
    the host's /dev/shm (a tmpfs, as the sandbox's writable layer is) to the work dir."""

    FORK_N = 10
    FILES = 10
    MIB_EACH = 10

    def __init__(self, api, work):
        self.api, self.work = api, work
        self.sid = None
        self.src = f"/dev/shm/glovebox-bench-snap-{os.getpid()}"

    def setup(self):
        self.sid = self.api.create({"timeout_s": 3600, "resources": {"memory_mb": 2048, "disk_mb": 1024}})
        self.api.exec_out(self.sid, ["sh", "-c", f"mkdir -p /data && for i in $(seq 1 {self.FILES}); do "
                                     f"head -c {self.MIB_EACH << 20} /dev/urandom > /data/f$i; done"])
        os.makedirs(self.src, exist_ok=True)
        for i in range(self.FILES):
            with open(os.path.join(self.src, f"f{i}"), "wb") as f:
                f.write(os.urandom(self.MIB_EACH << 20))

    def snapshot_step(self, i):
        name = f"bench-snap-{i}"
        t0 = time.perf_counter_ns()
        self.api.expect_json("POST", f"/v1/sandboxes/{self.sid}/snapshots", {"name": name}, 201)
        ms = ms_since(t0)
        self.api.expect("DELETE", f"/v1/snapshots/{name}", None, 204)
        return {"snap.snapshot_100mib": ms}

    def fork_step(self, _i):
        t0 = time.perf_counter_ns()
        r = self.api.expect_json("POST", f"/v1/sandboxes/{self.sid}/fork", {"count": self.FORK_N}, 201)
        ms = ms_since(t0)
        for c in r["sandboxes"]:
            self.api.destroy(c["id"])
        return {"snap.fork_10": ms, "snap.fork_per_child": ms / self.FORK_N}

    def cp_step(self, i):
        dst = os.path.join(self.work, f"cp-a-{i}")
        t0 = time.perf_counter_ns()
        subprocess.run(["cp", "-a", self.src, dst], check=True)
        ms = ms_since(t0)
        shutil.rmtree(dst)
        return {"peer.cp_a_100mib": ms}

    def teardown(self):
        shutil.rmtree(self.src, ignore_errors=True)
        if self.sid:
            self.api.destroy(self.sid)
            self.sid = None


def run_once(argv, env=None, cwd=None):
    """Runs argv to completion with no output; returns (ms, returncode)."""
    t0 = time.perf_counter_ns()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, cwd=cwd, check=False)
    return ms_since(t0), p.returncode


def diagnose(argv, env=None, cwd=None):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=cwd,
                           check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    tail = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()[-3:]
    return f"exit {p.returncode}: {' | '.join(tail) or 'no output'}"


def cmd_step(name, argv_fn, env=None):
    """argv_fn(i) gives the argv of iteration i (runc/runsc need a fresh container id)."""
    def step(i):
        argv = argv_fn(i)
        ms, rc = run_once(argv, env)
        if rc != 0:
            raise BenchError(f"{' '.join(argv)}: {diagnose(argv_fn(f'diag-{i}'), env)}")
        return {name: ms}
    return step


def works(argv, env=None, cwd=None):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              cwd=cwd, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def schedule(benches, interleave, failed, before_group=None, after_group=None):
    """Warms and runs every bench, group by group (each group warmed just before it runs);
    a bench that fails is dropped and named in `failed`. Returns the benches that ran.
    `before_group(name)` / `after_group(name)` are called around each group's rounds."""
    groups = []
    for b in benches:
        g = next((g for g in groups if interleave and g[0].group == b.group), None)
        if g is None:
            groups.append([b])
        else:
            g.append(b)
    ran = []
    for group in groups:
        live = []
        for b in group:
            try:
                if b.setup:
                    b.setup()
                for i in range(b.warmup):
                    b.once(i, keep=False)
                live.append(b)
            except BenchError as e:
                failed[b.name] = str(e)
                print(f"  {b.name}: FAILED in warm-up: {e}", file=sys.stderr, flush=True)
        ran += live
        rounds = max((b.n for b in live), default=0)
        if before_group:
            before_group(group[0].group)
        if live:
            print(f"  {', '.join(b.name for b in live)}: {rounds} rounds", file=sys.stderr, flush=True)
        for r in range(rounds):
            for b in list(live):
                # Spread a bench with fewer iterations evenly over the rounds.
                target = -(-(r + 1) * b.n // rounds)
                try:
                    while b.done < target:
                        b.once(b.warmup + b.done, keep=True)
                except BenchError as e:
                    failed[b.name] = str(e)
                    live.remove(b)
                    print(f"  {b.name}: FAILED: {e}", file=sys.stderr, flush=True)
            if len(group) > 1 and rounds >= 50 and (r + 1) % max(1, rounds // 5) == 0:
                print(f"    round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        if after_group:
            after_group(group[0].group)
        for b in group:
            if b.teardown:
                try:
                    b.teardown()
                except BenchError as e:
                    print(f"  {b.name}: teardown: {e}", file=sys.stderr, flush=True)
    return ran


# ---------------------------------------------------------------------------- phases
#
# Benchmarks whose unit is not one latency per iteration. Each returns a dict for the JSON.

def files_phase(api, quick):
    """PUT then GET of 1 MiB and 100 MiB in one sandbox (its writable layer is a tmpfs charged
    to its memory cgroup), against the same write and read of a file on the host's /dev/shm
    tmpfs from Python. MiB/s per run; the p50 is reported."""
    runs = {1: 5 if quick else 15, 100: 2 if quick else 5}
    sid = api.create()
    out = {}
    shm = tempfile.mkdtemp(prefix="gb-bench-", dir="/dev/shm") if os.path.isdir("/dev/shm") else tempfile.mkdtemp()
    try:
        for mib, n in runs.items():
            blob = os.urandom(mib * MIB)
            digest = hashlib.sha256(blob).digest()
            path = f"/home/user/bench-{mib}m.bin"
            put, get, hput, hget = [], [], [], []
            for i in range(n + 1):  # the first run is a warm-up
                t0 = time.perf_counter_ns()
                info = json.loads(api.expect("PUT", f"/v1/sandboxes/{sid}/files?path={path}", None, 200, raw=blob))
                t1 = time.perf_counter_ns()
                back = api.expect("GET", f"/v1/sandboxes/{sid}/files?path={path}", None, 200)
                t2 = time.perf_counter_ns()
                if info.get("size") != len(blob) or hashlib.sha256(back).digest() != digest:
                    raise BenchError(f"files: {mib} MiB came back different ({len(back)} bytes)")
                del back
                hp = os.path.join(shm, "f")
                t3 = time.perf_counter_ns()
                with open(hp, "wb") as f:
                    f.write(blob)
                t4 = time.perf_counter_ns()
                with open(hp, "rb") as f:
                    hb = f.read()
                t5 = time.perf_counter_ns()
                del hb
                os.unlink(hp)
                if i == 0:
                    continue
                put.append((t1 - t0) / 1e6)
                get.append((t2 - t1) / 1e6)
                hput.append((t4 - t3) / 1e6)
                hget.append((t5 - t4) / 1e6)
            for name, ms in (("put", put), ("get", get), ("host_write", hput), ("host_read", hget)):
                s = summarize(ms)
                out[f"{name}_{mib}MiB"] = {"n": s["n"], "p50_ms": s["p50"], "max_ms": s["max"],
                                           "mib_per_s_p50": mib / (s["p50"] / 1000.0),
                                           "mib_per_s_min": mib / (s["max"] / 1000.0)}
    finally:
        api.destroy(sid)
        shutil.rmtree(shm, ignore_errors=True)
    return out


def syscall_phase(api, quick):
    """100k os.stat("/"), os.getppid() and os.stat(os.__file__) in /usr/bin/python3 inside a
    sandbox (exec) and on the host (subprocess), in pairs (which goes first alternates); each
    loop timed inside the process.

    The tax is the median of the pairs' ratios: this machine's speed drifts by up to 2x over
    seconds (one run's 20 stat loops spanned 78-158 ms), which the two halves of a pair share
    and unpaired medians do not; the ratio of the two p50s is reported beside it."""
    reps = 5 if quick else 40
    # The host run gets the environment and cwd the sandbox's command gets.
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": "/root", "USER": "root"}
    sid = api.create()
    res = {f"{side}_{what}": [] for side in ("inside", "outside") for what in SYSCALL_WHAT}

    def inside():
        return [float(x) for x in api.exec_out(sid, [PYTHON, "-c", SYSCALL_LOOP]).split()]

    def outside():
        p = subprocess.run([PYTHON, "-c", SYSCALL_LOOP], capture_output=True, text=True, check=True,
                           env=env, cwd="/")
        return [float(x) for x in p.stdout.split()]

    try:
        for i in range(reps + 1):  # the first pair is a warm-up
            if i % 2:
                o, n = outside(), inside()
            else:
                n, o = inside(), outside()
            if i == 0:
                continue
            for what, a, b in zip(SYSCALL_WHAT, n, o):
                res[f"inside_{what}"].append(a)
                res[f"outside_{what}"].append(b)
    finally:
        api.destroy(sid)
    out = {"calls": 100000, "reps": reps}
    for what in SYSCALL_WHAT:
        ins, outs = res[f"inside_{what}"], res[f"outside_{what}"]
        out[f"inside_{what}"], out[f"outside_{what}"] = summarize(ins), summarize(outs)
        i, o = out[f"inside_{what}"]["p50"], out[f"outside_{what}"]["p50"]
        out[f"tax_{what}_pct"] = (statistics.median(a / b for a, b in zip(ins, outs)) - 1) * 100
        out[f"tax_{what}_p50s_pct"] = (i / o - 1) * 100
        # The fastest run of each: what the noise of a shared machine cannot add to.
        out[f"tax_{what}_min_pct"] = (out[f"inside_{what}"]["min"] / out[f"outside_{what}"]["min"] - 1) * 100
        out[f"ns_per_call_inside_{what}"] = i * 1e6 / 100000
        out[f"ns_per_call_outside_{what}"] = o * 1e6 / 100000
    return out


def syscall_gvisor_phase(api, quick, bundle):
    """The syscall loop of `syscall_phase` in three places, in rounds (the order rotates):
    inside a sandbox with `isolation: gvisor` (exec), under `runsc run` of an OCI bundle
    directly (the same runsc, same platform, no Glovebox: the tier's own cost beside
    gVisor's), and on the host. Taxes are medians of the rounds' ratios to the host run."""
    # Under gVisor's ptrace platform a call costs microseconds: one round is about 15 s.
    reps = 3 if quick else 10
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": "/root", "USER": "root"}
    state = os.path.join(os.path.dirname(bundle), "runsc-syscall-state")
    os.makedirs(state, exist_ok=True)
    sid = api.create({"isolation": "gvisor", "timeout_s": 3600})
    sides = ("gvisor", "runsc", "host")
    res = {f"{side}_{what}": [] for side in sides for what in SYSCALL_WHAT}

    def gvisor():
        return [float(x) for x in api.exec_out(sid, [PYTHON, "-c", SYSCALL_LOOP]).split()]

    def runsc(i):
        argv = ["runsc", "--root", state, "--network=none", "run", "--bundle", bundle,
                f"gb-bench-sys-{os.getpid()}-{i}"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        return [float(x) for x in p.stdout.split()]

    def host():
        p = subprocess.run([PYTHON, "-c", SYSCALL_LOOP], capture_output=True, text=True, check=True,
                           env=env, cwd="/")
        return [float(x) for x in p.stdout.split()]

    try:
        for i in range(reps + 1):  # the first round is a warm-up
            run = {"gvisor": gvisor, "runsc": lambda: runsc(i), "host": host}
            got = {}
            for side in sides[i % 3:] + sides[:i % 3]:
                got[side] = run[side]()
            if i == 0:
                continue
            for side in sides:
                for what, v in zip(SYSCALL_WHAT, got[side]):
                    res[f"{side}_{what}"].append(v)
    finally:
        api.destroy(sid)
    out = {"calls": 100000, "reps": reps}
    for what in SYSCALL_WHAT:
        h = res[f"host_{what}"]
        out[f"host_{what}"] = summarize(h)
        out[f"ns_per_call_host_{what}"] = out[f"host_{what}"]["p50"] * 1e6 / 100000
        for side in ("gvisor", "runsc"):
            v = res[f"{side}_{what}"]
            out[f"{side}_{what}"] = summarize(v)
            out[f"ns_per_call_{side}_{what}"] = out[f"{side}_{what}"]["p50"] * 1e6 / 100000
            out[f"tax_{side}_{what}_pct"] = (statistics.median(a / b for a, b in zip(v, h)) - 1) * 100
        g, r = res[f"gvisor_{what}"], res[f"runsc_{what}"]
        out[f"glovebox_over_runsc_{what}_pct"] = (statistics.median(a / b for a, b in zip(g, r)) - 1) * 100
    return out


def make_python_bundle(bundle, workdir):
    """`bundle` with the syscall loop as its process (for `runsc run`)."""
    py = os.path.join(workdir, "bundle-py")
    os.makedirs(py)
    with open(os.path.join(bundle, "config.json")) as f:
        spec = json.load(f)
    spec["process"]["args"] = [PYTHON, "-c", SYSCALL_LOOP]
    spec["process"]["env"] = ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/root"]
    spec["process"]["cwd"] = "/"
    with open(os.path.join(py, "config.json"), "w") as f:
        json.dump(spec, f, indent=1)
    return py


def load_phase(api, clients, duration_s):
    """`clients` threads, each on its own connection, doing create -> exec true -> destroy
    until the deadline (an iteration under way finishes). Every sandbox made is destroyed."""
    cycles, creates, errors = [], [], []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client():
        a = api.clone()
        mine_c, mine_k, errs = [], [], 0
        start.wait()
        while time.monotonic() < deadline[0] and errs < 3:
            t0 = time.perf_counter_ns()
            try:
                sid = a.create()
            except BenchError as e:
                errs += 1
                with lock:
                    errors.append(str(e))
                continue
            t1 = time.perf_counter_ns()
            ok = True
            try:
                a.exec_true(sid)
            except BenchError as e:
                ok, errs = False, errs + 1
                with lock:
                    errors.append(str(e))
            finally:
                try:
                    a.destroy(sid)
                except BenchError as e:
                    ok, errs = False, errs + 1
                    with lock:
                        errors.append(str(e))
            if ok:
                mine_c.append(ms_since(t0))
                mine_k.append((t1 - t0) / 1e6)
        a.close()
        with lock:
            cycles.extend(mine_c)
            creates.extend(mine_k)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + duration_s
    t0 = time.monotonic()
    start.wait()
    for t in threads:
        t.join(timeout=duration_s + 120)
    wall = time.monotonic() - t0
    return {"clients": clients, "duration_s": duration_s, "wall_s": round(wall, 2), "cycles": len(cycles),
            "rate_per_s": len(cycles) / wall, "errors": len(errors), "first_errors": errors[:3],
            "cycle_ms": summarize(cycles), "create_ms": summarize(creates)}


def load_peer_bwrap(clients, duration_s):
    """The reference: `clients` threads spawning bwrap --unshare-all (ro /usr) true."""
    done, lock, errs = [], threading.Lock(), [0]
    deadline = time.monotonic() + duration_s

    def client():
        mine = []
        while time.monotonic() < deadline:
            ms, rc = run_once(BWRAP_MIN)
            if rc != 0:
                with lock:
                    errs[0] += 1
                break
            mine.append(ms)
        with lock:
            done.extend(mine)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration_s + 60)
    wall = time.monotonic() - t0
    return {"clients": clients, "duration_s": duration_s, "wall_s": round(wall, 2), "cycles": len(done),
            "rate_per_s": len(done) / wall, "errors": errs[0], "cycle_ms": summarize(done)}


class CpuWatch:
    """Who used the machine while a group or phase ran, in % of its capacity (ncpu x wall):
    `others` is the CPU time of processes outside this harness (this process, the daemons and
    everything below them), counted per process from /proc (a process that ended inside the
    span counts through its parent's cutime); `kernel` is the rest of the busy time in
    /proc/stat beyond ours and others' -- kernel threads, interrupts and deferred teardown
    work (much of it ours: freed namespaces, cgroups, mounts). On a shared machine this says
    which numbers were measured beside someone else's build."""

    def __init__(self, daemon_pids):
        self.roots = [os.getpid()] + [p for p in daemon_pids if p]
        self.spans = {}
        self.done = {}

    def _procs(self):
        procs = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # ppid, the 4 time fields (utime stime cutime cstime), starttime, flags (PF_KTHREAD)
            procs[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]), fields[19],
                             int(fields[6]) & 0x00200000 != 0)
        return procs

    def _ours(self, procs):
        kids = {}
        for pid, (ppid, *_rest) in procs.items():
            kids.setdefault(ppid, []).append(pid)
        ours, todo = set(), list(self.roots)
        while todo:
            pid = todo.pop()
            if pid in ours:
                continue
            ours.add(pid)
            todo += kids.get(pid, [])
        return ours

    def _now(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        procs = self._procs()
        return sum(v), sum(v) - v[3] - v[4], procs, self._ours(procs)

    def start(self, name):
        self.spans[name] = self._now()

    def stop(self, name):
        t0, b0, p0, ours0 = self.spans.pop(name)
        t1, b1, p1, ours1 = self._now()
        if t1 <= t0:
            return
        ours_t = others_t = 0
        for pid, (_ppid, cpu, start, kthread) in p1.items():
            before = p0.get(pid)
            d = cpu - before[1] if before and before[2] == start else cpu
            if kthread:
                continue
            if pid in ours1 or pid in ours0:
                ours_t += d
            else:
                others_t += d
        kernel_t = max(0, (b1 - b0) - ours_t - others_t)
        self.done[name] = {"others": round(others_t / (t1 - t0) * 100, 1),
                           "kernel": round(kernel_t / (t1 - t0) * 100, 1),
                           "ours": round(ours_t / (t1 - t0) * 100, 1)}

    def report(self):
        return self.done


HISTOGRAMS = {"create": "glovebox_create_seconds", "exec": "glovebox_exec_seconds", "code": "glovebox_code_seconds"}


def daemon_side(before, after):
    """Mean server-side time (the daemon's own /metrics histograms) between two snapshots:
    what the daemon spends on each operation, without HTTP and this client."""
    out = {}
    for what, h in HISTOGRAMS.items():
        n = after.get(f"{h}_count", 0) - before.get(f"{h}_count", 0)
        if n > 0:
            total = after.get(f"{h}_sum", 0) - before.get(f"{h}_sum", 0)
            out[what] = {"count": int(n), "mean_ms": total / n * 1000}
    return out


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])  # kB
    return out


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def descendants(pid):
    """Pids of every process below `pid`, with their Pss (kB) from smaps_rollup."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = {}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            pss = 0
            try:
                with open(f"/proc/{c}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            pss = int(line.split()[1])
            except OSError:
                pass
            out[c] = pss
            todo.append(c)
    return out


def cgroup_memory_kb(sid):
    """What the sandbox's memory cgroup is charged (v1 usage_in_bytes includes kernel memory
    the cgroup allocated; v2 memory.current), or None where it cannot be found."""
    for path in (f"/sys/fs/cgroup/memory/glovebox/{sid}/memory.usage_in_bytes",
                 f"/sys/fs/cgroup/glovebox/{sid}/memory.current",
                 f"/sys/fs/cgroup/unified/glovebox/{sid}/memory.current"):
        try:
            with open(path) as f:
                return int(f.read()) / 1024
        except (OSError, ValueError):
            continue
    return None


def mem_noise_kb(seconds=1.0):
    """How far MemAvailable moves by itself (other processes on the machine) over `seconds`."""
    seen = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        seen.append(meminfo()["MemAvailable"])
        time.sleep(0.05)
    return max(seen) - min(seen)


def density_phase(api, n, daemon_pid, deadline_s=180):
    """N idle sandboxes of 64 MiB: what each costs the daemon (RSS) and the machine
    (MemAvailable, with the kernel's own counters), then all destroyed and checked gone."""
    body = {"resources": {"memory_mb": 64}, "timeout_s": 1800, "metadata": {"bench": "density"}}
    time.sleep(0.5)
    noise = mem_noise_kb()
    m0, r0 = meminfo(), rss_kb(daemon_pid)
    kids0 = descendants(daemon_pid)
    ids, creates, failures = [], [], []
    t_end = time.monotonic() + deadline_s
    try:
        for _ in range(n):
            if time.monotonic() > t_end:
                failures.append(f"stopped at the {deadline_s} s bound")
                break
            t0 = time.perf_counter_ns()
            try:
                ids.append(api.create(body))
            except BenchError as e:
                failures.append(str(e))
                break
            creates.append(ms_since(t0))
        time.sleep(2.0)  # let the agents finish starting and the kernel settle
        m1, r1 = meminfo(), rss_kb(daemon_pid)
        kids1 = descendants(daemon_pid)
        charged = [cgroup_memory_kb(i) for i in ids]
        listed = set(api.list_ids())
        running = sum(1 for i in ids if i in listed)
        probe = api.exec_out(ids[len(ids) // 2], ["echo", "alive"]).strip() if ids else ""
    finally:
        destroys = wave2.destroy_timed(api, ids, failures)
    # The kernel frees a torn-down sandbox's memory lazily (RCU, dying cgroups, page cache):
    # wait, bounded, until MemAvailable is back within the noise of where it started.
    t_back = time.monotonic()
    slack = max(16 * 1024, 2 * noise)
    while True:
        time.sleep(0.5)
        m2 = meminfo()
        if m2["MemAvailable"] >= m0["MemAvailable"] - slack or time.monotonic() - t_back > 20:
            break
    back_s = time.monotonic() - t_back
    r2 = rss_kb(daemon_pid)
    kids2 = descendants(daemon_pid)
    left = [i for i in api.list_ids() if i in set(ids)]
    cgroups_left = sum(1 for i in ids if cgroup_memory_kb(i) is not None)
    k = max(1, len(ids))

    def delta(a, b, key):
        return b.get(key, 0) - a.get(key, 0)

    return {
        "requested": n, "created": len(ids), "running_listed": running, "probe_exec": probe,
        "failures": failures[:5],
        "create_ms": summarize(creates), "destroy_ms": summarize(destroys),
        "daemon_rss_kb": {"before": r0, "with_all": r1, "after_destroy": r2},
        "per_sandbox_kb": {
            "daemon_rss": (r1 - r0) / k,
            "mem_available": -delta(m0, m1, "MemAvailable") / k,
            "processes_pss": (sum(kids1.values()) - sum(kids0.values())) / k,
            "slab": delta(m0, m1, "Slab") / k,
            "kernel_stack": delta(m0, m1, "KernelStack") / k,
            "page_tables": delta(m0, m1, "PageTables") / k,
            "shmem": delta(m0, m1, "Shmem") / k,
            "cgroup_charged": (sum(charged) / k) if ids and None not in charged else None,
        },
        "mem_available_noise_1s_kb": noise,
        "processes_per_sandbox": (len(kids1) - len(kids0)) / k,
        "after_destroy": {"sandboxes_left": len(left), "processes_left": len(kids2) - len(kids0),
                          "memory_cgroups_left": cgroups_left,
                          "mem_available_not_returned_kb": -delta(m0, m2, "MemAvailable"),
                          "mem_available_back_after_s": round(back_s, 1),
                          "daemon_rss_growth_kb": r2 - r0},
    }


# ---------------------------------------------------------------------------- OCI bundle

def make_bundle(workdir):
    """An OCI bundle whose root is an empty read-only dir with the host /usr bind-mounted
    read-only and the usual merged-/usr symlinks: the same view bwrap's minimal run gets."""
    bundle = os.path.join(workdir, "bundle")
    rootfs = os.path.join(bundle, "rootfs")
    os.makedirs(os.path.join(rootfs, "usr"))
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.exists(f"/usr/{name}"):
            os.symlink(f"usr/{name}", os.path.join(rootfs, name))
    # `runc spec` writes the default (root, non-rootless) spec: new pid, net, ipc, uts and
    # mount namespaces, /proc, a minimal /dev, no capabilities beyond the default set.
    subprocess.run(["runc", "spec", "--bundle", bundle], check=True, capture_output=True)
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    spec["process"]["args"] = ["true"]
    spec["process"]["terminal"] = False
    spec["root"] = {"path": rootfs, "readonly": True}  # absolute: runsc resolves it itself
    spec["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr",
                           "options": ["rbind", "ro", "nosuid", "nodev"]})
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    return bundle


# ---------------------------------------------------------------------------- machine

def machine_info():
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    mem_kb = next((int(line.split()[1]) for line in read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal:")), 0)
    cpu = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    fstypes, fsopts = {}, {}
    for line in read("/proc/self/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 4:
            fstypes[parts[1]], fsopts[parts[1]] = parts[2], parts[3].split(",")
    root = fstypes.get("/sys/fs/cgroup")
    if root == "cgroup2":
        cg = "v2 (unified)"
    elif "/sys/fs/cgroup/unified" in fstypes:
        cg = "hybrid (v1 controllers, v2 mounted at /sys/fs/cgroup/unified with none)"
    elif root is not None:
        cg = "v1 (legacy)"
    else:
        cg = "unknown"
    # Whether a cgroup migration after a quiet spell waits for an RCU grace period (off) or
    # not (on): it moves every create that follows a pause (docs/benchmarks.md). On kernels
    # since 6.18 a flag turned off again leaves the cheaper lock on until a reboot.
    v2_at = next((m for m in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified") if fstypes.get(m) == "cgroup2"), None)
    if v2_at is not None:
        cg += "; favordynmods " + ("on" if "favordynmods" in fsopts[v2_at] else "off")
    os_name = next((line.split("=", 1)[1].strip('"') for line in read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), "")
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1048576, 1),
        "kernel": platform.release(),
        "os": os_name,
        "cgroup": cg,
        "python": platform.python_version(),
        "loadavg_at_start": read("/proc/loadavg").split()[:3],
    }


def git_rev(repo):
    try:
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--", "crates"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty(crates)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown"


# ---------------------------------------------------------------------------- report

ORDER = [
    ("api.create_exec_destroy", "Glovebox API, warm pool 0: create + exec true + destroy"),
    ("api.create", "  phase: create (POST /v1/sandboxes)"),
    ("api.exec_first", "  phase: first exec true"),
    ("api.destroy", "  phase: destroy (DELETE)"),
    ("pool.create_exec_destroy", "Glovebox API, warm pool 2: create + exec true + destroy"),
    ("pool.create", "  phase: create (a warm sandbox from the pool)"),
    ("pool.exec_first", "  phase: first exec true"),
    ("pool.destroy", "  phase: destroy (DELETE)"),
    ("pool.refill", "  off the request path: create returned -> pool full again"),
    ("api.exec_roundtrip", "Glovebox API: exec true in a live sandbox"),
    ("api.get_roundtrip", "  GET /v1/sandboxes/{id} (the HTTP + auth + JSON floor)"),
    ("api.run_code", "Glovebox API: run_code 1+1 in a warm python context"),
    ("api.exec_after_idle", f"Glovebox API: exec true in a live sandbox, after {IDLE_GAP_S * 1000:.0f} ms idle"),
    ("api.get_after_idle", f"  GET /v1/sandboxes/{{id}}, after {IDLE_GAP_S * 1000:.0f} ms idle"),
    ("peer.true_after_idle", f"  peer: true (fork/exec from Python), after {IDLE_GAP_S * 1000:.0f} ms idle"),
    ("cli.run_daemon", "glovebox run -- true (daemon, warm pool 0)"),
    ("cli.run_embedded", "glovebox run -- true (embedded)"),
    ("peer.bwrap", "bwrap --unshare-all (ro /usr) true"),
    ("peer.bwrap_host", "bwrap --unshare-all --bind / / true"),
    ("peer.unshare", "unshare --fork --pid --mount --net --uts --ipc --user true"),
    ("peer.runc", "runc run (ro /usr bundle) true"),
    ("peer.runsc", "runsc run (gVisor, ro /usr bundle) true"),
    ("gvisor.create_exec_destroy", "Glovebox API, isolation gvisor: create + exec true + destroy (warm pool 0)"),
    ("gvisor.create", "  phase: create (runsc start, agent answering)"),
    ("gvisor.exec_first", "  phase: first exec true"),
    ("gvisor.destroy", "  phase: destroy (DELETE)"),
    ("peer.true", "true (fork/exec from Python, baseline)"),
    ("code.plot_first_result", "code-interpreter, warm pool 2: create -> first PNG of the seed cell"),
    ("code.plot_create", "  phase: create (template code-interpreter)"),
    ("code.plot_cell", "  phase: the seed cell (POST .../code)"),
    ("code.plot_cell_again", "  the same cell again in that sandbox, pool full, machine quiet"),
    ("peer.host_plot_first", "host python, preloaded as the kernel is: the cell's first run (no sandbox)"),
    ("peer.host_plot_warm", "host python, preloaded: the cell's second run (no sandbox)"),
    ("peer.host_plot_cold", "host python3, the same cell from a cold start (imports included)"),
    ("code.cold_first_result", "code-interpreter, no warm sandbox (pool 0): create -> first PNG of the seed cell"),
    ("code.cold_create", "  phase: create (template code-interpreter; its kernel starts importing)"),
    ("code.cold_cell", "  phase: the seed cell (waits for the kernel's imports)"),
    ("code.zygote_first_result", "code-interpreter, code_zygote on (pool 0): create -> first PNG of the seed cell"),
    ("code.zygote_create", "  phase: create (its kernel forked from the template's zygote)"),
    ("code.zygote_cell", "  phase: the seed cell"),
    ("net.create_deny_all", "create, network deny-all (warm pool 0)"),
    ("net.create_allow_list", "create, network allow-list 198.51.100.0/24 (warm pool 0)"),
    ("net.destroy_deny_all", "destroy, network deny-all"),
    ("net.destroy_allow_list", "destroy, network allow-list"),
    ("vol.create_none", "create, no volume (warm pool 0)"),
    ("vol.create_one", "create, one volume at /data, mounted on the host afresh (warm pool 0)"),
    ("vol.create_disk_2gib", "create, a disk-backed 2 GiB disk (ext4 image made at create; warm pool 0)"),
    ("snap.snapshot_100mib", "snapshot of a sandbox's 100 MiB of files (freeze, copy, hash, thaw)"),
    ("snap.fork_10", "fork into 10 children (its snapshot + 10 creates on it)"),
    ("snap.fork_per_child", "  per child (fork_10 / 10)"),
    ("peer.cp_a_100mib", "cp -a of 100 MiB (10 files) from /dev/shm to the work dir (no sandbox)"),
]
RATIO_OF = {"api.create_exec_destroy": "warm pool 0", "pool.create_exec_destroy": "warm pool 2"}


def fmt(x):
    if x != x:  # NaN
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def sorted_rows(results):
    labels = dict(ORDER)
    order = [k for k, _ in ORDER]
    b = results["benchmarks"]
    return [(k, labels.get(k, k), b[k]) for k in sorted(b, key=lambda k: order.index(k) if k in order else 99)]


def table(results):
    rows = sorted_rows(results)
    lines = []
    if rows:
        w = max(len(name) for _, name, _ in rows)
        lines.append(f"{'benchmark':<{w}}  {'n':>4}  {'p50':>8}  {'p95':>8}  {'p99':>8}  {'mean':>8}   (ms)")
        for _, name, r in rows:
            lines.append(f"{name:<{w}}  {r['n']:>4}  {fmt(r['p50']):>8}  {fmt(r['p95']):>8}  "
                         f"{fmt(r['p99']):>8}  {fmt(r['mean']):>8}")
    for what, ratios in results["ratios"].items():
        lines += ["", f"Glovebox create+exec+destroy ({RATIO_OF.get(what, what)}) p50 / peer p50:"]
        lines += [f"  vs {k:<22} {v:6.2f}x" for k, v in ratios.items()]
    for section in section_lines(results):
        lines += [""] + section
    if results["unavailable"]:
        lines += ["", "Not measured:"]
        lines += [f"  {k}: {v}" for k, v in results["unavailable"].items()]
    lines += ["", "Targets:"]
    for t in results["targets"]:
        lines.append(f"  [{'met ' if t['met'] else 'MISS'}] {t['target']}: measured {t['measured']}")
    if results.get("wave2"):
        lines += ["", wave2.text(results["wave2"])]
    return "\n".join(lines)


def section_lines(results):
    """Plain-text lines of the non-latency phases (the Markdown uses the same rows)."""
    return [[" | ".join(row) for row in sec] for sec in section_rows(results)]


def section_rows(results):
    out = []
    dm = results.get("daemon_side_main_group")
    if dm:
        rows = [("daemon-side mean over the main rounds (/metrics)", "operation", "count", "mean ms")]
        for label, ops in dm.items():
            for what, r in ops.items():
                rows.append((f"warm pool {label[4]}", what, str(r["count"]), fmt(r["mean_ms"])))
        out.append(rows)
    f = results.get("files")
    if f:
        rows = [("file transfer", "size", "n", "p50 ms", "MiB/s (p50)", "MiB/s (slowest)")]
        for key, label in (("put", "PUT /files (upload)"), ("get", "GET /files (download)"),
                           ("host_write", "host: write to /dev/shm from Python"),
                           ("host_read", "host: read from /dev/shm from Python")):
            for mib in (1, 100):
                r = f.get(f"{key}_{mib}MiB")
                if r:
                    rows.append((label, f"{mib} MiB", str(r["n"]), fmt(r["p50_ms"]), f"{r['mib_per_s_p50']:.0f}",
                                 f"{r['mib_per_s_min']:.0f}"))
        out.append(rows)
    s = results.get("syscall")
    if s:
        rows = [(f"100k calls in /usr/bin/python3 ({s['reps']} pairs)", "inside p50 ms", "outside p50 ms",
                 "inside ns/call", "outside ns/call", "tax (median of pairs)", "tax (ratio of p50s)",
                 "tax (fastest runs)")]
        for what, label in (("stat", 'os.stat("/")'), ("getppid", "os.getppid()"),
                            ("stat_usr", "os.stat(os.__file__) (/usr/lib/python3.11/os.py)")):
            if f"inside_{what}" not in s:
                continue
            rows.append((label, fmt(s[f"inside_{what}"]["p50"]), fmt(s[f"outside_{what}"]["p50"]),
                         f"{s[f'ns_per_call_inside_{what}']:.0f}", f"{s[f'ns_per_call_outside_{what}']:.0f}",
                         f"{s[f'tax_{what}_pct']:+.1f} %", f"{s.get(f'tax_{what}_p50s_pct', s[f'tax_{what}_pct']):+.1f} %",
                         f"{s[f'tax_{what}_min_pct']:+.1f} %"))
        out.append(rows)
    g = results.get("syscall_gvisor")
    if g:
        rows = [(f"100k calls in /usr/bin/python3, gVisor ({g['reps']} rounds)", "gvisor sandbox ns/call",
                 "runsc run ns/call", "host ns/call", "tax: sandbox vs host", "tax: runsc run vs host",
                 "sandbox vs runsc run")]
        for what, label in (("stat", 'os.stat("/")'), ("getppid", "os.getppid()"),
                            ("stat_usr", "os.stat(os.__file__)")):
            if f"gvisor_{what}" not in g:
                continue
            rows.append((label, f"{g[f'ns_per_call_gvisor_{what}']:.0f}", f"{g[f'ns_per_call_runsc_{what}']:.0f}",
                         f"{g[f'ns_per_call_host_{what}']:.0f}", f"{g[f'tax_gvisor_{what}_pct']:+.0f} %",
                         f"{g[f'tax_runsc_{what}_pct']:+.0f} %", f"{g[f'glovebox_over_runsc_{what}_pct']:+.1f} %"))
        out.append(rows)
    ld = results.get("load")
    if ld:
        rows = [("sustained create -> exec true -> destroy", "clients", "cycles/s", "cycle p50", "p95", "p99",
                 "create p50", "create p99", "errors")]
        for key, r in ld.items():
            label = {"pool0": "warm pool 0", "pool2": "warm pool 2", "bwrap": "peer: bwrap --unshare-all true"}[
                key.split(".")[0]]
            c = r["cycle_ms"]
            k = r.get("create_ms")
            rows.append((label, str(r["clients"]), f"{r['rate_per_s']:.0f}", fmt(c["p50"]), fmt(c["p95"]),
                         fmt(c["p99"]), fmt(k["p50"]) if k else "-", fmt(k["p99"]) if k else "-", str(r["errors"])))
        out.append(rows)
    gr = results.get("growth")
    if gr:
        out.append(wave2.growth_rows(gr))
    cm, cz = results.get("code_memory"), results.get("code_memory_zygote")
    if cm or cz:
        rows = [("code-interpreter sandbox after the seed cell (no warm sandbox)", "n", "p50 MiB", "max MiB")]
        for label, m in (("its memory cgroup's charge", cm), ("the same, code_zygote on", cz)):
            if m:
                rows.append((label, str(m["n"]), f"{m['p50'] / 1024:.1f}", f"{m['max'] / 1024:.1f}"))
        out.append(rows)
    d = results.get("density")
    if d:
        p = d["per_sandbox_kb"]
        a = d["after_destroy"]
        rows = [("density", "value")]
        r = d["daemon_rss_kb"]
        rows += [("idle 64 MiB sandboxes created / running", f"{d['created']} / {d['running_listed']} "
                  f"(of {d['requested']})"),
                 ("create p50 / p99 while they pile up", f"{fmt(d['create_ms']['p50'])} / {fmt(d['create_ms']['p99'])} ms"),
                 ("daemon RSS growth per sandbox", f"{p['daemon_rss']:.0f} KiB (RSS {r['before'] / 1024:.1f} -> "
                  f"{r['with_all'] / 1024:.1f} MiB)"),
                 ("MemAvailable drop per sandbox", f"{p['mem_available']:.0f} KiB (MemAvailable moved by "
                  f"{d['mem_available_noise_1s_kb'] / 1024:.0f} MiB in 1 s by itself before the test)"),
                 ("memory cgroup charge per sandbox (its processes, tmpfs, kernel objects)",
                  "-" if p.get("cgroup_charged") is None else f"{p['cgroup_charged']:.0f} KiB"),
                 ("  of which: the sandbox's processes (Pss)", f"{p['processes_pss']:.0f} KiB "
                  f"({d['processes_per_sandbox']:.1f} processes)"),
                 ("  kernel: slab / kernel stacks / page tables", f"{p['slab']:.0f} / {p['kernel_stack']:.0f} / "
                  f"{p['page_tables']:.0f} KiB"),
                 ("  shmem (tmpfs: writable layers, /dev/shm)", f"{p['shmem']:.0f} KiB"),
                 ("after destroying all: sandboxes / processes / memory cgroups left",
                  f"{a['sandboxes_left']} / {a['processes_left']} / {a.get('memory_cgroups_left', '-')}"),
                 ("after destroying all: MemAvailable below where it started",
                  f"{a['mem_available_not_returned_kb'] / 1024:.1f} MiB after {a.get('mem_available_back_after_s', 2):g} s"),
                 ("after destroying all: daemon RSS growth", f"{a['daemon_rss_growth_kb'] / 1024:.1f} MiB")]
        out.append(rows)
    return out


def markdown(results):
    """The same tables in Markdown, for pasting into docs/benchmarks.md."""
    lines = ["| benchmark | n | p50 | p95 | p99 | mean |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, label, r in sorted_rows(results):
        name = label.strip().replace("|", "/")
        name = ("&nbsp;&nbsp;" + name) if label.startswith("  ") else name
        if k in RATIO_OF:
            name = f"**{name}**"
        lines.append(f"| {name} | {r['n']} | {fmt(r['p50'])} | {fmt(r['p95'])} | {fmt(r['p99'])} | {fmt(r['mean'])} |")
    labels = dict(ORDER)
    if results["ratios"]:
        peers = list(dict.fromkeys(p for r in results["ratios"].values() for p in r))
        whats = list(results["ratios"])
        lines += ["", "| create+exec+destroy p50 vs | " + " | ".join(RATIO_OF.get(w, w) for w in whats) + " |",
                  "| --- |" + " ---: |" * len(whats)]
        for p in peers:
            cells = [f"{results['ratios'][w][p]:.2f}x" if p in results["ratios"][w] else "-" for w in whats]
            lines.append(f"| {labels.get('peer.' + p, p)} | " + " | ".join(cells) + " |")
    for sec in section_rows(results):
        lines += ["", "| " + " | ".join(sec[0]) + " |", "| --- |" + " ---: |" * (len(sec[0]) - 1)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in sec[1:]]
    cpu = results["machine"].get("cpu_pct")
    if cpu:
        lines += ["", "| CPU while it ran, % of the machine | " + " | ".join(cpu) + " |",
                  "| --- |" + " ---: |" * len(cpu)]
        for who, label in (("ours", "this harness (client, daemons, sandboxes, peers)"),
                           ("others", "other processes on the machine"),
                           ("kernel", "kernel threads, interrupts (incl. deferred teardown)")):
            lines.append(f"| {label} | " + " | ".join(f"{v[who]:g}" for v in cpu.values()) + " |")
    lines += ["", "| target | measured | |", "| --- | --- | --- |"]
    lines += [f"| {t['target']} | {t['measured']} | {'met' if t['met'] else '**missed**'} |"
              for t in results["targets"]]
    if results.get("wave2"):
        lines += ["", wave2.markdown(results["wave2"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def evaluate_targets(results):
    b, ratios = results["benchmarks"], results["ratios"]
    out = []

    def add(target, measured, met):
        out.append({"target": target, "measured": measured, "met": bool(met)})

    def ms_target(what, key, limit):
        r = b.get(key)
        if r:
            p50 = r["p50"]
            add(f"{what} p50 <= {limit:g} ms", f"{p50:.2f} ms"
                + ("" if p50 <= limit else f" ({p50 / limit:.1f}x the target)"), p50 <= limit)

    for key, pool in RATIO_OF.items():
        ms_target(f"create+exec true+destroy, {pool},", key, TARGET_CED_P50_MS)
        r = ratios.get(key, {}).get("bwrap")
        if r is not None:
            add(f"create+exec true+destroy, {pool}, p50 <= {TARGET_CED_VS_BWRAP:g}x bwrap --unshare-all true",
                f"{r:.2f}x", r <= TARGET_CED_VS_BWRAP)
    ms_target("create, warm pool 2,", "pool.create", TARGET_POOL_CREATE_P50_MS)
    ms_target("exec round trip", "api.exec_roundtrip", TARGET_EXEC_P50_MS)
    ms_target("pause (freezer)", "api.pause", TARGET_PAUSE_P50_MS)
    ms_target("resume (freezer)", "api.resume", TARGET_PAUSE_P50_MS)
    ms_target("run_code 1+1 round trip (warm context)", "api.run_code", TARGET_RUN_CODE_P50_MS)
    ms_target("code-interpreter create -> first plot result (warm pool)", "code.plot_first_result", TARGET_PLOT_P50_MS)
    for key, r in results.get("load", {}).items():
        if key.startswith("pool"):
            pool = "warm pool " + key[4]
            rate = r["rate_per_s"]
            add(f"sustained create+exec+destroy, {r['clients']} clients, {pool}, >= {TARGET_RATE_PER_S:g}/s",
                f"{rate:.1f}/s" + ("" if rate >= TARGET_RATE_PER_S else f" ({rate / TARGET_RATE_PER_S:.2f}x the target)")
                + (f", {r['errors']} errors" if r["errors"] else ""), rate >= TARGET_RATE_PER_S and not r["errors"])
    s = results.get("syscall")
    if s:
        tax = s["tax_stat_pct"]
        add(f"100k os.stat(\"/\") in python3, inside vs outside, tax (median of pairs) <= {TARGET_SYSCALL_TAX_PCT:g} %",
            f"{tax:+.1f} % (ratio of p50s: {s.get('tax_stat_p50s_pct', tax):+.1f} %, fastest runs: "
            f"{s['tax_stat_min_pct']:+.1f} %)", tax <= TARGET_SYSCALL_TAX_PCT)
    for k in ("api.create_exec_destroy", "pool.create_exec_destroy", "api.exec_roundtrip"):
        if k in b:
            t = b[k]["p99"] / b[k]["p50"]
            add(f"{k} p99 <= {TARGET_TAIL_RATIO:g}x p50", f"{t:.2f}x", t <= TARGET_TAIL_RATIO)
    return out


# ---------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="daemon with --warm-pool 0 (loopback); without it the API benchmarks are skipped")
    ap.add_argument("--pool-url", help="daemon with a warm pool (loopback), for pool.*, code.plot and load.pool2")
    ap.add_argument("--zygote-url", help="daemon with --warm-pool 0 and code_zygote on (loopback), for code.zygote")
    ap.add_argument("--pool-size", type=int, default=2, help="the --warm-pool of the --pool-url daemon")
    ap.add_argument("--templates-dir", help="where the code-interpreter template is built (the pool daemon's "
                    "GLOVEBOX_TEMPLATES_DIR); without it the code-interpreter benchmarks are skipped")
    ap.add_argument("--daemon-pid", type=int, help="pid of the --url daemon (density: its RSS, its processes)")
    ap.add_argument("--pool-daemon-pid", type=int, help="pid of the --pool-url daemon (to tell its CPU from others')")
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    ap.add_argument("--glovebox", help="path to the glovebox binary (for the CLI benchmarks)")
    ap.add_argument("--n", type=int, help="iterations per benchmark (default 200; 30 with --quick)")
    ap.add_argument("--cli-n", type=int, help="iterations of the CLI benchmarks (default 30; 10 with --quick)")
    ap.add_argument("--plot-n", type=int, help="iterations of code.plot_first_result (default 10; 3 with --quick)")
    ap.add_argument("--net-n", type=int, help="iterations of the network-policy creates (default 40; 10 with --quick)")
    ap.add_argument("--load-s", type=float, help="seconds per sustained-load run (default 10; 3 with --quick)")
    ap.add_argument("--density", type=int, help="idle sandboxes for the density phase (default 200; 50 with "
                    "--quick; 0 skips it)")
    ap.add_argument("--growth", type=int, help="live sandboxes the growth curve reaches (default 1000; 100 with "
                    "--quick; 0 skips it)")
    ap.add_argument("--summary", metavar="JSON", help="no benchmarks: add issue 27's table to the results in JSON "
                    "(with --egress-results, the egress rows too), rewrite it and its .md, print the table")
    ap.add_argument("--egress-results", metavar="JSON", help="bench/egress.py's results of the same run")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sequential", action="store_true",
                    help="run each benchmark to the end before the next (default: interleaved rounds)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "latest.json"))
    ap.add_argument("--only", default="", help="comma-separated benchmark prefixes to run (e.g. api,peer.bwrap,"
                    "pool,code,code.cold,net,files,syscall,gvisor,load,density,growth)")
    a = ap.parse_args()
    if a.summary:
        return summary(a.summary, a.egress_results)
    n = a.n or (30 if a.quick else 200)
    cli_n = a.cli_n or (10 if a.quick else 30)
    plot_n = a.plot_n or (3 if a.quick else 10)
    net_n = a.net_n or (10 if a.quick else 40)
    load_s = a.load_s or (3.0 if a.quick else 10.0)
    density_n = a.density if a.density is not None else (50 if a.quick else 200)
    growth_n = a.growth if a.growth is not None else (100 if a.quick else 1000)
    only = [p for p in a.only.split(",") if p]

    def wanted(name):
        return not only or any(name.startswith(p) for p in only)

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {
        "schema": 2,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "glovebox_rev": git_rev(repo),
        "machine": machine_info(),
        "settings": {"n": n, "cli_n": cli_n, "plot_n": plot_n, "net_n": net_n, "load_s": load_s,
                     "density": density_n, "growth": growth_n, "warmup": a.warmup, "quick": a.quick, "pool_size": a.pool_size,
                     "order": "sequential" if a.sequential else "interleaved"},
        "versions": {},
        "benchmarks": {},
        "samples_ms": {},
        "ratios": {},
        "unavailable": {},
        "targets": [],
        "hosted_published_median_s": HOSTED_PUBLISHED_S,
    }
    failed = {}
    benches = []
    unavailable = results["unavailable"]
    wall0 = time.monotonic()

    def add(name, n_, warmup, step, setup=None, teardown=None, group="main", force=False):
        if force or wanted(name):
            benches.append(Bench(name, n_, warmup, step, setup, teardown, group))

    api = Api(a.url, a.key) if a.url else None
    papi = Api(a.pool_url, a.key) if a.pool_url else None
    site = code_interpreter_site(a.templates_dir) if a.templates_dir else None
    pool_want = a.pool_size * (2 if site else 1)
    if papi is not None and a.pool_size > 0:
        # Nothing is measured while the pool daemon is still booting its pool (the
        # code-interpreter kernels import pandas and matplotlib: seconds of CPU).
        t = time.monotonic()
        try:
            papi.wait_warm(pool_want, 120, poll_s=0.1)
            results["settings"]["pool_ready_s"] = round(time.monotonic() - t, 1)
        except BenchError as e:
            print(f"  warm pool: {e}", file=sys.stderr)

    # Glovebox through the two daemons.
    if api is None:
        for k in ("api.*", "cli.run_daemon", "net.*", "files", "syscall", "load", "density"):
            unavailable[k] = "no --url given"
    else:
        add("api.create_exec_destroy", n, a.warmup, ced_step(api, "api"))
        live_sb = LiveSandbox(api)
        add("api.exec_roundtrip", n, a.warmup, live_sb.step, live_sb.setup, live_sb.teardown)
        code_sb = LiveSandbox(api.clone(), code=True)
        add("api.run_code", n, a.warmup, code_sb.step, code_sb.setup, code_sb.teardown)
        paused = PausedSandbox(api.clone())
        add("api.pause_resume", n, a.warmup, paused.step, paused.setup, paused.live.teardown)
        # Its own group: interleaved with the others, the gaps would not be quiet.
        idle = AfterIdle(api.clone())
        add("api.exec_after_idle", max(15, n // 2), min(a.warmup, 5), idle.step, idle.live.setup,
            idle.live.teardown, group="idle")
    if papi is None or a.pool_size == 0:
        unavailable["pool.*"] = "no --pool-url daemon with a warm pool"
    else:
        add("pool.create_exec_destroy", n, a.warmup, ced_step(papi, "pool", pool_want))

    # The CLI: one process per run, against the daemon and embedded.
    work = tempfile.mkdtemp(prefix="glovebox-bench-")
    if a.glovebox:
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("GLOVEBOX_")}
        argv = [a.glovebox, "run", "--", "true"]
        if api is not None:
            env_d = dict(base_env, GLOVEBOX_URL=a.url, GLOVEBOX_API_KEY=a.key)
            add("cli.run_daemon", cli_n, min(a.warmup, 3), cmd_step("cli.run_daemon", lambda i: argv, env_d))
        env_e = dict(base_env, GLOVEBOX_DATA_DIR=os.path.join(work, "embedded-data"))
        add("cli.run_embedded", cli_n, min(a.warmup, 3), cmd_step("cli.run_embedded", lambda i: argv, env_e))
    else:
        unavailable["cli.*"] = "no --glovebox binary given"

    # Peers, each probed once first: one that cannot run here is reported, not fatal.
    def peer(name, argv_fn, missing=None, group="main"):
        if not wanted(name):
            return
        if missing:
            unavailable[name] = missing
        elif works(argv_fn("probe")):
            add(name, n, a.warmup, cmd_step(name, argv_fn), group=group)
        else:
            unavailable[name] = f"failed here: {diagnose(argv_fn('probe'))}"

    have_bwrap = shutil.which("bwrap")
    if have_bwrap:
        results["versions"]["bwrap"] = tool_version(["bwrap", "--version"])
    peer("peer.bwrap", lambda i: BWRAP_MIN, None if have_bwrap else "bwrap not installed (Debian: bubblewrap)")
    peer("peer.bwrap_host", lambda i: BWRAP_HOST, None if have_bwrap else "bwrap not installed (Debian: bubblewrap)")
    if shutil.which("unshare"):
        results["versions"]["unshare"] = tool_version(["unshare", "--version"])
    peer("peer.unshare", lambda i: UNSHARE, None if shutil.which("unshare") else "unshare not installed")
    peer("peer.true", lambda i: ["true"])

    # The code-interpreter plot, with its host peers, in a group of its own; beside it the
    # same cell with no warm sandbox (the pool-0 daemon, which has the template too), whose
    # peer is the host's cold python.
    cold = None
    if papi is not None and a.pool_size > 0 and site:
        add("code.plot_first_result", plot_n, 1, plot_step(papi, pool_want, 0.5), group="plot")
    elif wanted("code.plot"):
        unavailable["code.plot_first_result"] = ("no code-interpreter template (bench/run builds it with "
                                                 "scripts/build-code-interpreter) or no warm-pool daemon")
    if api is not None and site and wanted("code.cold"):
        cold = wave2.ColdCode(api.clone(), SEED, check_seed, cgroup_memory_kb, warmup=1)
        add("code.cold_first_result", plot_n, 1, cold.step, group="plot")
    elif wanted("code.cold"):
        unavailable["code.cold_first_result"] = "no code-interpreter template or no pool-0 daemon"
    zygote = None
    if a.zygote_url and site and wanted("code.zygote"):
        zapi = Api(a.zygote_url, a.key)
        # Its first create starts the zygote (about a second, once per tenant and template):
        # the warm-up iteration takes it.
        zygote = wave2.ColdCode(zapi, SEED, check_seed, cgroup_memory_kb, warmup=1, prefix="code.zygote")
        add("code.zygote_first_result", plot_n, 1, zygote.step, None, zapi.close, group="plot")
    elif wanted("code.zygote") and a.zygote_url:
        unavailable["code.zygote_first_result"] = "no code-interpreter template"
    if site:
        # The host peers come with the plot and the cold cell (as bwrap comes with the API rows).
        with_plot = wanted("code.plot") and papi is not None and a.pool_size > 0
        hp = HostPlot(site)
        add("peer.host_plot_first", max(3, plot_n // 2), 1, hp.step, None, hp.teardown, group="plot", force=with_plot)
        add("peer.host_plot_cold", max(2, plot_n // 3) if cold is None else plot_n, 1, hp.cold_step, group="plot",
            force=with_plot or cold is not None or zygote is not None)

    # Network policy cost: deny-all against an allow-list, interleaved, in a group of their own
    # (an allow-list create makes a veth and nftables rules over netlink; the kernel frees a
    # veth asynchronously).
    if api is not None:
        add("net.create_deny_all", net_n, 3, net_step(api, "deny_all", {"mode": "deny-all"}), group="net")
        add("net.create_allow_list", net_n, 3,
            net_step(api, "allow_list", {"mode": "allow-list", "allow": ["198.51.100.0/24"]}), group="net")
        # Volume cost: the same create with and without a volume, interleaved, in a group of
        # their own (the volume is made before and deleted after).
        vc = VolumeCreate(api)
        add("vol.create_none", net_n, 3, vc.step_for("none", {}), group="vol")
        add("vol.create_one", net_n, 3, vc.step_for("one", {"volumes": [{"name": vc.NAME, "path": "/data"}]}),
            vc.setup, vc.teardown, group="vol")
        # A disk-backed writable layer (disk_mb beyond the memory budget: an ext4 image made
        # at create) beside the same memory with the in-memory disk (the none row: defaults).
        add("vol.create_disk_2gib", net_n, 3, vc.step_for("disk_2gib", {"resources": {"disk_mb": 2048}}), group="vol")
        # Snapshot and fork of 100 MiB beside cp -a of the same sizes, in a group of their own.
        if wanted("snap") or wanted("peer.cp_a"):
            sb = SnapshotBench(api.clone(), work)
            snap_n = max(3, net_n // 4)
            add("snap.snapshot_100mib", snap_n, 1, sb.snapshot_step, sb.setup, None, group="snap", force=True)
            add("snap.fork_10", snap_n, 1, sb.fork_step, group="snap", force=True)
            add("peer.cp_a_100mib", snap_n, 1, sb.cp_step, None, sb.teardown, group="snap", force=True)

    bundle, bundle_err = None, "runc not installed (Debian package runc; its `runc spec` makes the bundle)"
    if shutil.which("runc"):
        try:
            bundle = make_bundle(work)
        except (OSError, subprocess.CalledProcessError, KeyError) as e:
            bundle_err = f"could not make an OCI bundle: {e}"
    for tool, extra in (("runc", []), ("runsc", ["--network=none"])):
        missing = None
        if not shutil.which(tool):
            missing = f"{tool} not installed (Debian package {tool})"
        elif bundle is None:
            missing = bundle_err
        else:
            results["versions"][tool] = tool_version([tool, "--version"])
            os.makedirs(os.path.join(work, f"{tool}-state"))
        if tool == "runsc" and api is not None:
            # The gVisor tier beside runsc run directly, in the same group (both leave gVisor's
            # sandbox and gofer processes to end after the iteration).
            add("gvisor.create_exec_destroy", n, a.warmup, ced_step(api, "gvisor", body={"isolation": "gvisor"}),
                group="runsc", force=wanted("peer.runsc"))

        def argv_of(i, tool=tool, extra=extra):
            # A private state dir, and `run` without --detach deletes the container when
            # `true` exits, so nothing outlives the run.
            return [tool, "--root", os.path.join(work, f"{tool}-state"), *extra, "run",
                    "--bundle", bundle or "", f"gb-bench-{os.getpid()}-{i}"]
        peer(f"peer.{tool}", argv_of, missing, group=tool)

    phase_s = {}

    def phase(name, fn):
        if not wanted(name):
            return
        t = time.monotonic()
        print(f"  {name} ...", file=sys.stderr, flush=True)
        cpu.start(name)
        try:
            results[name] = fn()
        except (BenchError, OSError, subprocess.CalledProcessError, ValueError) as e:
            failed[name] = str(e)
            print(f"  {name}: FAILED: {e}", file=sys.stderr, flush=True)
        cpu.stop(name)
        phase_s[name] = round(time.monotonic() - t, 1)

    def load_all():
        out = {}
        for label, client in (("pool0", api), ("pool2", papi)):
            if client is None:
                continue
            for c in (8, 32):
                if label == "pool2":
                    client.wait_warm(pool_want, 60, poll_s=0.05)
                out[f"{label}.c{c}"] = load_phase(client, c, load_s)
                time.sleep(0.5)
        if have_bwrap:
            out["bwrap.c8"] = load_peer_bwrap(8, load_s / 2)
        if papi is not None and a.pool_size > 0:
            papi.wait_warm(pool_want, 60, poll_s=0.05)  # no refill under the next phase
        return out

    snaps, daemon_ms = {}, {}
    cpu = CpuWatch([a.daemon_pid, a.pool_daemon_pid])

    def before_group(g):
        cpu.start(g)
        if g == "main":
            for label, c in (("pool0", api), ("pool2", papi)):
                if c is not None:
                    snaps[label] = c.metrics()

    def after_group(g):
        cpu.stop(g)
        if g == "main":
            for label, c in (("pool0", api), ("pool2", papi)):
                if c is not None and label in snaps:
                    daemon_ms[label] = daemon_side(snaps[label], c.metrics())
            results["daemon_side_main_group"] = daemon_ms

    t0 = time.monotonic()
    try:
        ran = schedule(benches, not a.sequential, failed, before_group, after_group)
        if api is not None:
            phase("files", lambda: files_phase(api, a.quick))
            phase("syscall", lambda: syscall_phase(api, a.quick))
            if bundle is not None and shutil.which("runsc"):
                py_bundle = make_python_bundle(bundle, work)
                phase("syscall_gvisor", lambda: syscall_gvisor_phase(api, a.quick, py_bundle))
            elif wanted("syscall_gvisor"):
                unavailable["syscall_gvisor"] = "runsc or an OCI bundle missing"
            phase("load", load_all)
            if density_n > 0 and a.daemon_pid:
                phase("density", lambda: density_phase(api, density_n, a.daemon_pid))
            elif wanted("density"):
                unavailable["density"] = "skipped (--density 0)" if density_n <= 0 else "no --daemon-pid given"
            if growth_n > 0:
                levels = sorted({lv for lv in (wave2.GROWTH_LEVELS_QUICK if a.quick else wave2.GROWTH_LEVELS)
                                 if lv < growth_n} | {growth_n})
                phase("growth", lambda: wave2.growth_phase(api, levels, 90 if a.quick else 420, summarize, meminfo,
                                                           cgroup_memory_kb))
            elif wanted("growth"):
                unavailable["growth"] = "skipped (--growth 0)"
    finally:
        safe_rmtree(work)
        for c in (api, papi):
            if c is not None:
                c.close()
    results["settings"]["wall_s"] = round(time.monotonic() - t0, 1)
    results["machine"]["cpu_pct"] = cpu.report()
    results["settings"]["phase_s"] = phase_s
    for name, why in failed.items():
        unavailable[name] = f"failed: {why}"
    for b in ran:
        if b.name in failed:
            continue
        for k, samples in b.samples.items():
            results["benchmarks"][k] = summarize(samples)
            results["samples_ms"][k] = [round(x, 4) for x in samples]
        print(f"  {b.name:<26} {b.elapsed_s:6.1f} s", file=sys.stderr)
    for k, v in phase_s.items():
        print(f"  {k:<26} {v:6.1f} s", file=sys.stderr)

    try:
        with open("/proc/loadavg") as f:
            results["machine"]["loadavg_at_end"] = f.read().split()[:3]
    except OSError:
        pass
    b = results["benchmarks"]
    for what in RATIO_OF:
        if what in b:
            ced50 = b[what]["p50"]
            results["ratios"][what] = {k[len("peer."):]: ced50 / v["p50"] for k, v in b.items()
                                       if k.startswith("peer.") and not k.startswith("peer.host_plot")
                                       and not k.endswith("_after_idle") and v["p50"] > 0}
    if cold is not None and cold.mem_kib:
        results["code_memory"] = summarize(cold.mem_kib)
    if zygote is not None and zygote.mem_kib:
        results["code_memory_zygote"] = summarize(zygote.mem_kib)
    results["targets"] = evaluate_targets(results)
    # bench/run adds the egress rows once bench/egress.py has run (`--summary`).
    results["wave2"] = wave2.rows(results)
    results["settings"]["total_s"] = round(time.monotonic() - wall0, 1)

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    md = os.path.splitext(a.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown(results))
    print()
    print(f"Glovebox {results['glovebox_rev']} on {results['machine']['nproc']} CPUs, "
          f"{results['machine']['memory_gib']} GiB, kernel {results['machine']['kernel']}, "
          f"cgroup {results['machine']['cgroup']}; load average "
          f"{' '.join(results['machine']['loadavg_at_start'])} at start, "
          f"{' '.join(results['machine'].get('loadavg_at_end', []))} at end")
    print("CPU while each group ran, % of the machine (this harness / other processes / kernel threads "
          "and interrupts): " + ", ".join(f"{k} {v['ours']:g}/{v['others']:g}/{v['kernel']:g}"
                                          for k, v in results["machine"]["cpu_pct"].items()))
    print(table(results))
    print(f"\nJSON: {a.out}\nMarkdown tables: {md}")
    # Glovebox's own benchmarks must run; a peer that could not is reported, not fatal.
    return 1 if any(not f.startswith("peer.") for f in failed) else 0


def summary(path, egress_path):
    """`--summary`: issue 27's table from a finished run's results (and bench/egress.py's of
    the same run), written into them and printed."""
    with open(path) as f:
        results = json.load(f)
    egress = None
    if egress_path:
        with open(egress_path) as f:
            egress = json.load(f)
        results["egress"] = {k: egress[k] for k in ("throughput_ratio", "throughput_mib_s", "added_p50_ms")
                             if k in egress}
    results["wave2"] = wave2.rows(results, egress)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(markdown(results))
    bw = results["benchmarks"].get("peer.bwrap", {}).get("p50")
    print()
    print(f"Peers in the same run: bwrap --unshare-all (ro /usr) true p50 {fmt(bw) if bw else '-'} ms"
          + "".join(f", {k[5:]} {fmt(v['p50'])} ms" for k, v in results["benchmarks"].items()
                    if k in ("peer.runsc", "peer.runc", "peer.true", "peer.host_plot_cold")))
    print(wave2.text(results["wave2"]))
    return 0


def safe_rmtree(path):
    """Removes a temp dir unless something is still mounted under it (a leaked sandbox must
    never make us delete through a bind mount into the host)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            mounted = [line.split()[4] for line in f]
    except OSError:
        mounted = []
    if any(m == real or m.startswith(real + "/") for m in mounted):
        print(f"warning: {real} still has mounts under it; left in place", file=sys.stderr)
        return
    shutil.rmtree(real, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
