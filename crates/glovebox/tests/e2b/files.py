"""Files through the official `e2b` SDK: write/read (text, bytes, 50 MiB), list, exists,
get_info, remove, rename, make_dir, write_files, errors, and paths that try to leave."""

import hashlib
import os
import uuid

from e2b import FileNotFoundException, InvalidArgumentException, Sandbox
from e2b.sandbox.filesystem.filesystem import FileType, WriteEntry

from checks import check, done, raises

sb = Sandbox.create(timeout=180)

info = sb.files.write("/home/user/hello.txt", "héllo wörld\n")
check("write returns the path", info.path == "/home/user/hello.txt" and info.name == "hello.txt", info)
check("read text", sb.files.read("/home/user/hello.txt") == "héllo wörld\n")
blob = bytes(range(256)) * 4
sb.files.write("/home/user/blob.bin", blob)
check("read bytes", bytes(sb.files.read("/home/user/blob.bin", format="bytes")) == blob)
check("relative paths are under the home", sb.files.read("hello.txt") == "héllo wörld\n")
check("commands see written files", sb.commands.run("md5sum /home/user/blob.bin").stdout.split()[0] == hashlib.md5(blob).hexdigest())

big = os.urandom(50 << 20)
sb.files.write("/tmp/big.bin", big)
got = bytes(sb.files.read("/tmp/big.bin", format="bytes"))
check("50 MiB round trip", hashlib.sha256(got).digest() == hashlib.sha256(big).digest(), len(got))
check("50 MiB size", sb.files.get_info("/tmp/big.bin").size == 50 << 20)
stream = sb.files.read("/tmp/big.bin", format="stream")
n = sum(len(c) for c in stream)
check("streamed read", n == 50 << 20, n)
sb.files.remove("/tmp/big.bin")

res = sb.files.write_files([WriteEntry(path="/home/user/m/a.txt", data="A"), WriteEntry(path="/home/user/m/b.txt", data=b"B")])
check("write_files writes several", [r.path for r in res] == ["/home/user/m/a.txt", "/home/user/m/b.txt"], res)

check("make_dir creates parents", sb.files.make_dir("/home/user/d1/d2/d3") is True)
check("make_dir on an existing dir is False", sb.files.make_dir("/home/user/d1") is False)
sb.files.write("/home/user/d1/f.txt", "f")
names = sorted(e.name for e in sb.files.list("/home/user/d1"))
check("list", names == ["d2", "f.txt"], names)
entry = [e for e in sb.files.list("/home/user/d1") if e.name == "d2"][0]
check("list entry types", entry.type == FileType.DIR and entry.path == "/home/user/d1/d2", entry)
deep = sorted(e.path for e in sb.files.list("/home/user/d1", depth=3))
check("list depth=3", "/home/user/d1/d2/d3" in deep, deep)

check("exists (file)", sb.files.exists("/home/user/hello.txt") is True)
check("exists (missing)", sb.files.exists("/home/user/nope") is False)
gi = sb.files.get_info("/home/user/hello.txt")
check("get_info", (gi.name, gi.type, gi.size) == ("hello.txt", FileType.FILE, len("héllo wörld\n".encode())), gi)
check("get_info permissions", gi.permissions.startswith("-rw"), gi.permissions)

moved = sb.files.rename("/home/user/hello.txt", "/home/user/d1/renamed.txt")
check("rename returns the new entry", moved.path == "/home/user/d1/renamed.txt", moved)
check("rename moved it", not sb.files.exists("/home/user/hello.txt") and sb.files.read("/home/user/d1/renamed.txt") == "héllo wörld\n")
sb.files.remove("/home/user/d1")
check("remove (recursive dir)", not sb.files.exists("/home/user/d1"))

raises("read missing -> FileNotFoundException", FileNotFoundException, sb.files.read, "/home/user/missing.txt")
raises("get_info missing -> FileNotFoundException", FileNotFoundException, sb.files.get_info, "/nope/x")
raises("list missing -> FileNotFoundException", FileNotFoundException, sb.files.list, "/nope")
sb.files.remove("/nope/missing")
check("remove of a missing path succeeds (as envd)", not sb.files.exists("/nope/missing"))
raises("read a directory -> InvalidArgumentException", InvalidArgumentException, sb.files.read, "/home/user")

# Paths that try to leave the sandbox stay inside it.
tag = uuid.uuid4().hex
host_path = f"/tmp/e2b-escape-{tag}"
sb.files.write(f"/../../../../..{host_path}", "inside")
check("a ../ path is written inside the sandbox", sb.commands.run(f"cat {host_path}").stdout == "inside")
check("...and not on the host", not os.path.exists(host_path))
sb.files.write(f"../../../..{host_path}-rel", "inside")
check("a relative ../ path is not on the host", not os.path.exists(host_path + "-rel"))
sb.commands.run(f"ln -s / /home/user/root-link && ln -s /etc /tmp/etc-link")
sb.files.write(f"/home/user/root-link/tmp/e2b-link-{tag}", "via link")
check("a symlink to / stays in the sandbox's /", not os.path.exists(f"/tmp/e2b-link-{tag}")
      and sb.commands.run(f"cat /tmp/e2b-link-{tag}").stdout == "via link")
sb.kill()
done("files")
