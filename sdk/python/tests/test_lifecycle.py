"""Sandboxes: create, inspect, list, extend, kill, and the context manager."""

import os
import secrets
import time

import pytest

import glovebox
from glovebox import Sandbox, SandboxGoneError


def wait_gone(sid: str, deadline_s: float) -> SandboxGoneError:
    end = time.monotonic() + deadline_s
    while True:
        try:
            Sandbox.connect(sid)
        except SandboxGoneError as e:
            return e
        assert time.monotonic() < end, f"sandbox {sid} still alive after {deadline_s}s"
        time.sleep(0.1)


def test_create_info_kill(daemon):
    sb = Sandbox.create(timeout=60, cpus=0.5, memory_mb=256, pids=64, metadata={"who": "test"})
    try:
        info = sb.info()
        assert info.id == sb.id and info.state == "running" and info.template == "base"
        assert info.limits.cpus == 0.5 and info.limits.memory_mb == 256 and info.limits.pids == 64
        assert info.metadata == {"who": "test"}
        assert info.network == {"mode": "deny-all"}
        left = (info.expires_at - info.created_at).total_seconds()
        assert 59 <= left <= 61, left
        assert sb.is_running()
    finally:
        assert sb.kill() is True
    with pytest.raises(SandboxGoneError) as e:
        sb.info()
    assert e.value.reason == "killed" and e.value.status == 410 and e.value.code == "sandbox_gone"
    assert not sb.is_running()
    assert sb.kill() is False, "killing a gone sandbox is a no-op"


def test_context_manager_kills_on_exception(daemon):
    with pytest.raises(RuntimeError, match="boom"):
        with Sandbox.create() as sb:
            sid = sb.id
            assert sb.commands.run("true").exit_code == 0
            raise RuntimeError("boom")
    with pytest.raises(SandboxGoneError) as e:
        Sandbox.connect(sid)
    assert e.value.reason == "killed"


def test_context_manager_kills_on_success(daemon):
    with Sandbox.create() as sb:
        sid = sb.id
    assert wait_gone(sid, 1).reason == "killed"


def test_connect_to_existing(sb):
    sb.files.write("note.txt", "from the first handle")
    other = Sandbox.connect(sb.id)
    assert other.id == sb.id
    assert other.commands.run("cat note.txt").stdout == "from the first handle"


def test_env_of_the_sandbox(daemon):
    with Sandbox.create(env={"GREETING": "hello", "SHARED": "sandbox"}) as sb:
        r = sb.commands.run('echo "$GREETING $SHARED"', env={"SHARED": "command"})
        assert r.stdout == "hello command\n"


def test_set_timeout(sb):
    before = sb.info().expires_at
    info = sb.set_timeout(600)
    assert (info.expires_at - before).total_seconds() > 400
    sb.set_timeout(1)
    t = time.monotonic()
    assert wait_gone(sb.id, 10).reason == "timeout"
    assert time.monotonic() - t < 10


def test_set_metadata_and_idle_timeout_live(daemon):
    tag = secrets.token_hex(6)
    sb = Sandbox.create(timeout=60, metadata={"suite": tag, "role": "a"})
    try:
        info = sb.set_metadata({"suite": tag, "role": "b"})
        assert info.metadata == {"suite": tag, "role": "b"}
        assert [s.id for s in Sandbox.list(metadata={"suite": tag, "role": "b"})] == [sb.id]
        assert Sandbox.list(metadata={"suite": tag, "role": "a"}) == []
        assert sb.set_idle_timeout(600).idle_timeout == 600
        assert sb.info().metadata == {"suite": tag, "role": "b"}, "only what is given changes"
        assert sb.set_idle_timeout(0).idle_timeout is None
        with pytest.raises(glovebox.InvalidArgumentError):
            sb.set_idle_timeout(10**9)
        assert sb.info().idle_timeout is None, "a refused change changes nothing"
        # A sandbox created without an idle clock gets one: idle that long, it ends.
        sb.set_idle_timeout(1)
        # Poll the list, not the sandbox: a request to the sandbox is activity.
        end = time.monotonic() + 10
        while any(i.id == sb.id for i in Sandbox.list()):
            assert time.monotonic() < end, "not stopped 10 s after its new 1 s idle period"
            time.sleep(0.2)
        with pytest.raises(SandboxGoneError) as gone:
            sb.info()
        assert gone.value.reason == "idle"
    finally:
        sb.kill()


