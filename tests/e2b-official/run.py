#!/usr/bin/env python3
"""Runs one vendored official E2B suite against a Glovebox daemon and judges the result.

    run.py SUITE [--python VENV_PYTHON] [--jobs N] [--report FILE]

SUITE is `e2b` or `code-interpreter` (a directory beside this file). The daemon is the one
E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY point at. `expectations.txt` (beside this file)
lists, per suite, the tests that are not run (out of scope, with the reason) and the tests
known to fail (with the reason). The verdict:

* every test run either passes or is a listed known failure — a failure that is not listed
  is re-run once on its own (a second failure is a regression, exit 1; a pass is reported
  as flaky);
* a listed known failure that passes is reported (so the list can shrink);
* the pass rate (passed / run) is printed next to the 95 % bar of the issue; tests listed
  `lifecycle` (pause and resume: another issue) run and may fail, but count outside the bar.

Prints `SUITE: N passed, N failed (N known), N out of scope` as its last line.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
BAR = 0.95


def load_expectations(suite):
    """(out_of_scope {prefix: reason}, known {node id: reason}, lifecycle {node id: reason})."""
    out, known, lifecycle = {}, {}, {}
    for n, line in enumerate((HERE / "expectations.txt").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[0] not in ("skip", "fail", "lifecycle"):
            sys.exit(f"expectations.txt:{n}: want `skip|fail|lifecycle SUITE TEST REASON`, got {line!r}")
        kind, s, test, reason = parts
        if s == suite:
            {"skip": out, "fail": known, "lifecycle": lifecycle}[kind][test] = reason
    return out, known, lifecycle


def run_pytest(python, suite_dir, args, junit, timeout_s):
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=--import-mode=importlib",
           f"--junitxml={junit}", *args]
    try:
        return subprocess.run(cmd, cwd=suite_dir, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        print(f"pytest did not finish within {timeout_s} s", file=sys.stderr)
        return 124


def results(junit, suite_dir):
    """{node id: 'passed'|'failed'|'skipped'} from a junit XML report."""
    out = {}
    if not Path(junit).exists():
        return out
    for case in ET.parse(junit).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        # classname is the dotted module path (plus class); rebuild pytest's node id.
        parts = classname.split(".")
        path, rest = None, []
        for i in range(len(parts), 0, -1):
            candidate = Path(suite_dir, *parts[:i]).with_suffix(".py")
            if candidate.exists():
                path, rest = "/".join(parts[:i]) + ".py", parts[i:]
                break
        node = "::".join([path or classname, *rest, name])
        if case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        elif case.find("skipped") is not None:
            state = "skipped"
        else:
            state = "passed"
        # A setup error and a call failure of one test both count once, as failed.
        if out.get(node) != "failed":
            out[node] = state
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", choices=["e2b", "code-interpreter"])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--report", help="write the per-test outcome here")
    ap.add_argument("--timeout", type=int, default=1500, help="whole-run limit, seconds")
    a = ap.parse_args()
    a.python = os.path.abspath(a.python) if os.sep in a.python else a.python
    suite_dir = HERE / a.suite
    out_of_scope, known, lifecycle = load_expectations(a.suite)
    for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        if not os.environ.get(var):
            sys.exit(f"run.py: {var} is not set (point it at a Glovebox daemon)")

    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "all.xml")
        args = ["tests", f"--numprocesses={a.jobs}", "--timeout=120"]
        for prefix in out_of_scope:
            args += ["--deselect", prefix]
        run_pytest(a.python, suite_dir, args, junit, a.timeout)
        got = results(junit, suite_dir)
        if not got:
            sys.exit(f"{a.suite}: pytest reported no test (see its output above)")

        unexpected = sorted(t for t, s in got.items() if s == "failed" and t not in known and t not in lifecycle)
        flaky = []
        if unexpected:
            print(f"\n{a.suite}: re-running {len(unexpected)} unexpected failure(s) one at a time", flush=True)
            rerun = os.path.join(tmp, "rerun.xml")
            run_pytest(a.python, suite_dir, ["--timeout=120", *unexpected], rerun, 600)
            again = results(rerun, suite_dir)
            flaky = [t for t in unexpected if again.get(t) == "passed"]
            unexpected = [t for t in unexpected if again.get(t) != "passed"]
            for t in flaky:
                got[t] = "passed"

    in_bar = {t: s for t, s in got.items() if t not in lifecycle}
    passed = [t for t, s in in_bar.items() if s == "passed"]
    failed = [t for t, s in in_bar.items() if s == "failed"]
    life_run = [t for t in got if t in lifecycle]
    life_passed = [t for t in life_run if got[t] == "passed"]
    skipped = [t for t, s in got.items() if s == "skipped"]
    fixed = sorted(t for t in known if got.get(t) == "passed")
    run = len(passed) + len(failed)
    rate = len(passed) / run if run else 0.0

    if a.report:
        with open(a.report, "w") as f:
            for t in sorted(got):
                f.write(f"{got[t]}\t{t}\n")
    for t in flaky:
        print(f"{a.suite}: flaky (failed, then passed alone): {t}")
    for t in fixed:
        print(f"{a.suite}: listed as failing but passed (update expectations.txt): {t}")
    for t in unexpected:
        print(f"{a.suite}: FAILED, not a known failure: {t}")
    bar = "meets" if rate >= BAR else "below"
    print(f"{a.suite}: pass rate {rate:.1%} of the tests run ({bar} the {BAR:.0%} bar)")
    if lifecycle:
        print(f"{a.suite}: pause/resume tests (outside the bar): {len(life_passed)} of {len(life_run)} passed")
    known_failed = len([t for t in failed if t in known])
    print(
        f"{a.suite}: {len(passed)} passed, {len(failed)} failed ({known_failed} known), "
        f"{len(skipped)} skipped, {len(out_of_scope)} out-of-scope entries"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
