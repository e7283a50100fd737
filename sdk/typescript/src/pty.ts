/**
 * `sandbox.pty`: commands on a pseudo-terminal. A terminal command runs in the background;
 * its output is read by attaching to its WebSocket (`handle.output()`, or `wait({ onData })`).
 * Nothing is kept while nobody is attached beyond a small backlog; past it the program waits
 * to write. The WebSocket client here is a minimal one over `node:http`, loaded when first
 * needed (Node 20 has no global `WebSocket`, and a browser's cannot send the API key as a
 * header): whole messages, client frames masked, pings answered. The rest of the SDK keeps
 * needing only `fetch`.
 */

import { CommandHandle } from "./commands.js";
import type { CommandResult } from "./commands.js";
import { errorFromApi, GloveboxError } from "./errors.js";
import { seg } from "./http.js";
import type { ApiClient } from "./http.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** Largest frame accepted from the daemon (its output chunks are 64 KiB). */
const MAX_FRAME = 16 << 20;

export interface PtyCreateOptions {
  /** Terminal width, 1–1000 (default 80). */
  cols?: number;
  /** Terminal height, 1–1000 (default 24). */
  rows?: number;
  /** An argv array or a string for `/bin/sh -c`; default a login shell. */
  cmd?: string | string[];
  cwd?: string;
  envs?: Record<string, string>;
}

/** A terminal command: a `CommandHandle` plus input, resize and its output. */
export class PtyHandle extends CommandHandle {
  readonly #api: ApiClient;
  readonly #sandboxId: string;

  /** @internal */
  constructor(api: ApiClient, sandboxId: string, id: number, pid: number | undefined) {
    super(api, sandboxId, id, pid);
    this.#api = api;
    this.#sandboxId = sandboxId;
  }

  /** Types `data` into the terminal (`"\x03"` is Ctrl-C). */
  async sendInput(data: string | Uint8Array): Promise<void> {
    await this.sendStdin(data);
  }

  /** Sets the terminal's size; the program in the foreground gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.#api.send("POST", `/v1/sandboxes/${seg(this.#sandboxId)}/pty/${seg(this.id)}/resize`, {
      json: { cols, rows },
    });
  }

  /**
   * The terminal's output from now on, until the program ends (or another client takes the
   * terminal over). Breaking out of the loop detaches; the program keeps running.
   */
  async *output(): AsyncGenerator<Uint8Array> {
    const ws = await openSocket(this.#api, `/v1/sandboxes/${seg(this.#sandboxId)}/pty/${seg(this.id)}/ws`);
    try {
      for (;;) {
        const m = await ws.next();
        if (m === null) return;
        if (m.opcode === 2) yield m.payload;
      }
    } finally {
      ws.close();
    }
  }

  /**
   * Waits for the program to end; with `onData`, its output is attached to and passed on as
   * it comes. The result's output fields are empty (a terminal's output is not kept).
   */
  override async wait(
    options: { signal?: AbortSignal; onData?: (data: Uint8Array) => void } = {},
  ): Promise<CommandResult> {
    if (options.onData !== undefined) {
      for await (const chunk of this.output()) options.onData(chunk);
    }
    return super.wait({ signal: options.signal });
  }
}

/** `sandbox.pty`. */
export class Pty {
  readonly #api: ApiClient;
  readonly #sandboxId: string;

  /** @internal */
  constructor(api: ApiClient, sandboxId: string) {
    this.#api = api;
    this.#sandboxId = sandboxId;
  }

  /** Starts a command (default: a login shell) on a new terminal; `TERM` is `xterm-256color`. */
  async create(options: PtyCreateOptions = {}): Promise<PtyHandle> {
    const body: Record<string, unknown> = { cols: options.cols ?? 80, rows: options.rows ?? 24 };
    if (options.cmd !== undefined) body.cmd = options.cmd;
    if (options.cwd !== undefined) body.cwd = options.cwd;
    if (options.envs !== undefined) body.env = options.envs;
    const r = await this.#api.json<{ id: number; pid: number }>("POST", `/v1/sandboxes/${seg(this.#sandboxId)}/pty`, {
      json: body,
    });
    return new PtyHandle(this.#api, this.#sandboxId, r.id, r.pid);
  }

