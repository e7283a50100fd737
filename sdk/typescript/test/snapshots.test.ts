import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

import { ConflictError, InvalidArgumentError, NotFoundError, Sandbox, Snapshot } from "@glovebox/sdk";
import { useDaemon } from "./daemon.js";

useDaemon();

describe("snapshots", () => {
  it("snapshot, create from it, fork with lineage, delete", async () => {
    const name = `s-${randomBytes(4).toString("hex")}`;
    await Sandbox.with({ metadata: { who: "parent" } }, async (sb) => {
      assert.equal((await sb.commands.run("mkdir -p /w && echo one > /w/f")).exitCode, 0);
      const s = await sb.snapshot(name);
      assert.deepEqual([s.name, s.template, s.sourceSandbox], [name, "base", sb.id]);
      await assert.rejects(sb.snapshot(name), (e: unknown) => e instanceof ConflictError && e.code === "conflict");
      assert.ok((await Snapshot.list()).some((x) => x.name === name));
      await Sandbox.with({ snapshot: name }, async (c) => {
        assert.equal((await c.info()).snapshot, name);
        assert.equal((await c.commands.run("cat /w/f")).stdout, "one\n");
      });
      const kids = await sb.fork(2);
      try {
        assert.equal(kids.length, 2);
        for (const k of kids) {
          const i = await k.info();
          assert.deepEqual([i.parentId, i.ancestors, i.metadata], [sb.id, [sb.id], { who: "parent" }]);
          assert.equal((await k.commands.run("cat /w/f")).stdout, "one\n");
        }
        await kids[0]!.commands.run("echo mine > /w/g");
        assert.notEqual((await kids[1]!.commands.run("test -e /w/g")).exitCode, 0);
      } finally {
        for (const k of kids) await k.kill();
      }
      await assert.rejects(sb.fork(0), (e: unknown) => e instanceof InvalidArgumentError);
    });
    await Snapshot.delete(name);
    await assert.rejects(Snapshot.get(name), (e: unknown) => e instanceof NotFoundError && e.code === "snapshot_not_found");
  });
});
