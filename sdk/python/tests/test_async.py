"""AsyncSandbox: the same surface, as coroutines."""

import asyncio
import time

import pytest

from glovebox import AsyncSandbox, InvalidArgumentError, SandboxGoneError


def run(coro):
    return asyncio.run(coro)


def test_async_create_run_code_kill(daemon):
    async def main():
        sb = await AsyncSandbox.create(metadata={"client": "async"})
        try:
            assert (await sb.info()).metadata == {"client": "async"}
            assert (await sb.set_metadata({"client": "async", "step": "2"})).metadata == {"client": "async", "step": "2"}
            assert (await sb.set_idle_timeout(300)).idle_timeout == 300
            r = await sb.commands.run("echo hi")
            assert r.stdout == "hi\n"
            await sb.run_code("x = 41")
            assert (await sb.run_code("x + 1")).text == "42"
            await sb.files.write("a.txt", b"bytes")
            assert await sb.files.read("a.txt") == "bytes"
            assert [e.name for e in await sb.files.list(".")] == ["a.txt"]
        finally:
            assert await sb.kill()
        with pytest.raises(SandboxGoneError) as e:
            await sb.info()
        assert e.value.reason == "killed"

    run(main())


def test_async_context_manager_and_callbacks(daemon):
    async def main():
        seen = []

        async def on_out(s):
            await asyncio.sleep(0)
            seen.append(s)

        async with await AsyncSandbox.create() as sb:
            sid = sb.id
            r = await sb.commands.run("echo one; sleep 0.2; echo two", on_stdout=on_out)
            assert r.stdout == "one\ntwo\n" and seen == ["one\n", "two\n"]
            results = []
            await sb.run_code("display(7)\n8", on_result=lambda x: results.append(x.text))
            assert results == ["7", "8"]
            h = await sb.commands.run("cat", background=True)
            await h.send_stdin("piped", close=True)
            assert (await h.wait(timeout=10)).stdout == "piped"
            async with await sb.files.read("/etc/hostname", format="stream") as s:
                assert b"".join([c async for c in s])
        with pytest.raises(SandboxGoneError):
            await AsyncSandbox.connect(sid)

    run(main())


def test_async_commands_run_concurrently(sb):
    async def main():
        a = await AsyncSandbox.connect(sb.id)
        t = time.monotonic()
        rs = await asyncio.gather(*(a.commands.run(f"sleep 1; echo {i}") for i in range(4)))
        assert [r.stdout for r in rs] == [f"{i}\n" for i in range(4)]
        return time.monotonic() - t

    assert run(main()) < 2.5, "the four commands overlapped"


def test_async_context_manager_kills_on_exception(daemon):
    sid = None

    async def main():
        nonlocal sid
        async with await AsyncSandbox.create() as sb:
            sid = sb.id
            raise ValueError("boom")

    with pytest.raises(ValueError):
        run(main())
    with pytest.raises(SandboxGoneError) as e:
        run(AsyncSandbox.connect(sid))
    assert e.value.reason == "killed"


def test_async_pty(daemon):
    async def main():
        sb = await AsyncSandbox.create()
        try:
            t = await sb.pty.create(cols=81, rows=25, cmd="stty size; exit 6")
            chunks = []
            r = await t.wait(timeout=20, on_data=chunks.append)
            assert r.exit_code == 6
            assert b"25 81" in b"".join(chunks)
            t = await sb.pty.create()
            await t.resize(90, 20)
            await t.send_input("stty size\n")
            seen = b""
            while b"20 90" not in seen:
                b = await t.read(timeout=20)
                assert b is not None, seen
                seen += b
            await t.disconnect()
            await sb.pty.kill(t.id)
            assert (await t.wait(timeout=20)).signal == 9
        finally:
            assert await sb.kill()

    run(main())


def test_async_create_passes_isolation_on(daemon):
    async def main():
        with pytest.raises(InvalidArgumentError) as e:
            await AsyncSandbox.create(isolation="firecracker")
        assert e.value.code == "invalid_request" and "isolation" in e.value.message

    run(main())
