"""sb.pty: a shell on a pseudo-terminal — size, resize, input, Ctrl-C, detach, exit code."""

import time

import pytest

from glovebox import InvalidArgumentError, NotFoundError


def read_until(t, want: str, seen: bytearray, deadline_s: float = 20.0) -> str:
    """Reads the terminal until ``want`` shows in what was read since ``seen`` was empty."""
    end = time.monotonic() + deadline_s
    while want.encode() not in seen:
        left = end - time.monotonic()
        assert left > 0, f"no {want!r} in the terminal: {bytes(seen)!r}"
        b = t.read(timeout=left)
        assert b is not None, f"the terminal ended before {want!r}: {bytes(seen)!r}"
        seen.extend(b)
    return seen.decode("utf-8", "replace")


def wait_for_sleep(sb) -> None:
    end = time.monotonic() + 20
    while sb.commands.run("pgrep -x sleep").exit_code != 0:
        assert time.monotonic() < end, "sleep never started"
        time.sleep(0.1)


def test_pty_shell(sb):
    t = sb.pty.create(cols=80, rows=24)
    assert t.id > 0 and t.pid > 0
    seen = bytearray()
    t.send_input("stty size; tty; echo sum-$((6*7))\n")
    out = read_until(t, "sum-42", seen)
    assert "24 80" in out and "/dev/pts/" in out
    t.resize(100, 30)
    seen.clear()
    t.send_input("stty size\n")
    read_until(t, "30 100", seen)
    # Ctrl-C reaches the foreground job; the shell goes on.
    t.send_input("sleep 100\n")
    wait_for_sleep(sb)
    t.send_input("\x03")
    seen.clear()
    t.send_input("echo after-$((1+1))\n")
    read_until(t, "after-2", seen)
    assert sb.commands.run("pgrep -x sleep").exit_code == 1
    # Detached, the program goes on; its exit code is the result's.
    t.disconnect()
    sb.pty.send_input(t.id, "exit 4\n")
    r = t.wait(timeout=20)
    assert r.exit_code == 4


def test_pty_command_and_on_data(sb):
    t = sb.pty.create(cols=40, rows=10, cmd=["/bin/sh", "-c", "echo $FOO; pwd; exit 3"], cwd="/tmp",
                      envs={"FOO": "bar"})
    chunks = []
    r = t.wait(timeout=20, on_data=chunks.append)
    assert r.exit_code == 3
    out = b"".join(chunks).decode()
    assert "bar" in out and "/tmp" in out


def test_pty_errors(sb):
    with pytest.raises(InvalidArgumentError):
        sb.pty.create(cols=0, rows=24)
    with pytest.raises(InvalidArgumentError):
        sb.pty.create(cols=80, rows=1001)
    with pytest.raises(NotFoundError):
        sb.pty.resize(99999, 80, 24)
    with pytest.raises(NotFoundError):
        sb.pty.connect(99999).read(timeout=10)
    t = sb.pty.create(cols=80, rows=24)
    with pytest.raises(InvalidArgumentError):
        t.resize(2000, 10)
    sb.pty.kill(t.id)
    assert t.wait(timeout=20).signal == 9
