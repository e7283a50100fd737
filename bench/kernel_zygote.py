#!/usr/bin/env python3
"""A python kernel forked from a per-template zygote into a freshly made sandbox, against
today's kernel (started by the agent at the first cell), measured side by side.

Issue 27's two code-interpreter rows: the sandbox's memory cgroup after the first pandas cell
(<= 25 MiB) and create + first cell with no warm sandbox (<= 1.0x the host's cold python).
docs/benchmarks.md ("A per-template python kernel zygote") has the design and the numbers.

Each iteration, in an order that alternates:

  today   the daemon (--url, a pool-0 daemon with the code-interpreter template): create a
          code-interpreter sandbox, run the seed cell (bench.SEED, checked for its PNG), read
          the sandbox's memory cgroup, destroy it: bench/wave2.py's ColdCode step.
  zygote  this script as host root, with the same binaries: asks the template's zygote
          (`glovebox-agent kernel-zygote` running `python_kernel.py` as a zygote, started once)
          for a child; the child makes a user namespace; this script writes its maps (a uid
          slot of its own, above the daemon's) and runs the jailer (`glovebox-agent jail`,
          the config a daemon would send, `userns` set) so the sandbox is built inside it;
          moves the child into the sandbox's cgroups and hands it the namespaces of the
          sandbox's PID 1 and the kernel's stdio; the child forks the kernel into them; the
          seed cell is sent on its stdin; then the sandbox's memory cgroup is read, and the
          sandbox destroyed (its cgroups' processes killed, the cgroups removed).

Not in the zygote path here (the daemon's part of it, not measured): the HTTP request, the
store, the network slot (the sandbox is deny-all with the namespace the jailer makes). The
commands' seccomp filters are passed only with --seccomp-from (see below); Landlock is not
applied to the forked kernel here.

Also: the host's cold python3 running the same cell (bench.HostPlot.cold_step), the peer.

Needs root. Talks to 127.0.0.1 only.

    bench/kernel_zygote.py --url http://127.0.0.1:PORT --key KEY --templates target/test-templates \
        --skel /run/glovebox/skel-... [--n 6]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
AGENT = os.path.join(REPO, "target/x86_64-unknown-linux-gnu/debug/glovebox-agent")
CG = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids", "cpu")
GROUP = "glovebox-zygote-bench"
# Above every slot the daemon hands out (1 << 30 + 16384 slots of 65536 = 1 << 31).
UID_BASE = 0x9000_0000
ZYGOTE_UID = 0x8F00_0000
RANGE = 65536
RUN = "/run/glovebox-zygote-bench"
KERNEL = "/opt/glovebox/kernels/python_kernel.py"
NS = ["cgroup", "ipc", "uts", "net", "pid", "time", "mnt"]


def layers_of(store, name="code-interpreter"):
    with open(os.path.join(store, "templates", f"{name}.json")) as f:
        meta = json.load(f)
    return [os.path.join(store, "layers", l, "fs") for l in meta["layers"]], meta.get("preload") or ""


def cgroup_dirs(name):
    return [os.path.join(CG, c, GROUP, name) for c in CONTROLLERS]


def make_cgroups(name, memory_mb):
    dirs = cgroup_dirs(name)
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(CG, "memory", GROUP, name, "memory.limit_in_bytes"), "w") as f:
        f.write(str(memory_mb << 20))
    return dirs


def kill_cgroups(name):
    dirs = cgroup_dirs(name)
    for _ in range(200):
        pids = set()
        for d in dirs:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids.update(int(p) for p in f.read().split())
            except OSError:
                pass
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    for d in dirs:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def memory_kib(name):
    with open(os.path.join(CG, "memory", GROUP, name, "memory.usage_in_bytes")) as f:
        return int(f.read()) / 1024


def creds(ancdata):
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("iII", data[:12])[0]
    raise RuntimeError("no credentials on the message")


class Zygote:
    def __init__(self, layers, skel, preload):
        self.dir = os.path.join(RUN, "zygote")
        os.makedirs(os.path.join(self.dir, "mnt"), mode=0o711, exist_ok=True)
        self.cg = make_cgroups("zygote", 1024)
        root = {
            "id": "zygote", "uid_base": 0, "uid_count": 0, "hostname": "zygote",
            "mount_dir": os.path.join(self.dir, "mnt"), "socket_path": os.path.join(self.dir, "unused.sock"),
            "layers": layers + [skel], "host_usr": True, "disk_bytes": 64 << 20, "shm_bytes": 1 << 20,
            "cgroup_procs": [os.path.join(d, "cgroup.procs") for d in self.cg], "command_cgroup": None,
            "pids": 256,
        }
        cfg = {
            "root": root, "uid": ZYGOTE_UID,
            "exe": "/usr/bin/python3", "argv": ["python3", KERNEL],
            "env": [["PATH", "/usr/local/bin:/usr/bin:/bin"], ["HOME", "/tmp"], ["MPLCONFIGDIR", "/tmp/mpl"],
                    ["MPLBACKEND", "Agg"], ["GLOVEBOX_PRELOAD", preload], ["LANG", "C.UTF-8"],
                    ["GLOVEBOX_KERNEL_ZYGOTE", "1"]],
            "cwd": "/",
        }
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctl = ours
        self.log = open(os.path.join(RUN, "zygote.log"), "ab")
        fd = theirs.fileno()
        t0 = time.perf_counter()
        # Only fd 3 is inherited besides stdio (every other fd of ours is close-on-exec).
        self.proc = subprocess.Popen([AGENT, "kernel-zygote"], stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=self.log, close_fds=False, preexec_fn=lambda: os.dup2(fd, 3))
        theirs.close()
        self.proc.stdin.write(json.dumps(cfg).encode())
        self.proc.stdin.close()
        self.start_s = time.perf_counter() - t0

    def child(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        socket.send_fds(self.ctl, [b"F"], [theirs.fileno()])
        theirs.close()
        return ours

    def close(self):
        self.ctl.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        kill_cgroups("zygote")
        self.log.close()


def zygote_step(z, layers, skel, preload, i, seccomp):
    """One sandbox from the zygote: created, its kernel forked in, the seed cell run."""
    name = f"sb{i}"
    d = os.path.join(RUN, name)
    os.makedirs(os.path.join(d, "mnt"), mode=0o711, exist_ok=True)
    os.chmod(d, 0o711)
    t0 = time.perf_counter_ns()
    chan = z.child()
    msg, anc, _, _ = chan.recvmsg(16, socket.CMSG_SPACE(12))
    cpid = creds(anc)
    if chan.recv(16) != b"u":
        raise RuntimeError("the zygote's child did not make its user namespace")
    base = UID_BASE + (i % 64) * RANGE
    mapping = f"0 {base} {RANGE}\n"
    userns = os.open(f"/proc/{cpid}/ns/user", os.O_RDONLY)
    for f in ("uid_map", "gid_map"):
        with open(f"/proc/{cpid}/{f}", "w") as fh:
            fh.write(mapping)
    cg = make_cgroups(name, 2048)
    cfg = {
        "id": name, "uid_base": base, "uid_count": RANGE, "hostname": "glovebox",
        "mount_dir": os.path.join(d, "mnt"), "socket_path": os.path.join(d, "agent.sock"),
        "layers": layers + [skel], "host_usr": True, "disk_bytes": 1 << 30, "shm_bytes": 64 << 20,
        "cgroup_procs": [os.path.join(c, "cgroup.procs") for c in cg], "command_cgroup": None,
        "pids": 1024, "userns": f"/proc/{os.getpid()}/fd/{userns}",
    }
    if seccomp:
        cfg["seccomp"], cfg["agent_seccomp"] = seccomp["seccomp"], seccomp["agent_seccomp"]
    with open(os.path.join(d, "agent.log"), "wb") as log:
        j = subprocess.run([AGENT, "jail"], input=json.dumps(cfg).encode(), stdout=subprocess.PIPE, stderr=log,
                           pass_fds=(userns,))
    os.close(userns)
    status = j.stdout.decode()
    if "ready" not in status:
        raise RuntimeError(f"jail: {status!r}; {open(os.path.join(d, 'agent.log')).read()[-500:]}")
    pid1 = int(status.split("pid ")[1].split()[0])
    t_jail = time.perf_counter_ns()
    for c in cg:
        with open(os.path.join(c, "cgroup.procs"), "w") as fh:
            fh.write(str(cpid))
    nsfds = [os.open(f"/proc/{pid1}/ns/{n}", os.O_RDONLY) for n in NS]
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err = os.open(os.path.join(d, "kernel.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    spec = {
        "ns": NS, "cwd": "/home/user", "uid": 0, "gid": 0,
        "env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1", "GLOVEBOX_PRELOAD": preload},
        "seccomp": [seccomp["agent_seccomp"], seccomp["seccomp"]] if seccomp else [],
    }
    socket.send_fds(chan, [json.dumps(spec).encode()], nsfds + [in_r, out_w, err])
    for fd in nsfds + [in_r, out_w, err]:
        os.close(fd)
    msg, anc, _, _ = chan.recvmsg(16, socket.CMSG_SPACE(12))
    if msg != b"k":
        raise RuntimeError(f"the kernel did not start (see {d}/kernel.err)")
    kpid = creds(anc)
    chan.close()
    out = os.fdopen(out_r, "rb")
    ready = json.loads(out.readline())
    if ready.get("type") != "ready":
        raise RuntimeError(f"kernel: {ready}")
    t_ready = time.perf_counter_ns()
    os.write(in_w, (json.dumps({"id": "1", "code": bench.SEED}) + "\n").encode())
    stdout, pngs, events = [], 0, []
    while True:
        line = out.readline()
        if not line:
            raise RuntimeError(f"the kernel exited (see {d}/kernel.err)")
        ev = json.loads(line)
        events.append({k: (str(v)[:200]) for k, v in ev.items()})
        if ev.get("type") == "stdout":
            stdout.append(ev["text"])
        elif ev.get("type") == "result" and "image/png" in ev.get("data", {}):
            pngs += 1
        elif ev.get("type") == "error":
            raise RuntimeError(f"the seed cell failed: {ev}")
        elif ev.get("type") == "end":
            break
    t_end = time.perf_counter_ns()
    if not pngs or "median=" not in "".join(stdout):
        raise RuntimeError(f"the seed cell gave no PNG or no statistics: {events}")
    kib = memory_kib(name)
    facts = kernel_facts(kpid, pid1)
    os.close(in_w)
    out.close()
    kill_cgroups(name)
    shutil.rmtree(d, ignore_errors=True)
    return {"first_result_ms": (t_end - t0) / 1e6, "jail_ms": (t_jail - t0) / 1e6,
            "ready_ms": (t_ready - t0) / 1e6, "cell_ms": (t_end - t_ready) / 1e6, "mem_kib": kib, "facts": facts}


def kernel_facts(kpid, pid1):
    """What the forked kernel is, read from the host: its status lines, namespaces vs PID 1's."""
    st = {}
    with open(f"/proc/{kpid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
                     "Seccomp_filters", "NSpid", "PPid"):
                st[k] = " ".join(v.split())
    same = {n: os.readlink(f"/proc/{kpid}/ns/{n}") == os.readlink(f"/proc/{pid1}/ns/{n}")
            for n in NS + ["user"]}
    with open(f"/proc/{kpid}/cgroup") as f:
        st["cgroup"] = [l.strip() for l in f if "memory" in l]
    st["same_ns_as_pid1"] = same
    st["RssAnon_kib"] = int(open(f"/proc/{kpid}/status").read().split("RssAnon:")[1].split()[0])
    rollup = {}
    with open(f"/proc/{kpid}/smaps_rollup") as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[-1] == "kB":
                rollup[p[0].rstrip(":")] = int(p[1])
    st["Private_Dirty_kib"], st["Pss_kib"] = rollup.get("Private_Dirty"), rollup.get("Pss")
    return st


