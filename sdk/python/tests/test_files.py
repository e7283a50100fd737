"""sb.files: round trips, streaming, the directory operations, and confinement."""

import hashlib
import io
import os
import secrets

import pytest

from glovebox import ConflictError, InvalidArgumentError, NotFoundError


def test_text_round_trip(sb):
    info = sb.files.write("hello.txt", "héllo wörld\n")
    assert info.path == "/home/user/hello.txt" and info.size == len("héllo wörld\n".encode())
    assert sb.files.read("hello.txt") == "héllo wörld\n"
    assert sb.files.read("/home/user/hello.txt", format="bytes") == "héllo wörld\n".encode()
    assert sb.commands.run("cat hello.txt").stdout == "héllo wörld\n", "the sandbox sees the same file"


def test_bytes_round_trip(sb):
    data = bytes(range(256)) * 16
    sb.files.write("/tmp/bin", data)
    assert sb.files.read("/tmp/bin", format="bytes") == data
    assert sb.files.read("/tmp/bin") == data.decode("utf-8", "replace")


def test_five_mib_streamed_round_trip(sb, tmp_path):
    data = os.urandom(5 << 20)
    digest = hashlib.sha256(data).hexdigest()
    # From a file-like (streamed, chunked).
    sb.files.write("big/from-bytesio.bin", io.BytesIO(data))
    # From a real file on disk.
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    with open(src, "rb") as f:
        info = sb.files.write("big/from-file.bin", f)
    assert info.size == len(data)
    assert sb.commands.run("sha256sum big/from-bytesio.bin big/from-file.bin | cut -d' ' -f1").stdout == \
        f"{digest}\n{digest}\n"
    assert hashlib.sha256(sb.files.read("big/from-file.bin", format="bytes")).hexdigest() == digest
    with sb.files.read("big/from-bytesio.bin", format="stream") as s:
        assert s.size == len(data)
        h = hashlib.sha256()
        chunks = 0
        for chunk in s:
            h.update(chunk)
            chunks += 1
    assert h.hexdigest() == digest and chunks > 1


def test_write_from_iterable_and_text_file(sb):
    sb.files.write("gen.txt", (f"line {i}\n".encode() for i in range(3)))
    assert sb.files.read("gen.txt") == "line 0\nline 1\nline 2\n"
    sb.files.write("text-io.txt", io.StringIO("ünïcode text"))
    assert sb.files.read("text-io.txt") == "ünïcode text"


def test_write_mode(sb):
    info = sb.files.write("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert info.mode & 0o777 == 0o755
    assert sb.commands.run("./run.sh").stdout == "ran\n"


def test_directory_operations(sb):
    d = sb.files.make_dir("proj/src")
    assert d.is_dir and d.path == "/home/user/proj/src"
    sb.files.write("proj/src/main.py", "print(1)\n")
    sb.files.write("proj/README", "readme")

    top = {e.name: e for e in sb.files.list("proj")}
    assert set(top) == {"src", "README"}
    assert top["src"].type == "dir" and top["README"].type == "file" and top["README"].size == 6
    deep = {e.path for e in sb.files.list("proj", depth=2)}
    assert "/home/user/proj/src/main.py" in deep

    assert sb.files.exists("proj/src/main.py")
    assert not sb.files.exists("proj/nope")
    assert not sb.files.exists("proj/README/inside"), "a path through a file does not exist"
    info = sb.files.get_info("proj/src/main.py")
    assert info.is_file and info.size == 9 and info.name == "main.py" and info.mtime is not None

    moved = sb.files.rename("proj/src/main.py", "proj/app.py")
    assert moved.path == "/home/user/proj/app.py"
    assert not sb.files.exists("proj/src/main.py") and sb.files.read("proj/app.py") == "print(1)\n"

    sb.files.remove("proj/app.py")
    assert not sb.files.exists("proj/app.py")
    sb.files.write("proj/src/x", "x")
    with pytest.raises(ConflictError) as e:
        sb.files.remove("proj/src")
    assert e.value.code == "directory_not_empty"
    sb.files.remove("proj", recursive=True)
    assert not sb.files.exists("proj")


def test_symlink_is_reported(sb):
    sb.commands.run("ln -s /etc/hostname link", check=True)
    info = sb.files.get_info("link")
    assert info.type == "symlink" and info.target == "/etc/hostname"


def test_missing_file(sb):
    with pytest.raises(NotFoundError) as e:
        sb.files.read("does/not/exist")
    assert e.value.code == "file_not_found"
    with pytest.raises(NotFoundError):
        sb.files.remove("does-not-exist")
    with pytest.raises(InvalidArgumentError):
        sb.files.list("hello", depth=0)


def test_paths_stay_inside_the_sandbox(sb, tmp_path):
    with pytest.raises(NotFoundError):
        sb.files.read("../../etc/shadow")
    name = f"glovebox-sdk-escape-{secrets.token_hex(6)}"
    info = sb.files.write(f"../../../../../../tmp/{name}", "x")
    assert info.path == f"/tmp/{name}", "resolved inside the sandbox"
    assert not os.path.exists(f"/tmp/{name}"), "nothing was written on the host"
    # A host file, reached through .. and through a symlink made inside: never served.
    secret = tmp_path / "secret"
    secret.write_text("host secret " + secrets.token_hex(8))
    with pytest.raises(NotFoundError):
        sb.files.read("../../../.." + str(secret))
    sb.commands.run(["ln", "-s", str(secret), "link"], check=True)
    with pytest.raises(NotFoundError):
        sb.files.read("link")
    assert not sb.files.exists(str(secret))
