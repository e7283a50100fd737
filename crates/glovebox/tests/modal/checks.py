"""Tiny assertion helpers for the Modal-compatibility scripts (run by tests/modal.rs).

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
    """Checks that fn(*args) raises `exc` (the client's own type); returns the exception."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        check(name, True)
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong type
        raise AssertionError(f"check failed: {name}: expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"check failed: {name}: expected {exc.__name__}, nothing raised")


def env(name):
    v = os.environ.get(name)
    if not v:
        raise SystemExit(f"{name} is not set")
    return v


def timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    v = fn(*args, **kwargs)
    return v, time.monotonic() - t0


def done(what):
    print(f"modal {what}: {_count} checks ok", flush=True)
