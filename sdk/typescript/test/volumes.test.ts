import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

import { ConflictError, InvalidArgumentError, NotFoundError, Sandbox, Volume } from "@glovebox/sdk";
import { useDaemon } from "./daemon.js";

useDaemon();

describe("volumes", () => {
  it("carry data from one sandbox to the next, read-only where asked", async () => {
    const name = `v-${randomBytes(4).toString("hex")}`;
    const v = await Volume.create(name, 32);
    assert.deepEqual([v.name, v.sizeMb, v.mountedBy], [name, 32, 0]);
    try {
      await assert.rejects(Volume.create(name, 32), (e: unknown) => e instanceof ConflictError && e.code === "conflict");
      await Sandbox.with({ volumes: [`${name}:/data`] }, async (a) => {
        assert.equal((await a.commands.run("echo kept > /data/f")).exitCode, 0);
        assert.equal((await Volume.get(name)).mountedBy, 1);
        await assert.rejects(
          Volume.delete(name),
          (e: unknown) => e instanceof ConflictError && e.code === "volume_in_use",
        );
      });
      await Sandbox.with({ volumes: [{ name, path: "/ro", readOnly: true }] }, async (b) => {
        assert.equal((await b.commands.run("cat /ro/f")).stdout, "kept\n");
        const w = await b.commands.run("touch /ro/g");
        assert.ok(w.exitCode !== 0 && w.stderr.includes("Read-only"), w.stderr);
      });
      assert.ok((await Volume.list()).some((x) => x.name === name));
      await assert.rejects(
        Sandbox.create({ volumes: ["no-such-volume:/data"] }),
        (e: unknown) => e instanceof NotFoundError && e.code === "volume_not_found",
      );
      await assert.rejects(Sandbox.create({ volumes: [`${name}:/proc/x`] }), (e: unknown) => e instanceof InvalidArgumentError);
      await assert.rejects(Sandbox.create({ volumes: ["nopath"] }), (e: unknown) => e instanceof InvalidArgumentError);
    } finally {
      // The last sandbox's release may still be under way.
      const end = Date.now() + 10_000;
      for (;;) {
        try {
          await Volume.delete(name);
          break;
        } catch (e) {
          if (!(e instanceof ConflictError) || Date.now() > end) throw e;
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    }
    await assert.rejects(Volume.get(name), (e: unknown) => e instanceof NotFoundError);
  });
});
