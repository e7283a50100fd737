#!/usr/bin/env python3
"""Latency benchmarks of Glovebox against its peers, in one run (Python standard library only).

Measured, each after a warm-up (`--warmup`, default 10) that is not counted:
  api.create_exec_destroy    POST /v1/sandboxes, POST .../exec ["true"], DELETE .../{id}
                             on one keep-alive connection to a warm daemon; each phase is
                             recorded too (api.create, api.exec_first, api.destroy)
  api.exec_roundtrip         POST .../exec ["true"] again and again in one live sandbox
  cli.run_daemon             `glovebox run -- true` with GLOVEBOX_URL set (process spawn,
                             HTTP client, create, exec, destroy)
  cli.run_embedded           `glovebox run -- true` with no daemon (also opens the manager
                             and starts an in-process server every time)
  peer.*                     bwrap, unshare, runc, runsc running `true`, and a plain
                             fork/exec of `true` (the cost every subprocess peer shares)

The Glovebox benchmarks and the light peers run interleaved in rounds (`--sequential` runs
them one after another); runc and runsc run alone after them.
Peers and CLI runs are spawned from this Python process, so they carry Python's own spawn
cost; `peer.true` measures exactly that cost, so subtract it when comparing the kernel work.
Results: a table on stdout and a JSON file (`--out`).
"""

import argparse
import datetime
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
import time

BWRAP_MIN = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib",
             "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "true"]
BWRAP_HOST = ["bwrap", "--unshare-all", "--bind", "/", "/", "true"]
UNSHARE = ["unshare", "--fork", "--pid", "--mount", "--net", "--uts", "--ipc", "--user",
           "--map-root-user", "true"]

# Targets from the performance issue. Each is (what, benchmark, check) and is evaluated on
# the measured numbers; a miss is reported with its size, never hidden.
TARGET_CED_P50_MS = 10.0
TARGET_CED_VS_BWRAP = 1.5
TARGET_EXEC_P50_MS = 2.0
TARGET_TAIL_RATIO = 3.0

# The hosted services' published time-to-interactive medians (seconds). Context only:
# they are not measured here and include the network to their regions.
HOSTED_PUBLISHED_S = {"Daytona": 0.11, "E2B": 0.44, "Vercel": 1.75, "Modal": 2.66}


