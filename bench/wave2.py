"""The second performance round's rows (issue 27), for bench/bench.py: the growth curve
(create and exec as the number of live sandboxes grows), the code interpreter with no warm
sandbox (and its memory after the first cell), and every row of the round's table with its
target, evaluated on one run's numbers beside the peers measured in it.

Python standard library only. bench.py sets `Error` to its BenchError before calling in."""

import time

Error = Exception

# Every other sandbox of the growth curve gets this policy: a veth into its own namespace and
# nf_tables rules, for a range nobody routes to (TEST-NET-2); nothing is sent.
ALLOW = {"mode": "allow-list", "allow": ["198.51.100.0/24"]}
GROWTH_LEVELS = (0, 100, 250, 500, 1000)
GROWTH_LEVELS_QUICK = (0, 25, 50, 100)
# The window row 9 compares: creates while fewer than 50 were live, and while 400 to 449 were.
FIRST, AT = (0, 50), (400, 450)
# Below this much MemAvailable the growth stops where it is (a shared machine must not swap).
MEM_FLOOR_KIB = 2 << 20


def destroy_timed(api, ids, failures):
    """Destroys every sandbox of `ids`, each timed (ms); a failure is noted in `failures`."""
    out = []
    for sid in ids:
        t = time.perf_counter_ns()
        try:
            api.destroy(sid)
        except Error as e:
            failures.append(f"destroy: {e}")
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


