"""One real daemon for the whole session, on a free loopback port with a random key and a
temporary data dir; each test gets its own sandbox, and a test that leaves a sandbox behind
fails.

The daemon binary: ``$GLOVEBOX_BIN`` if set, else the repository's debug build
(``target/x86_64-unknown-linux-gnu/debug/glovebox``, built with ``cargo build`` if missing).
``$GLOVEBOX_TEMPLATES_DIR`` is passed through (CI points it at the template store where
scripts/build-code-interpreter built ``code-interpreter``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest

from glovebox import Sandbox

REPO = Path(__file__).resolve().parents[3]
DEFAULT_BIN = REPO / "target" / "x86_64-unknown-linux-gnu" / "debug" / "glovebox"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 15.0


class Daemon:
    def __init__(self, url: str, api_key: str, proc: subprocess.Popen, log_path: Path, data_dir: Path) -> None:
        self.url = url
        self.api_key = api_key
        self.proc = proc
        self.log_path = log_path
        self.data_dir = data_dir

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def _binary() -> Path:
    env = os.environ.get("GLOVEBOX_BIN")
    if env:
        return Path(env)
    if not DEFAULT_BIN.exists():
        subprocess.run(["cargo", "build", "-p", "glovebox", "-p", "glovebox-agent"], cwd=REPO, check=True)
    return DEFAULT_BIN


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    # No proxies: the daemon is on loopback and nothing else may be contacted.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/healthz", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_DEADLINE_S)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (namespaces, cgroups, mounts); CI runs these as root")
    binary = _binary()
    work = Path(tempfile.mkdtemp(prefix="glovebox-sdk-test-"))
    data_dir = work / "data"
    api_key = "gbsdk_" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("GLOVEBOX_URL", "GLOVEBOX_API_KEY", "GLOVEBOX_DATA_DIR")}
    env.setdefault("NO_COLOR", "1")
    d = None
    # A probed free port can be taken before the daemon binds it: then try another.
    for attempt in range(5):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = work / f"daemon-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
                 "--api-key", api_key, "--warm-pool", "0"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None and not _healthy(url):
            time.sleep(0.05)
        if proc.poll() is None and _healthy(url):
            d = Daemon(url, api_key, proc, log_path, data_dir)
            break
        _stop(proc)
    if d is None:
        tail = log_path.read_text(errors="replace")[-3000:]
        pytest.fail(f"glovebox serve did not become healthy within {START_DEADLINE_S}s:\n{tail}")
    saved = {k: os.environ.get(k) for k in ("GLOVEBOX_URL", "GLOVEBOX_API_KEY")}
    os.environ["GLOVEBOX_URL"] = d.url
    os.environ["GLOVEBOX_API_KEY"] = d.api_key
    try:
        yield d
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _stop(d.proc)
        code = d.proc.returncode
        shutil.rmtree(work, ignore_errors=True)
        assert code == 0, f"daemon exited with {code} on SIGTERM"


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that leaves sandboxes running (and kills them)."""
    if "daemon" not in request.fixturenames:
        yield
        return
    before = {s.id for s in Sandbox.list()}
    yield
    leaked: List[str] = [s.id for s in Sandbox.list() if s.id not in before]
    for sid in leaked:
        Sandbox.connect(sid).kill()
    assert not leaked, f"test left sandboxes running: {leaked}"


@pytest.fixture
def sb(daemon: Daemon) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=120) as s:
        yield s


def templates_dir_with(name: str) -> bool:
    d = os.environ.get("GLOVEBOX_TEMPLATES_DIR")
    return bool(d) and (Path(d) / "templates" / f"{name}.json").is_file()
