import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";

import { ConflictError, NotFoundError, Sandbox } from "@glovebox/sdk";
import { useDaemon } from "./daemon.js";

useDaemon();

async function collect(s: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const c of s as unknown as AsyncIterable<Uint8Array>) parts.push(c);
  return Buffer.concat(parts);
}

describe("files", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ timeoutMs: 120_000, diskMb: 256 });
  });
  after(async () => {
    await sb?.kill();
  });

  it("round-trips text, with relative paths under /home/user", async () => {
    const info = await sb.files.write("hello.txt", "héllo wörld\n");
    assert.equal(info.path, "/home/user/hello.txt");
    assert.equal(info.type, "file");
    assert.equal(info.size, Buffer.byteLength("héllo wörld\n"));
    assert.equal(await sb.files.read("/home/user/hello.txt"), "héllo wörld\n");
    assert.equal((await sb.commands.run("cat hello.txt")).stdout, "héllo wörld\n");
  });

  it("round-trips bytes exactly, and sets the mode", async () => {
    const data = new Uint8Array(256).map((_, i) => i);
    const info = await sb.files.write("/tmp/all-bytes.bin", data, { mode: 0o600 });
    assert.equal(info.mode & 0o777, 0o600);
    const back = await sb.files.read("/tmp/all-bytes.bin", { format: "bytes" });
    assert.ok(back instanceof Uint8Array);
    assert.deepEqual(Buffer.from(back), Buffer.from(data));
  });

  it("round-trips 5 MiB streamed both ways", async () => {
    const data = randomBytes(5 * 1024 * 1024);
    let i = 0;
    const chunk = 256 * 1024;
    const upload = new ReadableStream<Uint8Array>({
      pull(c) {
        if (i >= data.length) return c.close();
        c.enqueue(data.subarray(i, i + chunk));
        i += chunk;
      },
    });
    const info = await sb.files.write("big/5mib.bin", upload);
    assert.equal(info.size, data.length);
    assert.equal(info.path, "/home/user/big/5mib.bin", "missing parents are created");
    const sum = await sb.commands.run("sha256sum big/5mib.bin | cut -d' ' -f1");
    const { createHash } = await import("node:crypto");
    assert.equal(sum.stdout.trim(), createHash("sha256").update(data).digest("hex"));
    const back = await collect(await sb.files.read("big/5mib.bin", { format: "stream" }));
    assert.equal(back.length, data.length);
    assert.ok(Buffer.from(back).equals(data));
    const bytes = await sb.files.read("big/5mib.bin", { format: "bytes" });
    assert.ok(Buffer.from(bytes).equals(data));
  });

  it("writes from an async iterable (e.g. a Node stream)", async () => {
    async function* gen(): AsyncGenerator<string | Uint8Array> {
      yield "part one, ";
      yield new TextEncoder().encode("part two");
    }
    await sb.files.write("gen.txt", gen());
    assert.equal(await sb.files.read("gen.txt"), "part one, part two");
  });

  it("makeDir, list (with depth), exists, getInfo", async () => {
    const d = await sb.files.makeDir("tree/a/b");
    assert.equal(d.type, "dir");
    assert.equal(d.path, "/home/user/tree/a/b");
    await sb.files.write("tree/top.txt", "t");
    await sb.files.write("tree/a/b/deep.txt", "d");
    await sb.commands.run("ln -s top.txt tree/link");

    const one = await sb.files.list("tree");
    assert.deepEqual(one.map((e) => e.name).sort(), ["a", "link", "top.txt"]);
    const all = await sb.files.list("tree", { depth: 3 });
    assert.deepEqual(
      all.map((e) => e.path).sort(),
      ["/home/user/tree/a", "/home/user/tree/a/b", "/home/user/tree/a/b/deep.txt", "/home/user/tree/link", "/home/user/tree/top.txt"],
    );
    const link = await sb.files.getInfo("tree/link");
    assert.equal(link.type, "symlink");
    assert.equal(link.target, "top.txt");
    const top = await sb.files.getInfo("tree/top.txt");
    assert.equal(top.size, 1);
    assert.ok(top.mtime instanceof Date && Math.abs(top.mtime.getTime() - Date.now()) < 600_000);

    assert.equal(await sb.files.exists("tree/top.txt"), true);
    assert.equal(await sb.files.exists("tree/a"), true);
    assert.equal(await sb.files.exists("tree/missing"), false);
    assert.equal(await sb.files.exists("tree/top.txt/below"), false);
  });

  it("rename and remove (recursive for trees)", async () => {
    await sb.files.write("mv/src.txt", "moving");
    const moved = await sb.files.rename("mv/src.txt", "mv/dst.txt");
    assert.equal(moved.path, "/home/user/mv/dst.txt");
    assert.equal(await sb.files.exists("mv/src.txt"), false);
    assert.equal(await sb.files.read("mv/dst.txt"), "moving");

    await sb.files.remove("mv/dst.txt");
    assert.equal(await sb.files.exists("mv/dst.txt"), false);
    await sb.files.write("mv/sub/f.txt", "x");
    await assert.rejects(sb.files.remove("mv"), (e: unknown) => e instanceof ConflictError && e.code === "directory_not_empty");
    await sb.files.remove("mv", { recursive: true });
    assert.equal(await sb.files.exists("mv"), false);
  });

  it("missing files are NotFoundError", async () => {
    await assert.rejects(sb.files.read("nope.txt"), (e: unknown) => e instanceof NotFoundError && e.code === "file_not_found");
    await assert.rejects(sb.files.getInfo("nope.txt"), NotFoundError);
    await assert.rejects(sb.files.remove("nope.txt"), NotFoundError);
  });

  it("traversal with .. and symlinks stays inside the sandbox", async () => {
    const canary = `glovebox-sdk-canary-${randomBytes(6).toString("hex")}`;
    const info = await sb.files.write(`../../../../../../tmp/${canary}`, "inside");
    assert.equal(info.path, `/tmp/${canary}`, "resolved against the sandbox root");
    assert.equal(existsSync(`/tmp/${canary}`), false, "nothing written on the host");
    assert.equal((await sb.commands.run(`cat /tmp/${canary}`)).stdout, "inside");

    // A symlink pointing at "/" resolves to the sandbox's own root, not the host's.
    await sb.commands.run("ln -s / /home/user/rootlink && ln -s ../../../../etc /home/user/etclink");
    await sb.files.write(`rootlink/tmp/${canary}-2`, "via link");
    assert.equal(existsSync(`/tmp/${canary}-2`), false);
    assert.equal(await sb.files.read(`/tmp/${canary}-2`), "via link");
    const hostname = await sb.files.read("etclink/hostname").catch(() => null);
    const inside = await sb.commands.run("cat /etc/hostname 2>/dev/null");
    if (hostname !== null) assert.equal(hostname, inside.stdout, "etclink reads the sandbox's /etc");
  });
});