def test_list_with_metadata_filter(daemon):
    tag = secrets.token_hex(6)
    with Sandbox.create(metadata={"suite": tag, "role": "a"}) as a, \
            Sandbox.create(metadata={"suite": tag, "role": "b"}) as b:
        both = {s.id for s in Sandbox.list(metadata={"suite": tag})}
        assert both == {a.id, b.id}
        only_a = Sandbox.list(metadata={"suite": tag, "role": "a"})
        assert [s.id for s in only_a] == [a.id]
        assert only_a[0].metadata == {"suite": tag, "role": "a"}
        assert Sandbox.list(metadata={"suite": "no-such-" + tag}) == []
        assert {a.id, b.id} <= {s.id for s in Sandbox.list()}


def test_create_with_explicit_url_and_key(daemon, monkeypatch):
    monkeypatch.delenv("GLOVEBOX_URL")
    monkeypatch.delenv("GLOVEBOX_API_KEY")
    with Sandbox.create(url=daemon.url, api_key=daemon.api_key) as sb:
        assert sb.commands.run("echo ok").stdout == "ok\n"
        assert any(s.id == sb.id for s in Sandbox.list(url=daemon.url, api_key=daemon.api_key))
    assert glovebox.__version__


def test_idle_timeout_usage_and_events(daemon):
    sb = Sandbox.create(timeout=60, idle_timeout=2)
    try:
        for _ in range(3):  # keep-alives hold it open past its idle period
            time.sleep(1)
            sb.keepalive()
        assert sb.is_running()
        sb.commands.run("python3 -c 'import time\nwhile time.process_time() < 0.3: pass'")
        u = sb.usage()
        assert u["cpu_seconds"] >= 0.25 and u["wall_seconds"] >= 3, u
        # Poll the list, not the sandbox: a request to the sandbox is activity.
        end = time.monotonic() + 10
        while any(i.id == sb.id for i in Sandbox.list()):
            assert time.monotonic() < end, "not stopped 10 s after its 2 s idle period"
            time.sleep(0.2)
        with pytest.raises(SandboxGoneError) as gone:
            sb.info()
        assert gone.value.reason == "idle"
        kinds = [(e["type"], e.get("reason")) for e in sb.events()]
        assert kinds[0][0] == "created" and kinds[-1] == ("ended", "idle"), kinds
        assert sb.usage()["ended_at"], "usage stays readable after the end"
    finally:
        sb.kill()


def test_pause_stops_the_clock_and_requests_resume(daemon):
    sb = Sandbox.create(timeout=2)
    try:
        sb.commands.run("echo kept > /tmp/state")
        assert sb.pause().state == "paused"
        assert sb.pause().state == "paused", "pause is idempotent"
        time.sleep(2.5)  # past its lifetime: paused, it stays
        assert sb.info().state == "paused"
        assert sb.resume().state == "running"
        sb.pause()
        assert sb.commands.run("cat /tmp/state").stdout == "kept\n"
        assert sb.info().state == "running", "a command resumed it"
    finally:
        sb.kill()


def test_on_idle_pause_and_hibernate_refused(daemon):
    sb = Sandbox.create(idle_timeout=1, on_idle="pause")
    try:
        time.sleep(2.5)  # no request meanwhile: every request on it counts as activity
        assert sb.info().state == "paused"
    finally:
        sb.kill()
    with pytest.raises(glovebox.NotSupportedError) as e:
        Sandbox.create(idle_timeout=1, on_idle="hibernate")
    assert e.value.code == "hibernate_unavailable" and e.value.status == 501


def test_isolation_gvisor_runs_on_gvisors_kernel(daemon):
    if not os.path.isfile("/usr/bin/runsc"):
        pytest.skip("runsc is not installed (scripts/deps installs Debian's runsc)")
    with Sandbox.create(isolation="gvisor", timeout=60) as sb:
        assert sb.info().isolation == "gvisor"
        assert sb.commands.run("uname -r").stdout.strip() != os.uname().release, "it ran on the host's kernel"
        sb.files.write("tier.txt", "gvisor")
        assert sb.files.read("tier.txt") == "gvisor"
    with Sandbox.create() as sb:
        assert sb.info().isolation == "process"
        assert sb.commands.run("uname -r").stdout.strip() == os.uname().release