def today_step(api):
    t0 = time.perf_counter_ns()
    sid = api.create({"template": "code-interpreter"})
    t1 = time.perf_counter_ns()
    try:
        r = api.run_code(sid, bench.SEED)
        t2 = time.perf_counter_ns()
        bench.check_seed(r)
        kib = bench.cgroup_memory_kb(sid)
    finally:
        api.destroy(sid)
    return {"first_result_ms": (t2 - t0) / 1e6, "create_ms": (t1 - t0) / 1e6, "cell_ms": (t2 - t1) / 1e6,
            "mem_kib": kib}


def p50(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--templates", default=os.path.join(REPO, "target/test-templates"))
    ap.add_argument("--skel", required=True, help="the daemon's base skeleton (a sandbox dir's `skel` file names it)")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--seccomp-from", help="a JSON file with the daemon's compiled filters "
                    "({\"seccomp\": [...], \"agent_seccomp\": [...]}), given to the jail and the kernel")
    ap.add_argument("--kernel-file", help="a python_kernel.py to use instead of the skeleton's (a copy of the "
                    "skeleton is made with it); the daemon's path keeps its own")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    layers, preload = layers_of(args.templates)
    seccomp = json.load(open(args.seccomp_from)) if args.seccomp_from else None
    os.makedirs(RUN, mode=0o711, exist_ok=True)
    os.chmod(RUN, 0o711)
    for c in CONTROLLERS:
        os.makedirs(os.path.join(CG, c, GROUP), exist_ok=True)
    if args.kernel_file:
        skel = os.path.join(RUN, "skel")
        shutil.rmtree(skel, ignore_errors=True)
        subprocess.run(["cp", "-a", args.skel, skel], check=True)
        shutil.copyfile(args.kernel_file, os.path.join(skel, KERNEL.lstrip("/")))
        args.skel = skel
    api = bench.Api(args.url, args.key, timeout=120)
    host = bench.HostPlot(bench.code_interpreter_site(args.templates))
    z = Zygote(layers, args.skel, preload)
    try:
        # The zygote's own start (imports and the warm-up figure) is paid once per template.
        time.sleep(0.2)
        t0 = time.perf_counter()
        zy = zygote_step(z, layers, args.skel, preload, 0, seccomp)  # waits for the zygote's imports
        print(f"zygote up + first sandbox: {(time.perf_counter() - t0) * 1000:.0f} ms", file=sys.stderr)
        print(json.dumps(zy["facts"], indent=1), file=sys.stderr)
        today_step(api)  # warm-up of the daemon's path
        rows = {"zygote": [], "today": [], "host": []}
        for i in range(args.n):
            order = [("zygote", lambda: zygote_step(z, layers, args.skel, preload, i + 1, seccomp)),
                     ("today", lambda: today_step(api)),
                     ("host", lambda: {"first_result_ms": host.cold_step(i)["peer.host_plot_cold"]})]
            if i % 2:
                order.reverse()
            for what, fn in order:
                r = fn()
                rows[what].append(r)
                print(f"{i} {what}: " + " ".join(f"{k}={v:.1f}" for k, v in r.items() if isinstance(v, float)),
                      file=sys.stderr)
        zmem = [r["mem_kib"] for r in rows["zygote"]]
        zygote_pss = bench_rollup(z.proc.pid)
        out = {
            "n": args.n, "loadavg": open("/proc/loadavg").read().split()[:3],
            "zygote_pss_kib": zygote_pss,
            "facts": rows["zygote"][-1]["facts"],
            "p50": {
                "today_first_result_ms": p50(rows["today"], "first_result_ms"),
                "zygote_first_result_ms": p50(rows["zygote"], "first_result_ms"),
                "host_cold_ms": p50(rows["host"], "first_result_ms"),
                "zygote_jail_ms": p50(rows["zygote"], "jail_ms"),
                "zygote_ready_ms": p50(rows["zygote"], "ready_ms"),
                "zygote_cell_ms": p50(rows["zygote"], "cell_ms"),
                "today_create_ms": p50(rows["today"], "create_ms"),
                "today_cell_ms": p50(rows["today"], "cell_ms"),
                "today_mem_mib": statistics.median(r["mem_kib"] for r in rows["today"]) / 1024,
                "zygote_mem_mib": statistics.median(zmem) / 1024,
            },
            "rows": {k: [{kk: vv for kk, vv in r.items() if kk != "facts"} for r in v] for k, v in rows.items()},
        }
        print(json.dumps(out, indent=1))
    finally:
        z.close()
        host.teardown()
        for c in CONTROLLERS:
            try:
                os.rmdir(os.path.join(CG, c, GROUP))
            except OSError:
                pass
        shutil.rmtree(RUN, ignore_errors=True)


def bench_rollup(launcher_pid):
    """The zygote's Pss (it is the launcher itself after its exec)."""
    try:
        with open(f"/proc/{launcher_pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


if __name__ == "__main__":
    main()
