"""Volumes: create, mount in one sandbox and read in the next, read-only mounts, the error
codes, list and delete."""

import secrets
import time

import pytest

from glovebox import ConflictError, InvalidArgumentError, NotFoundError, Sandbox, Volume
from glovebox.volumes import mount_body


def test_mount_specs_parse():
    assert mount_body("data:/data") == {"name": "data", "path": "/data", "read_only": False}
    assert mount_body("data:/in:ro") == {"name": "data", "path": "/in", "read_only": True}
    assert mount_body(("data", "/x", True)) == {"name": "data", "path": "/x", "read_only": True}
    assert mount_body({"name": "d", "path": "/p"}) == {"name": "d", "path": "/p"}
    with pytest.raises(InvalidArgumentError):
        mount_body("data")


def test_volume_outlives_sandboxes(daemon):
    name = f"v-{secrets.token_hex(4)}"
    v = Volume.create(name, 32)
    assert (v.name, v.size_mb, v.mounted_by) == (name, 32, 0)
    try:
        with pytest.raises(ConflictError) as e:
            Volume.create(name, 32)
        assert e.value.code == "conflict"
        with Sandbox.create(timeout=60, volumes=[f"{name}:/data"]) as a:
            assert a.commands.run("echo kept > /data/f").exit_code == 0
            assert Volume.get(name).mounted_by == 1
            with pytest.raises(ConflictError) as e:
                Volume.delete(name)
            assert e.value.code == "volume_in_use"
        with Sandbox.create(timeout=60, volumes=[(name, "/ro", True)]) as b:
            assert b.commands.run("cat /ro/f").stdout == "kept\n"
            w = b.commands.run("touch /ro/g")
            assert w.exit_code != 0 and "Read-only" in w.stderr
        assert name in [x.name for x in Volume.list()]
        with pytest.raises(NotFoundError) as e:
            Sandbox.create(volumes=["no-such-volume:/data"])
        assert e.value.code == "volume_not_found"
        with pytest.raises(InvalidArgumentError):
            Sandbox.create(volumes=[f"{name}:/proc/x"])
    finally:
        # The last sandbox's release may still be under way: delete once it is done.
        end = time.monotonic() + 10
        while True:
            try:
                Volume.delete(name)
                break
            except ConflictError:
                assert time.monotonic() < end, "volume still in use 10 s after its sandboxes ended"
                time.sleep(0.05)
    with pytest.raises(NotFoundError):
        Volume.get(name)
