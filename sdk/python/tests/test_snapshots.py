"""Snapshots and forks: snapshot a sandbox, start from it, fork, lineage, the error codes,
list and delete."""

import asyncio
import secrets

import pytest

from glovebox import ConflictError, InvalidArgumentError, NotFoundError, Sandbox, Snapshot
from glovebox.aio import AsyncSandbox


def test_snapshot_create_from_it_and_fork(daemon):
    name = f"s-{secrets.token_hex(4)}"
    with Sandbox.create(timeout=60, metadata={"who": "parent"}) as sb:
        assert sb.commands.run("mkdir -p /w && echo one > /w/f").exit_code == 0
        s = sb.snapshot(name)
        assert (s.name, s.template, s.source_sandbox) == (name, "base", sb.id)
        with pytest.raises(ConflictError) as e:
            sb.snapshot(name)
        assert e.value.code == "conflict"
        assert name in [x.name for x in Snapshot.list()]
        with Sandbox.create(timeout=60, snapshot=name) as c:
            assert c.info().snapshot == name
            assert c.commands.run("cat /w/f").stdout == "one\n"
            assert Snapshot.get(name).sandboxes == 1
        kids = sb.fork(count=2)
        try:
            assert len(kids) == 2
            for k in kids:
                i = k.info()
                assert (i.parent_id, i.ancestors, i.metadata) == (sb.id, [sb.id], {"who": "parent"})
                assert k.commands.run("cat /w/f").stdout == "one\n"
            kids[0].commands.run("echo mine > /w/g")
            assert kids[1].commands.run("test -e /w/g").exit_code != 0
        finally:
            for k in kids:
                k.kill()
        with pytest.raises(InvalidArgumentError):
            sb.fork(count=0)
    Snapshot.delete(name)
    with pytest.raises(NotFoundError) as e:
        Snapshot.get(name)
    assert e.value.code == "snapshot_not_found"
    with pytest.raises(NotFoundError):
        Sandbox.create(snapshot=name)


def test_async_fork(daemon):
    async def go():
        sb = await AsyncSandbox.create(timeout=60)
        try:
            kids = await sb.fork()
            assert [(await k.info()).parent_id for k in kids] == [sb.id]
            for k in kids:
                await k.kill()
        finally:
            await sb.kill()

    asyncio.run(go())
