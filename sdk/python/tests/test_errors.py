"""Typed errors: each daemon error code reaches the caller as its own class."""

import socket
import time

import pytest

import glovebox
from fake_daemon import FakeDaemon
from glovebox import (
    AuthError,
    GloveboxError,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
    Sandbox,
    SandboxGoneError,
)


def test_wrong_key_is_auth_error(daemon):
    with pytest.raises(AuthError) as e:
        Sandbox.create(api_key="wrong-key")
    assert e.value.status == 401 and e.value.code == "unauthorized"
    with pytest.raises(AuthError):
        Sandbox.list(api_key="wrong-key")


def test_out_of_bounds_memory_is_invalid_argument(daemon):
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(memory_mb=1)
    assert e.value.status == 400 and e.value.code == "invalid_request"
    assert "memory" in e.value.message


def test_unknown_isolation_is_invalid_argument(daemon):
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(isolation="firecracker")
    assert e.value.status == 400 and e.value.code == "invalid_request"
    assert "isolation: unknown variant `firecracker`" in e.value.message


def test_unknown_sandbox_and_template_are_not_found(daemon):
    with pytest.raises(NotFoundError) as e:
        Sandbox.connect("no-such-sandbox")
    assert e.value.code == "sandbox_not_found" and e.value.status == 404
    with pytest.raises(NotFoundError) as e:
        Sandbox.create(template="no-such-template")
    assert e.value.code == "template_not_found"


def test_gone_sandbox_says_why(daemon):
    sb = Sandbox.create()
    sb.kill()
    for call in (lambda: sb.commands.run("true"), lambda: sb.files.read("x"), lambda: sb.run_code("1"),
                 lambda: sb.set_timeout(10)):
        with pytest.raises(SandboxGoneError) as e:
            call()
        assert e.value.reason == "killed" and isinstance(e.value, GloveboxError)


def test_sandbox_ended_by_its_lifetime(daemon):
    sb = Sandbox.create(timeout=1)
    h = sb.commands.run("sleep 30", background=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            # The command's record outlives the sandbox: the wait may answer with it (killed
            # when the sandbox ended) or with the sandbox's end.
            r = h.wait(timeout=10)
            assert r.signal == 9 or r.exit_code != 0, r
            break
        except SandboxGoneError as e:
            assert e.reason == "timeout"
            break
        except GloveboxError:
            pass  # the agent went away mid-request; ask again
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(SandboxGoneError) as gone:
        sb.info()
    assert gone.value.reason == "timeout"


def test_routes_a_daemon_lacks_are_not_supported():
    with FakeDaemon() as fake:
        sb = Sandbox.create(url=fake.url, api_key="k")
        for call in (lambda: sb.update_network(mode="allow-list", allow=["198.51.100.0/24:443"]),
                     sb.egress_log, sb.metrics):
            with pytest.raises(NotSupportedError) as e:
                call()
            assert isinstance(e.value, GloveboxError)
            assert e.value.code == "not_supported" and e.value.status == 404
            assert "not supported by this daemon" in str(e.value)
        # A missing sandbox stays a NotFoundError, not "unsupported".
        with pytest.raises(NotFoundError) as e:
            Sandbox.connect("other", url=fake.url, api_key="k")
        assert e.value.code == "sandbox_not_found"


def test_network_policy_route(sb):
    """Live policy updates and the egress audit against the real daemon."""
    info = sb.update_network(mode="allow-list", allow=["api.good.test"])
    assert info.network.get("mode") == "allow-list" and sb.info().network.get("mode") == "allow-list"
    # A name the policy does not allow is answered NXDOMAIN by the host-side resolver
    # (never sent upstream) and shows in the audit as denied.
    r = sb.commands.run(
        "python3 -c \"import socket\ntry:\n socket.gethostbyname('blocked.evil.test'); print('resolved')\n"
        "except OSError:\n print('nxdomain')\""
    )
    assert r.stdout.strip() == "nxdomain", r
    entries = sb.egress_log()["entries"]
    assert any(e["name"] == "blocked.evil.test" and e["allowed"] is False for e in entries), entries
    info = sb.update_network(mode="deny-all")
    assert info.network.get("mode") == "deny-all"
    with pytest.raises(InvalidArgumentError):
        sb.update_network(mode="no-such-mode")
    with pytest.raises(InvalidArgumentError):
        sb.update_network(mode="allow-list")


def test_metrics(sb):
    sb.commands.run("head -c 3000000 /dev/zero > /tmp/fill", check=True)
    m = sb.metrics()
    assert m.memory_limit_bytes == 512 << 20 and m.pids_limit == 256
    assert m.disk_used_bytes >= 3000000 and m.disk_limit_bytes > m.disk_used_bytes
    assert m.pids >= 1 and m.oom_kills == 0 and m.cpu_usage_ms >= 0 and m.cpu_percent >= 0


def test_unreachable_daemon_is_connection_error(daemon):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(GloveboxError) as e:
            Sandbox.list(url=f"http://127.0.0.1:{port}", api_key="x")
    assert e.value.code == "connection_error"


def test_http_timeout_is_timeout_error(sb):
    h = sb.commands.run("sleep 30", background=True)
    t = time.monotonic()
    with pytest.raises(glovebox.TimeoutError) as e:
        h.wait(timeout=0.5)
    assert time.monotonic() - t < 3
    assert e.value.code == "request_timeout"
    assert isinstance(e.value, TimeoutError), "also the builtin TimeoutError"
    h.kill()
    assert h.wait(timeout=10).exit_code == 137
