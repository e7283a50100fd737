"""Tiny assertion helpers for the Daytona-compatibility scripts (run by tests/daytona.rs).

Each check prints one `ok: …` line; the first failure raises (non-zero exit, traceback).
`done()` prints the closing line the Rust harness looks for.
"""

import os
import time

_count = 0


def check(name, cond, detail=""):
    global _count
    if not cond:
        raise AssertionError(f"check failed: {name} {detail}")
    _count += 1
    print(f"ok: {name}", flush=True)


def raises(name, exc, fn, *args, **kwargs):
    """Checks that fn(*args) raises `exc` (the SDK's own type); returns the exception."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        check(name, True)
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong type
        raise AssertionError(f"check failed: {name}: expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"check failed: {name}: expected {exc.__name__}, nothing raised")


def poll(fn, timeout, every=0.2):
    """fn() until truthy or `timeout` seconds pass; returns the last value."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() > deadline:
            return v
        time.sleep(every)


def env(name):
    v = os.environ.get(name)
    if not v:
        raise SystemExit(f"{name} is not set")
    return v


def done(what):
    print(f"daytona {what}: {_count} checks ok", flush=True)
