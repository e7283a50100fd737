"""The rest of envd's surface through the official `e2b` SDK: file metadata (xattrs), gzip
transfers, owners by user, symlink info, signed URLs, watch_dir (plain, recursive, with
entries), list pagination and filters, and metrics time ranges."""

import datetime
import json
import time
import urllib.error
import urllib.request
import uuid

from e2b import FilesystemEventType, FileType, InvalidArgumentException, Sandbox, SandboxQuery

from checks import check, done, raises

tag = uuid.uuid4().hex
sb = Sandbox.create(timeout=180, metadata={"envd": tag}, secure=True)

# Metadata: user.e2b.* extended attributes, set on upload, shown by stat, list and rename.
info = sb.files.write("m.txt", "x", metadata={"Author": "ann", "stage": "one"})
check("write returns the metadata (keys lowercased)", info.metadata == {"author": "ann", "stage": "one"}, info)
check("get_info shows it", sb.files.get_info("m.txt").metadata == {"author": "ann", "stage": "one"})
out = sb.commands.run("python3 -c \"import os; print(os.getxattr('/home/user/m.txt', 'user.e2b.author').decode())\"")
check("it is an xattr inside the sandbox", out.stdout.strip() == "ann", out)
check("rename keeps it", sb.files.rename("m.txt", "m2.txt").metadata == {"author": "ann", "stage": "one"})
check("listing shows it", [e.metadata for e in sb.files.list("/home/user") if e.name == "m2.txt"] == [{"author": "ann", "stage": "one"}])
check("overwriting without metadata clears it", sb.files.write("m2.txt", "y").metadata is None)
check("...for good", sb.files.get_info("m2.txt").metadata is None)
raises("a bad key is refused", InvalidArgumentException, sb.files.write, "m3.txt", "x", metadata={"bad key": "v"})

# gzip both ways, and a gzip upload read back plain.
sb.files.write("g.txt", "gzipped " * 1000, gzip=True)
check("gzip upload, plain read", sb.files.read("g.txt") == "gzipped " * 1000)
check("gzip read", sb.files.read("g.txt", gzip=True) == "gzipped " * 1000)

# Owners: the request's user when one is named, else root (the user processes run as).
check("owner root by default", sb.files.get_info("g.txt").owner == "root")
sb.files.write("u.txt", "u", user="user")
i = sb.files.get_info("u.txt")
check("owner user when asked", (i.owner, i.group) == ("user", "user"), i)
check("mode and permissions", (i.mode, i.permissions) == (0o644, "-rw-r--r--"), i)

# A symlink is described by its target.
sb.commands.run("mkdir -p /home/user/ln && echo hi > /home/user/ln/t.txt && ln -s t.txt /home/user/ln/l")
i = sb.files.get_info("ln/l")
check("symlink info follows the link", i.type == FileType.FILE and i.symlink_target == "/home/user/ln/t.txt", i)

# Signed URLs (a secure sandbox): the signature stands for the token, and expires.
sb.files.write("s.txt", "signed")
with urllib.request.urlopen(sb.download_url("s.txt", "user")) as r:
    check("signed download", r.read() == b"signed")
try:
    urllib.request.urlopen(sb.download_url("s.txt", "user", use_signature_expiration=-60))
    check("an expired signature is refused", False)
except urllib.error.HTTPError as e:
    check("an expired signature is refused", e.code == 401 and json.loads(e.read())["message"] == "signature is already expired")
bad = sb.download_url("s.txt", "user").replace("signature=v1_", "signature=v1_x")
try:
    urllib.request.urlopen(bad)
    check("a forged signature is refused", False)
except urllib.error.HTTPError as e:
    check("a forged signature is refused", e.code == 401)

# watch_dir: an API write to a new name, an overwrite, and recursion into a new directory.
sb.files.make_dir("w")
h = sb.files.watch_dir("w", include_entry=True)
sb.files.write("w/a.txt", "1")
ev = [(e.type, e.name) for e in h.get_new_events()]
check("a new file: create, write, chmod", ev == [(FilesystemEventType.CREATE, "a.txt"), (FilesystemEventType.WRITE, "a.txt"), (FilesystemEventType.CHMOD, "a.txt")], ev)
sb.commands.run("echo more >> /home/user/w/a.txt && rm /home/user/w/a.txt")
evs = h.get_new_events()
check("command writes and removes are seen", [e.type for e in evs] == [FilesystemEventType.WRITE, FilesystemEventType.REMOVE], evs)
sb.files.write("w/b.txt", "2")
entries = [e.entry for e in h.get_new_events() if e.type == FilesystemEventType.WRITE]
check("events carry entries", entries and entries[0].path == "/home/user/w/b.txt" and entries[0].type == FileType.FILE, entries)
h.stop()
h = sb.files.watch_dir("w", recursive=True)
sb.files.make_dir("w/sub")
sb.files.write("w/sub/c.txt", "3")
ev = [(e.type, e.name) for e in h.get_new_events()]
check("recursive: the new directory and the file in it", (FilesystemEventType.CREATE, "sub") in ev and (FilesystemEventType.WRITE, "sub/c.txt") in ev, ev)
h.stop()
raises("watching a missing directory", Exception, sb.files.watch_dir, "no-such-dir")

# List: pagination newest first, started_after.
sb2 = Sandbox.create(timeout=60, metadata={"envd": tag})
p = Sandbox.list(query=SandboxQuery(metadata={"envd": tag}), limit=1)
first = p.next_items()
check("page one is the newest", [s.sandbox_id for s in first] == [sb2.sandbox_id] and p.has_next, first)
second = p.next_items()
check("page two the next, and the last", [s.sandbox_id for s in second] == [sb.sandbox_id] and not p.has_next, second)
started = sb2.get_info().started_at
later = Sandbox.list(query=SandboxQuery(metadata={"envd": tag}, started_after=started + datetime.timedelta(seconds=1))).next_items()
check("started_after filters", later == [], later)
sb2.kill()

# Metrics over a range: now is in it, an hour ago is not.
now = datetime.datetime.now(datetime.timezone.utc)
check("metrics in range", len(sb.get_metrics(start=now - datetime.timedelta(minutes=1), end=now)) == 1)
check("metrics before the sandbox", sb.get_metrics(start=now - datetime.timedelta(hours=2), end=now - datetime.timedelta(hours=1)) == [])

sb.kill()
done("envd")
