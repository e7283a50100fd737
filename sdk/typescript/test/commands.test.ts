import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";

import { CommandExitError, InvalidArgumentError, NotFoundError, Sandbox, TimeoutError } from "@glovebox/sdk";
import { eventually, useDaemon } from "./daemon.js";

useDaemon();

describe("commands", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ timeoutMs: 120_000 });
  });
  after(async () => {
    await sb?.kill();
  });

  it("runs a shell string and an argv array", async () => {
    const r = await sb.commands.run("echo hello; echo oops >&2");
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "hello\n");
    assert.equal(r.stderr, "oops\n");
    assert.equal(r.timedOut, false);
    assert.equal(r.oomKilled, false);
    assert.equal(r.stdoutTruncated, false);
    assert.equal(typeof r.id, "number");
    assert.equal(typeof r.durationMs, "number");
    const a = await sb.commands.run(["printf", "%s|", "a b", "$HOME"]);
    assert.equal(a.stdout, "a b|$HOME|", "argv is not re-parsed by a shell");
  });

  it("returns a non-zero exit code without throwing; check: true throws", async () => {
    const r = await sb.commands.run("echo out; exit 3");
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, "out\n");
    await assert.rejects(sb.commands.run("echo out; echo err >&2; exit 4", { check: true }), (e: unknown) => {
      assert.ok(e instanceof CommandExitError);
      assert.equal(e.exitCode, 4);
      assert.equal(e.stdout, "out\n");
      assert.equal(e.stderr, "err\n");
      assert.equal(e.result.exitCode, 4);
      assert.match(e.message, /exited with code 4: err/);
      return true;
    });
    assert.equal((await sb.commands.run("true", { check: true })).exitCode, 0);
  });

  it("a command over its timeout is killed and flagged, quickly", async () => {
    const t0 = Date.now();
    const r = await sb.commands.run("sleep 5", { timeoutMs: 1000 });
    const took = Date.now() - t0;
    assert.equal(r.timedOut, true);
    assert.notEqual(r.exitCode, 0);
    assert.ok(took < 3000, `took ${took} ms`);
    await assert.rejects(
      sb.commands.run("sleep 5", { timeoutMs: 300, check: true }),
      (e: unknown) => e instanceof TimeoutError && e.code === "timeout" && e.result?.timedOut === true,
    );
  });

  it("passes stdin (text and exact bytes), env and cwd", async () => {
    assert.equal((await sb.commands.run("cat", { stdin: "from stdin" })).stdout, "from stdin");
    const bytes = new Uint8Array([0, 1, 2, 250, 255]);
    const od = await sb.commands.run("od -An -tu1 | tr -s ' '", { stdin: bytes });
    assert.equal(od.stdout.trim(), "0 1 2 250 255");
    const e = await sb.commands.run("echo $A-$B", { env: { A: "x", B: "y z" } });
    assert.equal(e.stdout, "x-y z\n");
    await sb.files.makeDir("/tmp/work dir");
    assert.equal((await sb.commands.run("pwd", { cwd: "/tmp/work dir" })).stdout, "/tmp/work dir\n");
    assert.equal((await sb.commands.run("pwd")).stdout, "/home/user\n");
  });

  it("truncates output beyond maxOutputBytes to its head and tail, and says so", async () => {
    const r = await sb.commands.run("head -c 10000 /dev/zero | tr '\\0' a", { maxOutputBytes: 100 });
    // Half the cap for the head, the rest for the marker and the tail.
    const m = /^(a{50})\n\[glovebox: (\d+) bytes dropped\]\n(a+)$/.exec(r.stdout);
    assert.ok(m, `head, marker, tail: ${JSON.stringify(r.stdout)}`);
    assert.equal(r.stdout.length, 100);
    assert.equal(m[1].length + Number(m[2]) + m[3].length, 10000);
    assert.equal(r.stdoutTruncated, true);
    assert.equal(r.stdoutBytes, 10000);
    // outputTailBytes: 0 keeps the first part only.
    const head = await sb.commands.run("head -c 10000 /dev/zero | tr '\\0' a", {
      maxOutputBytes: 100,
      outputTailBytes: 0,
    });
    assert.equal(head.stdout, "a".repeat(100));
    assert.equal(head.stdoutTruncated, true);
  });

  it("streams output to callbacks as it happens", async () => {
    const out: string[] = [];
    const err: string[] = [];
    const times: number[] = [];
    const t0 = Date.now();
    const r = await sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done; echo bad >&2; exit 2", {
      onStdout: (d) => {
        out.push(d);
        times.push(Date.now() - t0);
      },
      onStderr: (d) => err.push(d),
    });
    assert.equal(out.join(""), "line1\nline2\nline3\n");
    assert.equal(err.join(""), "bad\n");
    assert.equal(r.exitCode, 2, "the streamed result carries the exit code");
    assert.equal(r.stdout, "line1\nline2\nline3\n", "and the output it streamed");
    assert.equal(r.stderr, "bad\n");
    assert.ok(out.length >= 2, `output came in ${out.length} chunk(s)`);
    assert.ok((times[0] ?? Infinity) < (times[times.length - 1] ?? 0), "chunks arrived over time, not at the end");
  });

  it("streams multi-byte characters split across chunks intact", async () => {
    const chunks: string[] = [];
    // "é" is 0xC3 0xA9: write its two bytes in separate writes, a pause between them.
    const r = await sb.commands.run("printf '\\303'; sleep 0.2; printf '\\251\\n'", {
      onStdout: (d) => chunks.push(d),
    });
    assert.equal(chunks.join(""), "é\n");
    assert.equal(r.stdout, "é\n");
  });

  it("an AbortSignal cancels a long stream; the command goes on until its timeout", async () => {
    const ac = new AbortController();
    const seen: string[] = [];
    const t0 = Date.now();
    const p = sb.commands.run("echo started; sleep 30; echo never", {
      timeoutMs: 4000,
      onStdout: (d) => {
        seen.push(d);
        ac.abort();
      },
      signal: ac.signal,
    });
    await assert.rejects(p, { name: "AbortError" });
    assert.ok(Date.now() - t0 < 3000, "the abort returned promptly");
    assert.deepEqual(seen, ["started\n"]);
    // The daemon keeps it running (listed) until its timeout ends it.
    const listed = await sb.commands.list();
    const mine = listed.find((c) => c.cmd === "echo started; sleep 30; echo never");
    assert.ok(mine, "the aborted command is listed");
    assert.equal(mine.running, true);
    await sb.commands.connect(mine.id).kill();
    const done = await sb.commands.connect(mine.id).wait();
    assert.equal(done.exitCode, 137);
  });

  it("background: sendStdin, close, wait", async () => {
    const h = await sb.commands.run("cat; echo done >&2", { background: true });
    assert.equal(typeof h.id, "number");
    assert.equal(typeof h.pid, "number");
    await h.sendStdin("one ");
    await h.sendStdin(new TextEncoder().encode("two"), { close: true });
    const r = await h.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "one two");
    assert.equal(r.stderr, "done\n");
  });

  it("background: list shows it running; kill ends it", async () => {
    const h = await sb.commands.run(["sleep", "60"], { background: true });
    const running = await sb.commands.list();
    const entry = running.find((c) => c.id === h.id);
    assert.ok(entry);
    assert.equal(entry.running, true);
    assert.deepEqual(entry.cmd, ["sleep", "60"]);
    await h.kill("SIGTERM");
    const r = await h.wait();
    assert.equal(r.signal, 15);
    assert.equal(r.exitCode, 128 + 15);
    const ended = await eventually(async () => (await sb.commands.list()).find((c) => c.id === h.id && !c.running));
    assert.equal(ended.exitCode, 143);
  });

  it("background: closeStdin, default SIGKILL, check on wait", async () => {
    const h = await sb.commands.run("read x; exit 5", { background: true, check: true });
    await h.closeStdin();
    await assert.rejects(h.wait(), (e: unknown) => e instanceof CommandExitError && e.exitCode === 5);
    const k = await sb.commands.run("sleep 60", { background: true });
    await k.kill();
    assert.equal((await k.wait()).exitCode, 137);
    await assert.rejects(k.kill("SIGNOPE" as "SIGTERM"), InvalidArgumentError);
  });

  it("background with callbacks is refused; an unknown command is NotFoundError", async () => {
    await assert.rejects(
      sb.commands.run("true", { background: true, onStdout: () => {} } as never),
      InvalidArgumentError,
    );
    await assert.rejects(sb.commands.connect(999_999).wait(), NotFoundError);
  });

  it("a bad cwd is an error result or a typed error, never a hang", async () => {
    const r = await sb.commands
      .run("pwd", { cwd: "/no/such/dir" })
      .then((x) => x.exitCode, (e: unknown) => (e instanceof Error ? e.name : String(e)));
    assert.notEqual(r, 0);
  });
});
