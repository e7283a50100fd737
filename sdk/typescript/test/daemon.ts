/**
 * Test fixture: a real `glovebox serve` on a free loopback port with its own data dir and a
 * random API key, started per test file and always stopped (SIGTERM, then SIGKILL after a
 * bounded wait). Every sandbox a file creates must be gone when it ends: a leak fails.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before } from "node:test";
import assert from "node:assert/strict";

import { Sandbox } from "@glovebox/sdk";

/** The repository root (this file runs from `sdk/typescript/dist-test/`). */
export const REPO = fileURLToPath(new URL("../../../", import.meta.url));

export const BIN =
  process.env["GLOVEBOX_BIN"] ?? join(REPO, "target/x86_64-unknown-linux-gnu/debug/glovebox");

export interface Daemon {
  url: string;
  apiKey: string;
  dataDir: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      const port = typeof addr === "object" && addr !== null ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

function exited(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => p.once("exit", () => resolve()));
}

async function within<T>(ms: number, p: Promise<T>): Promise<T | "timeout"> {
  let t: NodeJS.Timeout | undefined;
  const timer = new Promise<"timeout">((resolve) => (t = setTimeout(() => resolve("timeout"), ms)));
  try {
    return await Promise.race([p, timer]);
  } finally {
    clearTimeout(t);
  }
}

export async function startDaemon(): Promise<Daemon> {
  if (!existsSync(BIN)) {
    throw new Error(`${BIN} is missing: run \`cargo build\` in ${REPO} (run_tests.sh does)`);
  }
  const dataDir = mkdtempSync(join(tmpdir(), "glovebox-sdk-ts-"));
  const apiKey = randomBytes(16).toString("hex");
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const logPath = join(dataDir, "daemon.log");
  const log = openSync(logPath, "a");
  const env: NodeJS.ProcessEnv = { PATH: process.env["PATH"] ?? "/usr/bin:/bin" };
  for (const k of ["GLOVEBOX_TEMPLATES_DIR", "GLOVEBOX_AGENT", "RUST_LOG"]) {
    if (process.env[k]) env[k] = process.env[k];
  }
  const child = spawn(
    BIN,
    ["serve", "--listen", `127.0.0.1:${port}`, "--data-dir", join(dataDir, "data"), "--api-key", apiKey, "--warm-pool", "0"],
    { env, stdio: ["ignore", log, log] },
  );
  closeSync(log);
  const gone = exited(child);
  const readLog = (): string => {
    try {
      return readFileSync(logPath, "utf8");
    } catch {
      return "";
    }
  };

  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      if ((await within(15_000, gone)) === "timeout") {
        child.kill("SIGKILL");
        await gone;
        throw new Error(`glovebox serve ignored SIGTERM for 15 s; log:\n${readLog()}`);
      }
    }
    rmSync(dataDir, { recursive: true, force: true });
  };

  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      const l = readLog();
      rmSync(dataDir, { recursive: true, force: true });
      throw new Error(`glovebox serve exited during start-up; log:\n${l}`);
    }
    try {
      const r = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) });
      if (r.ok) break;
    } catch {
      // Not listening yet.
    }
    if (Date.now() > deadline) {
      await stop().catch(() => {});
      throw new Error(`glovebox serve not healthy within 20 s; log:\n${readLog()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { url, apiKey, dataDir, stop };
}

/**
 * Starts a daemon for the current test file, points `GLOVEBOX_URL`/`GLOVEBOX_API_KEY` at it
 * (so `Sandbox.create()` without options finds it), and after the file checks nothing leaked.
 */
export function useDaemon(): { readonly current: Daemon } {
  const holder: { current?: Daemon } = {};
  before(async () => {
    holder.current = await startDaemon();
    process.env["GLOVEBOX_URL"] = holder.current.url;
    process.env["GLOVEBOX_API_KEY"] = holder.current.apiKey;
  });
  after(async () => {
    const d = holder.current;
    if (d === undefined) return;
    try {
      const left = await Sandbox.list();
      assert.deepEqual(
        left.map((s) => s.id),
        [],
        "sandboxes left running at the end of the file",
      );
    } finally {
      await d.stop();
    }
  });
  return holder as { readonly current: Daemon };
}

/** Polls `f` until it returns a truthy value or the deadline passes. */
export async function eventually<T>(f: () => Promise<T>, ms = 5000, what = "condition"): Promise<NonNullable<T>> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`${what} not met within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
