import { describe, it } from "node:test";
import assert from "node:assert/strict";

import {
  AuthError,
  GloveboxError,
  InvalidArgumentError,
  NotFoundError,
  NotSupportedError,
  Sandbox,
  SandboxGoneError,
} from "@glovebox/sdk";
import { existsSync } from "node:fs";
import { release } from "node:os";

import { useDaemon } from "./daemon.js";

const daemon = useDaemon();

describe("sandbox lifecycle", () => {
  it("creates with options, reports info, and kills", async () => {
    const sb = await Sandbox.create({
      timeoutMs: 120_000,
      cpus: 0.5,
      memoryMb: 256,
      pids: 64,
      env: { GREETING: "hi" },
      metadata: { suite: "lifecycle" },
    });
    try {
      const info = await sb.info();
      assert.equal(info.id, sb.id);
      assert.equal(info.state, "running");
      assert.equal(info.template, "base");
      assert.deepEqual(info.limits.memoryMb, 256);
      assert.equal(info.limits.cpus, 0.5);
      assert.equal(info.limits.pids, 64);
      assert.deepEqual(info.metadata, { suite: "lifecycle" });
      assert.equal(info.network.mode, "deny-all");
      assert.ok(info.createdAt instanceof Date);
      const left = info.expiresAt.getTime() - Date.now();
      assert.ok(left > 100_000 && left <= 121_000, `expires in ${left} ms`);
      const r = await sb.commands.run("echo $GREETING");
      assert.equal(r.stdout, "hi\n");
    } finally {
      assert.equal(await sb.kill(), true);
    }
    await assert.rejects(sb.info(), (e: unknown) => {
      assert.ok(e instanceof SandboxGoneError);
      assert.equal(e.reason, "killed");
      assert.equal(e.status, 410);
      assert.equal(e.code, "sandbox_gone");
      return true;
    });
    assert.equal(await sb.kill(), false, "a second kill reports it was already gone");
  });

  it("Sandbox.with kills the sandbox when the callback throws", async () => {
    let id = "";
    await assert.rejects(
      Sandbox.with({}, async (sb) => {
        id = sb.id;
        await sb.commands.run("true");
        throw new Error("boom");
      }),
      /boom/,
    );
    assert.notEqual(id, "");
    const err = await Sandbox.connect(id).then(
      () => assert.fail("connect to a killed sandbox succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof SandboxGoneError, String(err));
    assert.equal(err.reason, "killed");
  });

  it("Sandbox.with returns the callback's value and kills", async () => {
    let id = "";
    const out = await Sandbox.with({}, async (sb) => {
      id = sb.id;
      return (await sb.commands.run(["echo", "-n", "value"])).stdout;
    });
    assert.equal(out, "value");
    await assert.rejects(Sandbox.connect(id), SandboxGoneError);
  });

  it("await using kills at the end of the block", async () => {
    let id = "";
    {
      await using sb = await Sandbox.create();
      id = sb.id;
      assert.equal((await sb.info()).state, "running");
    }
    await assert.rejects(Sandbox.connect(id), (e: unknown) => e instanceof SandboxGoneError && e.reason === "killed");
  });

  it("connects to an existing sandbox by id", async () => {
    await Sandbox.with({}, async (sb) => {
      await sb.files.write("note.txt", "shared");
      const again = await Sandbox.connect(sb.id, { url: daemon.current.url, apiKey: daemon.current.apiKey });
      assert.equal(again.id, sb.id);
      assert.equal(await again.files.read("note.txt"), "shared");
    });
  });

  it("setTimeout moves the deadline", async () => {
    await Sandbox.with({ timeoutMs: 60_000 }, async (sb) => {
      const before = await sb.info();
      const later = await sb.setTimeout(600_000);
      const left = later.expiresAt.getTime() - Date.now();
      assert.ok(left > 590_000 && left <= 601_000, `expires in ${left} ms`);
      assert.ok(later.expiresAt > before.expiresAt);
      const sooner = await sb.setTimeout(1500); // rounded up to whole seconds: 2 s
      assert.ok(sooner.expiresAt.getTime() - Date.now() <= 2100);
      await assert.rejects(sb.setTimeout(0), InvalidArgumentError);
    });
  });

  it("setMetadata and setIdleTimeout change a live sandbox", async () => {
    const tag = `t${Date.now()}`;
    await Sandbox.with({ timeoutMs: 60_000, metadata: { suite: tag, role: "a" } }, async (sb) => {
      const info = await sb.setMetadata({ suite: tag, role: "b" });
      assert.deepEqual(info.metadata, { suite: tag, role: "b" });
      const listed = await Sandbox.list({ metadata: { suite: tag, role: "b" } });
      assert.deepEqual(listed.map((s) => s.id), [sb.id]);
      assert.equal((await sb.setIdleTimeout(600_000)).idleTimeoutMs, 600_000);
      assert.deepEqual((await sb.info()).metadata, { suite: tag, role: "b" }, "only what is given changes");
      assert.equal((await sb.setIdleTimeout(0)).idleTimeoutMs, undefined);
      await assert.rejects(sb.setIdleTimeout(1e12), InvalidArgumentError);
      assert.equal((await sb.info()).idleTimeoutMs, undefined, "a refused change changes nothing");
    });
  });

  it("pause stops the lifetime clock, resume and commands resume it", async () => {
    await Sandbox.with({ timeoutMs: 2000 }, async (sb) => {
      await sb.commands.run("echo kept > /tmp/state");
      assert.equal((await sb.pause()).state, "paused");
      assert.equal((await sb.pause()).state, "paused", "pause is idempotent");
      await new Promise((r) => setTimeout(r, 2500)); // past its lifetime: paused, it stays
      assert.equal((await sb.info()).state, "paused");
      assert.equal((await sb.resume()).state, "running");
      await sb.pause();
      const r = await sb.commands.run("cat /tmp/state");
      assert.equal(r.stdout, "kept\n");
      assert.equal((await sb.info()).state, "running", "a command resumed it");
    });
  });

  it("onIdle pause pauses an idle sandbox; hibernate is not supported here", async () => {
    await Sandbox.with({ idleTimeoutMs: 1000, onIdle: "pause" }, async (sb) => {
      // No request meanwhile: every request on it counts as activity.
      await new Promise((r) => setTimeout(r, 2500));
      assert.equal((await sb.info()).state, "paused");
    });
    await assert.rejects(Sandbox.create({ idleTimeoutMs: 1000, onIdle: "hibernate" }), NotSupportedError);
  });

  it("a sandbox whose lifetime ends reports reason timeout", async () => {
    const sb = await Sandbox.create({ timeoutMs: 1000 });
    const deadline = Date.now() + 10_000;
    let err: unknown;
    while (Date.now() < deadline) {
      err = await sb.info().then(
        () => undefined,
        (e: unknown) => e,
      );
      if (err !== undefined) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(err instanceof SandboxGoneError, `still alive or wrong error: ${String(err)}`);
    assert.equal(err.reason, "timeout");
    await assert.rejects(sb.commands.run("true"), SandboxGoneError);
  });

  it("lists sandboxes filtered by metadata", async () => {
    const a = await Sandbox.create({ metadata: { team: "red", run: "list-1" } });
    const b = await Sandbox.create({ metadata: { team: "blue", run: "list-1" } });
    try {
      const all = (await Sandbox.list()).map((s) => s.id);
      assert.ok(all.includes(a.id) && all.includes(b.id));
      const red = await Sandbox.list({ metadata: { team: "red" } });
      assert.deepEqual(
        red.map((s) => s.id),
        [a.id],
      );
      assert.deepEqual(red[0]?.metadata, { team: "red", run: "list-1" });
      const both = (await Sandbox.list({ metadata: { run: "list-1" } })).map((s) => s.id).sort();
      assert.deepEqual(both, [a.id, b.id].sort());
      const none = await Sandbox.list({ metadata: { team: "red", run: "other" } });
      assert.deepEqual(none, []);
    } finally {
      await a.kill();
      await b.kill();
    }
  });

  it("isolation gvisor runs the sandbox on gVisor's kernel; the default is the process jail", async (t) => {
    if (!existsSync("/usr/bin/runsc")) {
      t.skip("runsc is not installed (scripts/deps installs Debian's runsc)");
      return;
    }
    await Sandbox.with({ isolation: "gvisor", timeoutMs: 60_000 }, async (sb) => {
      assert.equal((await sb.info()).isolation, "gvisor");
      const r = await sb.commands.run("uname -r");
      assert.notEqual(r.stdout.trim(), release(), "it ran on the host's kernel");
      await sb.files.write("tier.txt", "gvisor");
      assert.equal(await sb.files.read("tier.txt"), "gvisor");
    });
    await Sandbox.with({}, async (sb) => {
      assert.equal((await sb.info()).isolation, "process");
      assert.equal((await sb.commands.run("uname -r")).stdout.trim(), release());
    });
  });
});

describe("typed errors", () => {
  it("a wrong API key is an AuthError", async () => {
    await assert.rejects(Sandbox.create({ apiKey: "wrong" }), (e: unknown) => {
      assert.ok(e instanceof AuthError);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthorized");
      assert.match(e.message, /GLOVEBOX_API_KEY/);
      return true;
    });
    await assert.rejects(Sandbox.list({ apiKey: "wrong" }), AuthError);
  });

  it("a resource out of bounds is an InvalidArgumentError naming it", async () => {
    await assert.rejects(Sandbox.create({ memoryMb: 1 }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.equal(e.status, 400);
      assert.match(e.message, /memory_mb/);
      return true;
    });
    await assert.rejects(Sandbox.create({ cpus: 1000 }), InvalidArgumentError);
  });

  it("an unknown sandbox is a NotFoundError, a gone one a SandboxGoneError", async () => {
    await assert.rejects(Sandbox.connect("nosuchsandbox"), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.code, "sandbox_not_found");
      return true;
    });
    const sb = await Sandbox.create();
    await sb.kill();
    await assert.rejects(sb.files.read("x"), SandboxGoneError);
    await assert.rejects(sb.runCode("1"), SandboxGoneError);
  });

  it("an unknown isolation is the daemon's invalid_request, as an InvalidArgumentError", async () => {
    await assert.rejects(Sandbox.create({ isolation: "firecracker" }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.equal(e.status, 400);
      assert.equal(e.code, "invalid_request");
      assert.match(e.message, /isolation: unknown variant `firecracker`/);
      return true;
    });
  });

  it("an unknown template is a NotFoundError", async () => {
    await assert.rejects(Sandbox.create({ template: "no-such-template" }), NotFoundError);
  });

  it("an unreachable daemon is a GloveboxError, not a bare TypeError", async () => {
    // A port nothing listens on: bind one, take its number, close it.
    const { createServer } = await import("node:net");
    const port = await new Promise<number>((resolve) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const a = s.address();
        s.close(() => resolve(typeof a === "object" && a !== null ? a.port : 1));
      });
    });
    await assert.rejects(Sandbox.create({ url: `http://127.0.0.1:${port}` }), (e: unknown) => {
      assert.ok(e instanceof GloveboxError);
      assert.equal(e.code, "connection_error");
      assert.match(e.message, /cannot reach glovebox/);
      return true;
    });
  });

  it("an aborted create rejects with the abort reason", async () => {
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(Sandbox.create({ signal: ac.signal }), { name: "AbortError" });
  });
});