class BenchError(Exception):
    pass


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
        self.host, self.port, self.timeout = host.strip("[]"), int(port), timeout
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.conn = None

    def _connect(self):
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self.conn.connect()
        # http.client sets TCP_NODELAY itself; set it again so the numbers never depend on
        # that detail of the Python version (Nagle + delayed ACK would add ~40 ms).
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            if self.conn is None:
                self._connect()
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                return resp.status, raw
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable: the loop returns or raises")

    def expect(self, method, path, body, status):
        got, raw = self.request(method, path, body)
        if got != status:
            raise BenchError(f"{method} {path}: HTTP {got} (want {status}): {raw[:300]!r}")
        return json.loads(raw) if raw else None

    def create(self):
        return self.expect("POST", "/v1/sandboxes", {}, 201)["id"]

    def exec_true(self, sid):
        r = self.expect("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, 200)
        if r.get("exit_code") != 0:
            raise BenchError(f"exec true in {sid}: {r}")

    def destroy(self, sid):
        self.expect("DELETE", f"/v1/sandboxes/{sid}", None, 204)

    def close(self):
        if self.conn is not None:
            self.conn.close()


# ---------------------------------------------------------------------------- benchmarks
#
# Each benchmark is a Bench: `step(i)` does one iteration and returns {name: ms} (one
# iteration of create+exec+destroy yields the total and each phase). The scheduler warms every
# bench, then runs them interleaved in rounds, so a burst of load from elsewhere on the machine
# (a build, a test suite) lands on all of them alike and the ratios stay fair. A bench marked
# `alone` (runc, runsc) runs by itself afterwards: their asynchronous teardown (gVisor's
# sandbox and gofer processes, runc's cgroups) spills into whatever runs next and inflated the
# others' p95 by a third when interleaved.

class Bench:
    def __init__(self, name, n, warmup, step, setup=None, teardown=None, alone=False):
        self.name, self.n, self.warmup, self.alone = name, n, warmup, alone
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


def api_ced_step(api):
    def step(_i):
        t0 = time.perf_counter_ns()
        sid = api.create()
        t1 = time.perf_counter_ns()
        api.exec_true(sid)
        t2 = time.perf_counter_ns()
        api.destroy(sid)
        t3 = time.perf_counter_ns()
        return {"api.create_exec_destroy": (t3 - t0) / 1e6, "api.create": (t1 - t0) / 1e6,
                "api.exec_first": (t2 - t1) / 1e6, "api.destroy": (t3 - t2) / 1e6}
    return step


class LiveSandbox:
    """One sandbox kept for the exec round-trip benchmark."""

    def __init__(self, api):
        self.api, self.sid = api, None

    def setup(self):
        self.sid = self.api.create()

    def step(self, _i):
        t0 = time.perf_counter_ns()
        self.api.exec_true(self.sid)
        return {"api.exec_roundtrip": ms_since(t0)}

    def teardown(self):
        if self.sid is not None:
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


def schedule(benches, interleave, failed):
    """Warms and runs every bench, group by group (each group warmed just before it runs);
    a bench that fails is dropped and named in `failed`. Returns the benches that ran."""
    together = [b for b in benches if interleave and not b.alone]
    groups = ([together] if together else []) + [[b] for b in benches if b not in together]
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
            if len(group) > 1 and (r + 1) % max(1, rounds // 5) == 0:
                print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        for b in group:
            if b.teardown:
                try:
                    b.teardown()
                except BenchError as e:
                    print(f"  {b.name}: teardown: {e}", file=sys.stderr, flush=True)
    return ran


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
    fstypes = {}
    for line in read("/proc/self/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            fstypes[parts[1]] = parts[2]
    root = fstypes.get("/sys/fs/cgroup")
    if root == "cgroup2":
        cg = "v2 (unified)"
    elif "/sys/fs/cgroup/unified" in fstypes:
        cg = "hybrid (v1 controllers, v2 mounted at /sys/fs/cgroup/unified with none)"
    elif root is not None:
        cg = "v1 (legacy)"
    else:
        cg = "unknown"
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
    ("api.create_exec_destroy", "Glovebox API: create + exec true + destroy"),
    ("api.create", "  phase: create (POST /v1/sandboxes)"),
    ("api.exec_first", "  phase: first exec true"),
    ("api.destroy", "  phase: destroy (DELETE)"),
    ("api.exec_roundtrip", "Glovebox API: exec true in a live sandbox"),
    ("cli.run_daemon", "glovebox run -- true (daemon)"),
    ("cli.run_embedded", "glovebox run -- true (embedded)"),
    ("peer.bwrap", "bwrap --unshare-all (ro /usr) true"),
    ("peer.bwrap_host", "bwrap --unshare-all --bind / / true"),
    ("peer.unshare", "unshare --fork --pid --mount --net --uts --ipc --user true"),
    ("peer.runc", "runc run (ro /usr bundle) true"),
    ("peer.runsc", "runsc run (gVisor, ro /usr bundle) true"),
    ("peer.true", "true (fork/exec from Python, baseline)"),
]


def fmt(x):
    if x != x:  # NaN
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def table(results):
    labels = dict(ORDER)
    rows = [(labels.get(k, k), r) for k, r in
            sorted(results["benchmarks"].items(), key=lambda kv: [k for k, _ in ORDER].index(kv[0])
                   if kv[0] in labels else 99)]
    w = max(len(name) for name, _ in rows)
    lines = [f"{'benchmark':<{w}}  {'n':>4}  {'p50':>8}  {'p95':>8}  {'p99':>8}  {'mean':>8}   (ms)"]
    for name, r in rows:
        lines.append(f"{name:<{w}}  {r['n']:>4}  {fmt(r['p50']):>8}  {fmt(r['p95']):>8}  "
                     f"{fmt(r['p99']):>8}  {fmt(r['mean']):>8}")
    if results["ratios"]:
        lines.append("")
        lines.append("Glovebox create+exec+destroy p50 / peer p50:")
        for k, v in results["ratios"].items():
            lines.append(f"  vs {k:<22} {v:6.2f}x")
    if results["unavailable"]:
        lines.append("")
        lines.append("Not measured:")
        for k, v in results["unavailable"].items():
            lines.append(f"  {k}: {v}")
    lines.append("")
    lines.append("Targets:")
    for t in results["targets"]:
        mark = "met " if t["met"] else "MISS"
        lines.append(f"  [{mark}] {t['target']}: measured {t['measured']}")
    return "\n".join(lines)


def markdown(results):
    """The same tables in Markdown, for pasting into docs/benchmarks.md."""
    labels = dict(ORDER)
    order = [k for k, _ in ORDER]
    b = results["benchmarks"]
    lines = ["| benchmark | n | p50 | p95 | p99 | mean |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k in sorted(b, key=lambda k: order.index(k) if k in order else 99):
        r = b[k]
        name = labels.get(k, k).strip()
        name = ("&nbsp;&nbsp;" + name) if labels.get(k, "").startswith("  ") else name
        lines.append(f"| {name.replace('|', '/')} | {r['n']} | {fmt(r['p50'])} | {fmt(r['p95'])} | "
                     f"{fmt(r['p99'])} | {fmt(r['mean'])} |")
    lines += ["", "| Glovebox create+exec+destroy p50 vs | ratio |", "| --- | ---: |"]
    lines += [f"| {labels.get('peer.' + k, k)} | {v:.2f}x |" for k, v in results["ratios"].items()]
    lines += ["", "| target | measured | |", "| --- | --- | --- |"]
    lines += [f"| {t['target']} | {t['measured']} | {'met' if t['met'] else '**missed**'} |"
              for t in results["targets"]]
    return "\n".join(lines) + "\n"


def evaluate_targets(b, ratios):
    out = []

    def add(target, measured, met):
        out.append({"target": target, "measured": measured, "met": bool(met)})

    ced = b.get("api.create_exec_destroy")
    if ced:
        p50 = ced["p50"]
        add(f"create+exec true+destroy p50 <= {TARGET_CED_P50_MS:g} ms", f"{p50:.2f} ms"
            + ("" if p50 <= TARGET_CED_P50_MS else f" ({p50 / TARGET_CED_P50_MS:.1f}x the target)"),
            p50 <= TARGET_CED_P50_MS)
        if "bwrap" in ratios:
            r = ratios["bwrap"]
            add(f"create+exec true+destroy p50 <= {TARGET_CED_VS_BWRAP:g}x bwrap --unshare-all true",
                f"{r:.2f}x", r <= TARGET_CED_VS_BWRAP)
    ex = b.get("api.exec_roundtrip")
    if ex:
        add(f"exec round trip p50 <= {TARGET_EXEC_P50_MS:g} ms", f"{ex['p50']:.2f} ms"
            + ("" if ex["p50"] <= TARGET_EXEC_P50_MS
               else f" ({ex['p50'] / TARGET_EXEC_P50_MS:.1f}x the target)"),
            ex["p50"] <= TARGET_EXEC_P50_MS)
    for k in ("api.create_exec_destroy", "api.exec_roundtrip"):
        if k in b:
            t = b[k]["p99"] / b[k]["p50"]
            add(f"{k} p99 <= {TARGET_TAIL_RATIO:g}x p50", f"{t:.2f}x", t <= TARGET_TAIL_RATIO)
    return out


# ---------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="daemon URL (loopback); without it the API benchmarks are skipped")
    ap.add_argument("--key", default=os.environ.get("GLOVEBOX_API_KEY", ""))
    ap.add_argument("--glovebox", help="path to the glovebox binary (for the CLI benchmarks)")
    ap.add_argument("--n", type=int, help="iterations per benchmark (default 200; 30 with --quick)")
    ap.add_argument("--cli-n", type=int, help="iterations of the CLI benchmarks (default 30; 10 with --quick)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sequential", action="store_true",
                    help="run each benchmark to the end before the next (default: interleaved rounds)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "latest.json"))
    ap.add_argument("--only", default="", help="comma-separated benchmark prefixes to run (e.g. api,peer.bwrap)")
    a = ap.parse_args()
    n = a.n or (30 if a.quick else 200)
    cli_n = a.cli_n or (10 if a.quick else 30)
    only = [p for p in a.only.split(",") if p]

    def wanted(name):
        return not only or any(name.startswith(p) for p in only)

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {
        "schema": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "glovebox_rev": git_rev(repo),
        "machine": machine_info(),
        "settings": {"n": n, "cli_n": cli_n, "warmup": a.warmup, "quick": a.quick,
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

    def add(name, n_, warmup, step, setup=None, teardown=None, alone=False):
        if wanted(name):
            benches.append(Bench(name, n_, warmup, step, setup, teardown, alone))

    # Glovebox through the warm daemon.
    api = Api(a.url, a.key) if a.url else None
    if api is None:
        for k in ("api.create_exec_destroy", "api.exec_roundtrip", "cli.run_daemon"):
            unavailable[k] = "no --url given"
    else:
        add("api.create_exec_destroy", n, a.warmup, api_ced_step(api))
        live_sb = LiveSandbox(api)
        add("api.exec_roundtrip", n, a.warmup, live_sb.step, live_sb.setup, live_sb.teardown)

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
    def peer(name, argv_fn, missing=None, alone=False):
        if not wanted(name):
            return
        if missing:
            unavailable[name] = missing
        elif works(argv_fn("probe")):
            add(name, n, a.warmup, cmd_step(name, argv_fn), alone=alone)
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

        def argv_of(i, tool=tool, extra=extra):
            # A private state dir, and `run` without --detach deletes the container when
            # `true` exits, so nothing outlives the run.
            return [tool, "--root", os.path.join(work, f"{tool}-state"), *extra, "run",
                    "--bundle", bundle or "", f"gb-bench-{os.getpid()}-{i}"]
        peer(f"peer.{tool}", argv_of, missing, alone=True)

    peer("peer.true", lambda i: ["true"])

    t0 = time.monotonic()
    try:
        ran = schedule(benches, not a.sequential, failed)
    finally:
        safe_rmtree(work)
        if api is not None:
            api.close()
    results["settings"]["wall_s"] = round(time.monotonic() - t0, 1)
    for name, why in failed.items():
        unavailable[name] = f"failed: {why}"
    for b in ran:
        if b.name in failed:
            continue
        for k, samples in b.samples.items():
            results["benchmarks"][k] = summarize(samples)
            results["samples_ms"][k] = [round(x, 4) for x in samples]
        print(f"  {b.name:<26} {b.elapsed_s:6.1f} s", file=sys.stderr)

    try:
        with open("/proc/loadavg") as f:
            results["machine"]["loadavg_at_end"] = f.read().split()[:3]
    except OSError:
        pass
    b = results["benchmarks"]
    if "api.create_exec_destroy" in b:
        ced50 = b["api.create_exec_destroy"]["p50"]
        for k, v in b.items():
            if k.startswith("peer.") and v["p50"] > 0:
                results["ratios"][k[len("peer."):]] = ced50 / v["p50"]
    results["targets"] = evaluate_targets(b, results["ratios"])

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
    print(table(results))
    print(f"\nJSON: {a.out}\nMarkdown tables: {md}")
    # Glovebox's own benchmarks must run; a peer that could not is reported, not fatal.
    return 1 if any(f.startswith(("api.", "cli.")) for f in failed) else 0


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