def growth_phase(api, levels, deadline_s, summarize, meminfo, cgroup_memory_kb, probe_n=20):
    """Sandboxes pile up on the pool-0 daemon to `levels[-1]`, every other one with an
    allow-list, each create timed with the number live before it. At each level, `probe_n`
    `exec true` in live sandboxes spread over the pile (oldest to newest), then `probe_n`
    creates (kept: they are part of the pile) are that level's p50s. Bounded by `deadline_s`
    and MEM_FLOOR_KIB; every sandbox is destroyed after, and checked gone (API and cgroups)."""
    ids, creates, levels_out, failures = [], [], [], []
    t_end = time.monotonic() + deadline_s
    body = lambda i: {"resources": {"memory_mb": 64}, "timeout_s": 3600,  # noqa: E731
                      "metadata": {"bench": "growth"},
                      "network": ALLOW if i % 2 else {"mode": "deny-all"}}

    def create():
        if time.monotonic() > t_end:
            raise StopIteration(f"stopped at the {deadline_s:g} s bound with {len(ids)} live")
        if meminfo()["MemAvailable"] < MEM_FLOOR_KIB:
            raise StopIteration(f"stopped with {len(ids)} live: MemAvailable under {MEM_FLOOR_KIB >> 20} GiB")
        live = len(ids)
        t0 = time.perf_counter_ns()
        ids.append(api.create(body(live)))
        ms = (time.perf_counter_ns() - t0) / 1e6
        creates.append((live, ms))
        return ms

    t_start = time.monotonic()
    try:
        for level in levels:
            while len(ids) < level:
                create()
            execs = []
            if ids:
                step = max(1, len(ids) // probe_n)
                for sid in ids[::step][:probe_n]:
                    t0 = time.perf_counter_ns()
                    api.exec_true(sid)
                    execs.append((time.perf_counter_ns() - t0) / 1e6)
            live = len(ids)
            probe = [create() for _ in range(probe_n)]
            levels_out.append({"live": live, "create_ms": summarize(probe),
                               "exec_ms": summarize(execs) if execs else None})
    except StopIteration as e:
        failures.append(str(e))
    except Error as e:
        failures.append(str(e))
    grown_s = time.monotonic() - t_start
    t0 = time.monotonic()
    destroys = destroy_timed(api, ids, failures)
    mine = set(ids)
    # A destroy answers once nothing of the sandbox runs; its cgroups, veth and run directory
    # go after the answer: wait (bounded) for them.
    deadline = time.monotonic() + 60
    while True:
        listed = [i for i in api.list_ids() if i in mine]
        cgroups = sum(1 for i in ids if cgroup_memory_kb(i) is not None)
        if (not listed and not cgroups) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    first = [ms for live, ms in creates if FIRST[0] <= live < FIRST[1]]
    at = [ms for live, ms in creates if AT[0] <= live < AT[1]]
    last_live = max((live for live, _ in creates), default=0)
    if not at and creates:
        # Fewer were reached (--quick, or a bound): the last 50 creates stand in, and say so.
        at = [ms for _, ms in creates[-50:]]
    return {
        "levels": levels_out, "created": len(ids), "allow_list_every": 2, "grown_s": round(grown_s, 1),
        "destroy_s": round(time.monotonic() - t0, 1), "failures": failures[:5],
        "create_first_50_ms": summarize(first) if first else None,
        "create_at_400_ms": summarize(at) if at else None,
        "at_400_window": list(AT) if any(AT[0] <= live < AT[1] for live, _ in creates) else
        [max(0, last_live - len(at) + 1), last_live + 1],
        "destroy_ms": summarize(destroys) if destroys else None,
        "left": {"sandboxes": len(listed), "memory_cgroups": cgroups},
    }


def growth_rows(g):
    """Plain rows of the growth curve, for bench.py's tables."""
    rows = [("growth: live sandboxes (every other with an allow-list)", "create p50 ms", "create p95 ms",
             "exec true p50 ms", "exec true p95 ms")]
    for lv in g["levels"]:
        e = lv["exec_ms"]
        rows.append((str(lv["live"]), f"{lv['create_ms']['p50']:.2f}", f"{lv['create_ms']['p95']:.2f}",
                     "-" if e is None else f"{e['p50']:.2f}", "-" if e is None else f"{e['p95']:.2f}"))
    f, a = g.get("create_first_50_ms"), g.get("create_at_400_ms")
    if f and a:
        w = g["at_400_window"]
        rows.append((f"create p50, first 50 vs {w[0]}-{w[1] - 1} live", f"{f['p50']:.2f}", f"{a['p50']:.2f}",
                     f"{a['p50'] / f['p50']:.2f}x", ""))
    left = g["left"]
    rows.append(("destroyed after / left (sandboxes, memory cgroups)", f"{g['created']}",
                 f"{left['sandboxes']} / {left['memory_cgroups']}", f"in {g['destroy_s']:g} s", ""))
    return rows


class ColdCode:
    """The code interpreter with no warm sandbox (the pool-0 daemon): create a
    code-interpreter sandbox (its kernel starts at create and imports numpy, pandas and
    matplotlib), run the seed cell and check it gave its PNG, read the sandbox's memory
    cgroup, destroy it. The peer is the host's cold python3 running the same cell
    (peer.host_plot_cold), in the same group."""

    def __init__(self, api, seed, check, cgroup_memory_kb, warmup, prefix="code.cold"):
        self.api, self.seed, self.check, self.mem = api, seed, check, cgroup_memory_kb
        self.mem_kib, self.warmup, self.calls, self.prefix = [], warmup, 0, prefix

    def step(self, _i):
        t0 = time.perf_counter_ns()
        sid = self.api.create({"template": "code-interpreter"})
        t1 = time.perf_counter_ns()
        try:
            r = self.api.run_code(sid, self.seed)
            t2 = time.perf_counter_ns()
            self.check(r)
            kib = self.mem(sid)
        finally:
            self.api.destroy(sid)
        self.calls += 1
        # The harness's warm-up iterations are not kept.
        if kib is not None and self.calls > self.warmup:
            self.mem_kib.append(kib)
        p = self.prefix
        return {f"{p}_first_result": (t2 - t0) / 1e6, f"{p}_create": (t1 - t0) / 1e6,
                f"{p}_cell": (t2 - t1) / 1e6}


# ---------------------------------------------------------------------------- the table

def _row(what, now, target, met, note=""):
    return {"row": what, "now": now, "target": target,
            "status": "not measured" if met is None else ("met" if met else "missed"), "note": note}


def rows(results, egress=None):
    """Every row of issue 27's table: what this run measured, the target, met or missed (or
    why it was not measured). `egress`: bench/egress.py's results of the same run, if any."""
    b = results.get("benchmarks", {})
    out = []
    bw = b.get("peer.bwrap", {}).get("p50")

    def vs_bwrap(key):
        r = b.get(key)
        return (r, r["p50"] / bw) if r and bw else (r, None)

    r, x = vs_bwrap("api.create_exec_destroy")
    if r and x is not None:
        tail = r["p95"] / r["p50"]
        out.append(_row("create+exec true+destroy, no pool", f"{r['p50']:.2f} ms = {x:.2f}x bwrap; p95 "
                        f"{r['p95']:.2f} ms ({tail:.2f}x p50)", "<= 1.0x bwrap; p95 <= 1.5x p50",
                        x <= 1.0 and tail <= 1.5))
    else:
        out.append(_row("create+exec true+destroy, no pool", "-", "<= 1.0x bwrap; p95 <= 1.5x p50", None,
                        "needs api.create_exec_destroy and peer.bwrap"))
    r, x = vs_bwrap("pool.create_exec_destroy")
    out.append(_row("same, warm pool", f"{r['p50']:.2f} ms = {x:.2f}x bwrap" if x is not None else "-",
                    "<= 0.8x bwrap", None if x is None else x <= 0.8))
    r = b.get("api.exec_roundtrip")
    out.append(_row("exec `true` in a live sandbox", f"{r['p50']:.2f} ms" if r else "-", "<= 1.5 ms",
                    None if not r else r["p50"] <= 1.5,
                    f"fork/exec of true from Python: {b['peer.true']['p50']:.2f} ms" if "peer.true" in b else ""))
    ld = results.get("load", {})
    g8, p8 = ld.get("pool0.c8"), ld.get("bwrap.c8")
    if g8 and p8:
        x = g8["rate_per_s"] / p8["rate_per_s"]
        out.append(_row("sustained cycles/s, 8 clients", f"{g8['rate_per_s']:.0f}/s vs bwrap {p8['rate_per_s']:.0f}/s "
                        f"({x:.2f}x); cycle p50 {g8['cycle_ms']['p50']:.1f} ms vs {p8['cycle_ms']['p50']:.1f}",
                        ">= 1.0x bwrap's rate", x >= 1.0 and not g8["errors"]))
    else:
        out.append(_row("sustained cycles/s, 8 clients", "-", ">= 1.0x bwrap's rate", None, "load phase not run"))
    r, x = vs_bwrap("cli.run_embedded")
    out.append(_row("`glovebox run -- true`, embedded", f"{r['p50']:.2f} ms = {x:.2f}x bwrap" if x is not None else "-",
                    "<= 2x bwrap", None if x is None else x <= 2.0))
    s = results.get("syscall")
    if s and "tax_stat_usr_pct" in s:
        u, root = s["tax_stat_usr_pct"], s["tax_stat_pct"]
        out.append(_row("syscall tax, `os.stat` of a file under /usr", f"{u:+.1f} % (`/`: {root:+.1f} %)",
                        "<= 5 % on both", u <= 5 and root <= 5))
    else:
        out.append(_row("syscall tax, `os.stat` of a file under /usr", "-", "<= 5 % on both", None,
                        "syscall phase not run"))
    if egress:
        t = egress["throughput_ratio"]
        out.append(_row("egress: brokered HTTPS vs direct", f"{t['brokered'] * 100:.0f} % (pass-through "
                        f"{t['pass'] * 100:.0f} %)", ">= 70 % (pass-through >= 90 %)",
                        t["brokered"] >= 0.7 and t["pass"] >= 0.9))
    else:
        out.append(_row("egress: brokered HTTPS vs direct", "-", ">= 70 % (pass-through >= 90 %)", None,
                        "bench/egress.py not run with this run"))
    d, a = b.get("net.create_deny_all"), b.get("net.create_allow_list")
    if d and a:
        x = a["p50"] / d["p50"]
        out.append(_row("allow-list create vs deny-all", f"{x:.2f}x ({a['p50']:.2f} / {d['p50']:.2f} ms)", "<= 1.2x",
                        x <= 1.2))
    else:
        out.append(_row("allow-list create vs deny-all", "-", "<= 1.2x", None, "net group not run"))
    g = results.get("growth")
    if g and g.get("create_first_50_ms") and g.get("create_at_400_ms"):
        f, a, w = g["create_first_50_ms"]["p50"], g["create_at_400_ms"]["p50"], g["at_400_window"]
        x = a / f
        full = w[0] >= AT[0]
        out.append(_row("create p50 with 400 live sandboxes (half with allow-lists) vs the first 50",
                        f"{x:.2f}x ({f:.1f} -> {a:.1f} ms" + ("" if full else f"; {w[0]}-{w[1] - 1} live, not 400")
                        + ")", "<= 1.1x", (x <= 1.1) if full else None,
                        "" if full else "fewer than 450 were made (--quick or a bound)"))
    else:
        out.append(_row("create p50 with 400 live sandboxes (half with allow-lists) vs the first 50", "-", "<= 1.1x",
                        None, "growth phase not run"))
    for key, mem_key, label in (("code.cold", "code_memory", ""),
                                ("code.zygote", "code_memory_zygote", ", code_zygote on")):
        if key == "code.zygote" and f"{key}_first_result" not in b and not results.get(mem_key):
            continue  # no --zygote-url daemon this run
        m = results.get(mem_key)
        what = f"memory of a code-interpreter sandbox after a first pandas cell (its cgroup){label}"
        if m:
            mib = m["p50"] / 1024
            out.append(_row(what, f"{mib:.0f} MiB (p50 of {m['n']})", "<= 25 MiB", mib <= 25))
        else:
            out.append(_row(what, "-", "<= 25 MiB", None, f"{key} not run (needs the code-interpreter template)"))
        c, h = b.get(f"{key}_first_result"), b.get("peer.host_plot_cold")
        what = f"code-interpreter create + first pandas cell with no warm sandbox{label}"
        if c and h:
            x = c["p50"] / h["p50"]
            out.append(_row(what, f"{c['p50']:.0f} ms = {x:.2f}x (host cold python + imports: {h['p50']:.0f} ms)",
                            "<= 1.0x the host's cold start", x <= 1.0))
        else:
            out.append(_row(what, "-", "<= 1.0x the host's cold start", None,
                            f"{key} not run (needs the code-interpreter template)"))
    return out


def text(table):
    lines = ["Issue 27 (performance, wave 2): every row, this run"]
    w = max(len(r["row"]) for r in table)
    for r in table:
        status = {"met": "met ", "missed": "MISS", "not measured": "----"}[r["status"]]
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"  [{status}] {r['row']:<{w}}  {r['now']}  | target {r['target']}{note}")
    return "\n".join(lines)


def markdown(table):
    lines = ["| row (issue 27) | this run | target | |", "| --- | --- | --- | --- |"]
    for r in table:
        status = {"met": "met", "missed": "**missed**", "not measured": "not measured"}[r["status"]]
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(f"| {r['row']} | {r['now']}{note} | {r['target']} | {status} |")
    return "\n".join(lines) + "\n"