/** A stand-in daemon on loopback that knows no route at all (like an older glovebox). */
async function routelessDaemon(): Promise<{ url: string; close: () => Promise<void> }> {
  const { createServer } = await import("node:http");
  const server = createServer((req, res) => {
    req.resume();
    const json = (status: number, body: unknown): void => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.method === "POST" && req.url === "/v1/sandboxes") {
      json(201, {
        id: "fake", template: "base", state: "running",
        created_at: new Date().toISOString(), expires_at: new Date().toISOString(),
        limits: { cpus: 1, memory_mb: 512, disk_mb: 1024, pids: 256 }, metadata: {}, network: { mode: "deny-all" },
      });
    } else {
      json(404, { error: { code: "not_found", message: "no such route" } });
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const a = server.address();
  const port = typeof a === "object" && a !== null ? a.port : 0;
  return { url: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(() => r())) };
}

function isNotSupported(e: unknown): boolean {
  assert.ok(e instanceof NotSupportedError, String(e));
  assert.ok(e instanceof GloveboxError);
  assert.ok(!(e instanceof NotFoundError), "not a plain NotFoundError");
  assert.equal(e.code, "not_supported");
  assert.equal(e.status, 404);
  assert.match(e.message, /not supported by this daemon/);
  return true;
}

describe("network and metrics routes", () => {
  it("a daemon without them answers 404 not_found: a clear not-supported error", async () => {
    const fake = await routelessDaemon();
    try {
      const sb = await Sandbox.create({ url: fake.url, apiKey: "k" });
      await assert.rejects(sb.updateNetwork({ mode: "deny-all" }), isNotSupported);
      await assert.rejects(sb.egressLog(), isNotSupported);
      await assert.rejects(sb.metrics(), isNotSupported);
      // A 404 with another code (the sandbox is unknown) stays a NotFoundError.
      await assert.rejects(sb.info(), (e: unknown) => e instanceof NotFoundError && e.code === "not_found");
    } finally {
      await fake.close();
    }
  });

  it("live network updates and the egress audit against this daemon", async () => {
    await Sandbox.with({}, async (sb) => {
      const info = await sb.updateNetwork({ mode: "allow-list", allow: ["api.good.test"] });
      assert.equal((info.network as { mode?: string }).mode, "allow-list");
      const r = await sb.commands.run([
        "python3",
        "-c",
        "import socket\ntry:\n socket.gethostbyname('blocked.evil.test'); print('resolved')\nexcept OSError:\n print('nxdomain')",
      ]);
      assert.equal(r.stdout.trim(), "nxdomain");
      const log = await sb.egressLog();
      assert.ok(
        log.some((e) => (e as { name?: string }).name === "blocked.evil.test" && (e as { allowed?: boolean }).allowed === false),
        JSON.stringify(log),
      );
      const back = await sb.updateNetwork({ mode: "deny-all" });
      assert.equal((back.network as { mode?: string }).mode, "deny-all");
      await assert.rejects(sb.updateNetwork({ mode: "allow-list" }), InvalidArgumentError);
    });
  });

  it("metrics report the sandbox's usage and limits", async (t) => {
    await Sandbox.with({ memoryMb: 256, pids: 64 }, async (sb) => {
      const first = await sb.metrics().catch((e: unknown) => (isNotSupported(e) ? null : null));
      if (first === null) {
        t.skip("this daemon has no metrics route");
        return;
      }
      assert.equal(first.memoryLimitBytes, 256 * 1024 * 1024);
      assert.equal(first.pidsLimit, 64);
      assert.ok(first.pids >= 1, `pids ${first.pids}`);
      assert.equal(first.oomKills, 0);
      await sb.files.write("/tmp/fill.bin", new Uint8Array(2 * 1024 * 1024));
      await sb.commands.run("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done");
      const m = await sb.metrics();
      assert.ok(m.diskUsedBytes >= 2 * 1024 * 1024, `disk used ${m.diskUsedBytes}`);
      assert.ok(m.diskLimitBytes > 0);
      assert.ok(m.cpuUsageMs >= first.cpuUsageMs);
      assert.equal(typeof m.cpuPercent, "number");
      assert.ok(m.memoryUsedBytes > 0);
    });
  });
});
