"""sb.commands: foreground, streamed and background commands."""

import time

import pytest

import glovebox
from glovebox import CommandExitError, NotFoundError


def test_echo(sb):
    r = sb.commands.run("echo hello")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "hello\n", "")
    assert r.ok and not r.timed_out and not r.oom_killed and r.id > 0
    assert r.stdout_raw == b"hello\n"


def test_argv_is_not_a_shell(sb):
    r = sb.commands.run(["python3", "-c", "import sys; print(sys.argv[1])", "a b; $HOME"])
    assert r.stdout == "a b; $HOME\n"


def test_non_zero_exit(sb):
    r = sb.commands.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    with pytest.raises(CommandExitError) as e:
        sb.commands.run("echo out; echo err >&2; exit 3", check=True)
    assert (e.value.exit_code, e.value.stdout, e.value.stderr) == (3, "out\n", "err\n")
    assert "err" in str(e.value)
    assert sb.commands.run("true", check=True).exit_code == 0


def test_timeout(sb):
    t = time.monotonic()
    r = sb.commands.run("sleep 5", timeout=1)
    assert time.monotonic() - t < 3
    assert r.timed_out and r.exit_code != 0
    t = time.monotonic()
    with pytest.raises(glovebox.TimeoutError) as e:
        sb.commands.run("sleep 5", timeout=1, check=True)
    assert time.monotonic() - t < 3
    assert e.value.code == "command_timeout" and e.value.result.timed_out


def test_fractional_timeout(sb):
    t = time.monotonic()
    assert sb.commands.run("sleep 5", timeout=0.3).timed_out
    assert time.monotonic() - t < 2


def test_stdin_text_and_bytes(sb):
    assert sb.commands.run("cat", stdin="héllo\n").stdout == "héllo\n"
    data = bytes(range(256)) * 4
    r = sb.commands.run("cat", stdin=data)
    assert r.stdout_raw == data, "stdin and output are binary-safe"
    assert r.stdout == data.decode("utf-8", "replace")


def test_env_and_cwd(sb):
    sb.files.make_dir("/tmp/work")
    r = sb.commands.run('echo "$FOO"; pwd', env={"FOO": "bar baz"}, cwd="/tmp/work")
    assert r.stdout == "bar baz\n/tmp/work\n"
    assert sb.commands.run("pwd").stdout == "/home/user\n"


def test_output_cap(sb):
    r = sb.commands.run("head -c 100000 /dev/zero", max_output_bytes=1000)
    assert r.stdout_truncated and len(r.stdout_raw) == 1000 and r.stdout_total_bytes == 100000
    # The first half and the end, with the count of what was dropped between them.
    r = sb.commands.run("seq 1 100000; echo LAST-LINE", max_output_bytes=1000)
    head, sep, rest = r.stdout.partition("\n[glovebox: ")
    count, _, tail = rest.partition(" bytes dropped]\n")
    assert sep and head.startswith("1\n2\n") and tail.endswith("LAST-LINE\n"), r.stdout
    assert len(r.stdout_raw) == 1000 and len(head) + int(count) + len(tail) == r.stdout_total_bytes
    # output_tail_bytes=0: the first part only, no marker.
    r = sb.commands.run("seq 1 100000; echo LAST-LINE", max_output_bytes=1000, output_tail_bytes=0)
    assert r.stdout_truncated and len(r.stdout_raw) == 1000 and "LAST-LINE" not in r.stdout
    assert "glovebox:" not in r.stdout


def test_callbacks_receive_output_as_it_happens(sb):
    seen = []
    t0 = time.monotonic()
    script = "echo one; sleep 1; echo two >&2; sleep 0.2; echo three"
    r = sb.commands.run(script, on_stdout=lambda s: seen.append(("out", s, time.monotonic() - t0)),
                        on_stderr=lambda s: seen.append(("err", s, time.monotonic() - t0)))
    end = time.monotonic() - t0
    assert [(k, s) for k, s, _ in seen] == [("out", "one\n"), ("err", "two\n"), ("out", "three\n")]
    assert seen[0][2] < end - 0.8, f"first chunk came only at the end: {seen}, end {end:.2f}"
    assert (r.exit_code, r.stdout, r.stderr) == (0, "one\nthree\n", "two\n")


def test_callbacks_decode_utf8_split_across_chunks(sb):
    seen = []
    code = ("import sys, time; w = sys.stdout.buffer; w.write(b'\\xc3'); w.flush(); time.sleep(0.3); "
            "w.write(b'\\xa9!\\xff\\n'); w.flush()")
    r = sb.commands.run(["python3", "-c", code], on_stdout=seen.append)
    assert "".join(seen) == "é!\ufffd\n"
    assert r.stdout_raw == b"\xc3\xa9!\xff\n" and r.stdout == "é!\ufffd\n"


def test_callbacks_with_check(sb):
    with pytest.raises(CommandExitError) as e:
        sb.commands.run("echo x; exit 4", on_stdout=lambda s: None, check=True)
    assert e.value.exit_code == 4 and e.value.stdout == "x\n"


def test_background_stdin_wait(sb):
    h = sb.commands.run("cat; echo done >&2", background=True)
    assert h.id > 0 and h.pid > 0
    listed = {c.id: c for c in sb.commands.list()}
    assert listed[h.id].running
    h.send_stdin("first ")
    h.send_stdin(b"second\n", close=True)
    r = h.wait(timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "first second\n", "done\n")
    c = {c.id: c for c in sb.commands.list()}[h.id]
    assert not c.running and c.exit_code == 0


def test_background_kill(sb):
    h = sb.commands.run("sleep 60", background=True)
    t = time.monotonic()
    h.kill()
    r = h.wait(timeout=10)
    assert time.monotonic() - t < 3
    assert r.exit_code == 137 and r.signal == 9


def test_background_sigterm(sb):
    h = sb.commands.run(["python3", "-c", "import signal, sys, time\n"
                         "signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(7)))\n"
                         "open('/tmp/ready', 'w').close()\ntime.sleep(60)"], background=True)
    deadline = time.monotonic() + 10
    while not sb.files.exists("/tmp/ready"):
        assert time.monotonic() < deadline, "the command never got ready"
        time.sleep(0.05)
    h.kill(signal=15)
    r = h.wait(timeout=10)
    assert r.exit_code == 7 and r.stdout == "term\n"


def test_unknown_command(sb):
    with pytest.raises(NotFoundError):
        sb.commands.connect(999999).wait(timeout=5)
