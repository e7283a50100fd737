import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";

import { InvalidArgumentError, NotFoundError, Sandbox } from "@glovebox/sdk";
import type { PtyHandle } from "@glovebox/sdk";
import { eventually, useDaemon } from "./daemon.js";

useDaemon();

/** Attaches, runs `afterAttach`, reads `t`'s output until `want` shows, then detaches (the
 * test runner's timeout bounds a read that never comes). */
async function readUntil(t: PtyHandle, want: string, afterAttach: () => Promise<void>): Promise<string> {
  let seen = "";
  const dec = new TextDecoder();
  const out = t.output();
  const first = out.next();
  await afterAttach();
  let r = await first;
  const end = Date.now() + 20_000;
  while (!r.done) {
    seen += dec.decode(r.value, { stream: true });
    if (seen.includes(want)) break;
    assert.ok(Date.now() < end, `no ${want} in ${JSON.stringify(seen)}`);
    r = await out.next();
  }
  await out.return(undefined);
  assert.ok(seen.includes(want), `the terminal ended before ${want}: ${JSON.stringify(seen)}`);
  return seen;
}

describe("pty", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ timeoutMs: 120_000 });
  });
  after(async () => {
    await sb?.kill();
  });

  it("runs a shell on a terminal: size, resize, Ctrl-C, exit code", async () => {
    const t = await sb.pty.create({ cols: 80, rows: 24 });
    assert.equal(typeof t.id, "number");
    const out = await readUntil(t, "sum-42", () => t.sendInput("stty size; echo sum-$((6*7))\n"));
    assert.ok(out.includes("24 80"), out);
    await t.resize(100, 30);
    await readUntil(t, "30 100", () => t.sendInput("stty size\n"));
    await t.sendInput("sleep 100\n");
    await eventually(async () => (await sb.commands.run("pgrep -x sleep")).exitCode === 0);
    await t.sendInput("\x03");
    await readUntil(t, "after-2", () => t.sendInput("echo after-$((1+1))\n"));
    assert.equal((await sb.commands.run("pgrep -x sleep")).exitCode, 1);
    await sb.pty.sendInput(t.id, "exit 4\n");
    assert.equal((await t.wait()).exitCode, 4);
  });

  it("runs a given command and passes its output to onData", async () => {
    const t = await sb.pty.create({ cmd: ["/bin/sh", "-c", "echo $FOO; pwd; exit 3"], cwd: "/tmp", envs: { FOO: "bar" } });
    const chunks: Uint8Array[] = [];
    const r = await t.wait({ onData: (c) => chunks.push(c) });
    assert.equal(r.exitCode, 3);
    const text = Buffer.concat(chunks).toString("utf8");
    assert.ok(text.includes("bar") && text.includes("/tmp"), text);
  });

  it("refuses bad sizes and unknown terminals", async () => {
    await assert.rejects(sb.pty.create({ cols: 0 }), InvalidArgumentError);
    await assert.rejects(sb.pty.create({ rows: 1001 }), InvalidArgumentError);
    await assert.rejects(sb.pty.resize(99999, 80, 24), NotFoundError);
    await assert.rejects(sb.pty.connect(99999).output().next(), NotFoundError);
    const t = await sb.pty.create();
    await sb.pty.kill(t.id);
    assert.equal((await t.wait()).signal, 9);
  });
});