  /** A handle on terminal command `id`. */
  connect(id: number): PtyHandle {
    return new PtyHandle(this.#api, this.#sandboxId, id, undefined);
  }

  async sendInput(id: number, data: string | Uint8Array): Promise<void> {
    await this.connect(id).sendInput(data);
  }

  async resize(id: number, cols: number, rows: number): Promise<void> {
    await this.connect(id).resize(cols, rows);
  }

  async kill(id: number, signal = 9): Promise<void> {
    await this.connect(id).kill(signal);
  }
}

interface Frame {
  opcode: number;
  payload: Uint8Array;
}

// Node's modules, loaded at run time: the SDK is compiled without Node's type declarations.
/* eslint-disable @typescript-eslint/no-explicit-any */
type NodeSocket = any;

async function nodeModule(name: string): Promise<any> {
  try {
    return await import(`node:${name}`);
  } catch (e) {
    throw new GloveboxError(`terminal output needs Node.js (node:${name}): ${String(e)}`, {
      code: "not_supported",
    });
  }
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/** An open WebSocket: whole messages in order, `null` once closed. */
class Socket {
  #buf: Uint8Array;
  #waiting: (() => void) | null = null;
  #ended = false;
  #error: Error | null = null;

  constructor(
    readonly sock: NodeSocket,
    head: Uint8Array,
    readonly random: (n: number) => Uint8Array,
  ) {
    this.#buf = new Uint8Array(head);
    sock.on("data", (d: Uint8Array) => {
      this.#buf = concat(this.#buf, d);
      this.#wake();
    });
    sock.on("end", () => {
      this.#ended = true;
      this.#wake();
    });
    sock.on("close", () => {
      this.#ended = true;
      this.#wake();
    });
    sock.on("error", (e: Error) => {
      this.#error = e;
      this.#wake();
    });
  }

  #wake(): void {
    const w = this.#waiting;
    this.#waiting = null;
    w?.();
  }

  async #need(n: number): Promise<Uint8Array | null> {
    while (this.#buf.length < n) {
      if (this.#error !== null) {
        throw new GloveboxError(`terminal connection: ${this.#error.message}`, { code: "connection_error" });
      }
      if (this.#ended) return null;
      await new Promise<void>((resolve) => (this.#waiting = resolve));
    }
    const out = this.#buf.slice(0, n);
    this.#buf = this.#buf.slice(n);
    return out;
  }

  async next(): Promise<Frame | null> {
    for (;;) {
      const h = await this.#need(2);
      if (h === null) return null;
      const opcode = h[0]! & 0x0f;
      let n = h[1]! & 0x7f;
      if (h[1]! & 0x80) throw new GloveboxError("the daemon sent a masked frame", { code: "protocol_error" });
      if (n === 126) {
        const e = await this.#need(2);
        if (e === null) return null;
        n = new DataView(e.buffer, e.byteOffset, 2).getUint16(0);
      } else if (n === 127) {
        const e = await this.#need(8);
        if (e === null) return null;
        const big = new DataView(e.buffer, e.byteOffset, 8).getBigUint64(0);
        n = big > BigInt(MAX_FRAME) ? MAX_FRAME + 1 : Number(big);
      }
      if (n > MAX_FRAME) throw new GloveboxError("terminal frame too large", { code: "protocol_error" });
      const payload = await this.#need(n);
      if (payload === null) return null;
      if (opcode === 0x9) this.send(0xa, payload);
      else if (opcode === 0x8) {
        this.close();
        return null;
      } else if (opcode === 0x1 || opcode === 0x2) return { opcode, payload };
    }
  }

  send(opcode: number, payload: Uint8Array): void {
    const n = payload.length;
    const ext = n < 126 ? 0 : n < 65536 ? 2 : 8;
    const frame = new Uint8Array(2 + ext + 4 + n);
    const view = new DataView(frame.buffer);
    frame[0] = 0x80 | opcode;
    if (ext === 0) frame[1] = 0x80 | n;
    else if (ext === 2) {
      frame[1] = 0x80 | 126;
      view.setUint16(2, n);
    } else {
      frame[1] = 0x80 | 127;
      view.setBigUint64(2, BigInt(n));
    }
    const mask = this.random(4);
    frame.set(mask, 2 + ext);
    for (let i = 0; i < n; i++) frame[2 + ext + 4 + i] = payload[i]! ^ mask[i % 4]!;
    this.sock.write(frame);
  }

  close(): void {
    if (!this.sock.destroyed) {
      try {
        this.send(0x8, new Uint8Array([0x03, 0xe8]));
      } catch {
        // Already gone.
      }
      this.sock.destroy();
    }
  }
}

async function openSocket(api: ApiClient, path: string): Promise<Socket> {
  const u = new URL(api.url + path);
  const crypto = await nodeModule("crypto");
  const mod = await nodeModule(u.protocol === "https:" ? "https" : "http");
  const random = (n: number): Uint8Array => new Uint8Array(crypto.randomBytes(n));
  const key: string = crypto.randomBytes(16).toString("base64");
  const headers: Record<string, string> = {
    connection: "Upgrade",
    upgrade: "websocket",
    "sec-websocket-key": key,
    "sec-websocket-version": "13",
  };
  if (api.apiKey !== undefined) headers["authorization"] = `Bearer ${api.apiKey}`;
  return new Promise((resolve, reject) => {
    const req = mod.request(u, { method: "GET", headers });
    req.on("upgrade", (res: any, sock: NodeSocket, head: Uint8Array) => {
      const want = crypto
        .createHash("sha1")
        .update(key + GUID)
        .digest("base64");
      if (res.headers["sec-websocket-accept"] !== want) {
        sock.destroy();
        reject(new GloveboxError("bad WebSocket handshake from the daemon", { code: "protocol_error" }));
        return;
      }
      resolve(new Socket(sock, head, random));
    });
    req.on("response", (res: any) => {
      let body: Uint8Array = new Uint8Array(0);
      res.on("data", (c: Uint8Array) => (body = concat(body, c)));
      res.on("end", () => {
        const text = new TextDecoder().decode(body);
        const status: number = res.statusCode ?? 0;
        try {
          const parsed = JSON.parse(text) as { error?: { code?: string; message?: string; reason?: string } };
          if (parsed.error?.code !== undefined) {
            reject(errorFromApi(status, parsed.error.code, parsed.error.message ?? text, parsed.error.reason));
            return;
          }
        } catch {
          // Not the daemon's JSON.
        }
        reject(errorFromApi(status, `http_${status}`, text));
      });
    });
    req.on("error", (e: Error) =>
      reject(new GloveboxError(`cannot reach glovebox at ${api.url}: ${e.message}`, { code: "connection_error" })),
    );
    req.end();
  });
}
