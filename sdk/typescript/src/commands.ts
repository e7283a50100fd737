/**
 * Commands in a sandbox: foreground (buffered or streamed over NDJSON) and background ones
 * driven through a {@link CommandHandle}.
 *
 * Aborting a request (`signal`) only drops the HTTP request: the daemon lets the command run
 * on until it ends or its `timeoutMs` runs out. Use a background command and
 * {@link CommandHandle.kill} (or `commands.connect(id).kill()` with an id from
 * `commands.list()`) to stop one early.
 */

import { CommandExitError, errorFromApi, GloveboxError, InvalidArgumentError, TimeoutError } from "./errors.js";
import { ApiClient, base64ToBytes, bytesToBase64, ndjson, seg } from "./http.js";

/** What a finished command produced. Output is decoded as UTF-8 (invalid bytes replaced). */
export interface CommandResult {
  /** The agent's id of the command in this sandbox. */
  id: number;
  /** The exit code; 128 + N when signal N ended the command. */
  exitCode: number;
  /** The signal that ended the command, if one did. */
  signal: number | null;
  stdout: string;
  stderr: string;
  /** The command's `timeoutMs` ran out and it was killed. */
  timedOut: boolean;
  /** The kernel's OOM killer ended a process of the command. */
  oomKilled: boolean;
  /** Output beyond `maxOutputBytes` was dropped (and counted in `stdoutBytes`). */
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Bytes written, including any beyond the cap. */
  stdoutBytes: number;
  stderrBytes: number;
  durationMs: number;
}

export interface CommandOptions {
  /** The command's time budget; default 60 000, `0` = only the sandbox lifetime bounds it. */
  timeoutMs?: number;
  /** Working directory; default `/home/user`. */
  cwd?: string;
  env?: Record<string, string>;
  /** Given to the command's stdin (closed after it); bytes are sent exactly. */
  stdin?: string | Uint8Array;
  /** Output kept per stream; default 1 MiB (the rest is drained and counted). */
  maxOutputBytes?: number;
  /**
   * Of `maxOutputBytes`, how much goes to the end of the output when it is cut: the first part
   * and the last are kept, with a `[glovebox: N bytes dropped]` line between them. Default
   * half the cap; `0` keeps the first part only.
   */
  outputTailBytes?: number;
  /** Called with output as it happens (the request then streams NDJSON). */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** Throw {@link CommandExitError} on a non-zero exit and {@link TimeoutError} on a timeout. */
  check?: boolean;
  /** Cancels the HTTP request (the command itself runs on; see the module docs). */
  signal?: AbortSignal;
}

/** A background command, as listed by `commands.list()`. */
export interface CommandInfo {
  id: number;
  pid: number;
  cmd: string | string[];
  running: boolean;
  exitCode?: number;
}

/** Signals by name, for {@link CommandHandle.kill}. */
const SIGNALS = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGKILL: 9,
  SIGUSR1: 10,
  SIGUSR2: 12,
  SIGTERM: 15,
  SIGCONT: 18,
  SIGSTOP: 19,
} as const;

/** A signal number, or a name such as `"SIGTERM"`. */
export type Signal = number | keyof typeof SIGNALS;

interface WireResult {
  id: number;
  exit_code: number;
  signal: number | null;
  timed_out: boolean;
  oom_killed: boolean;
  stdout: string;
  stderr: string;
  encoding: "utf8" | "base64";
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  stdout_bytes: number;
  stderr_bytes: number;
  duration_ms: number;
}

type StreamLine =
  | { type: "started"; id: number; pid: number }
  | { type: "stdout" | "stderr"; data: string }
  | ({ type: "exited" } & WireResult)
  | { type: "error"; error: { code: string; message: string; reason?: string } };

function fromWire(w: WireResult, stdout = w.stdout, stderr = w.stderr): CommandResult {
  return {
    id: w.id,
    exitCode: w.exit_code,
    signal: w.signal ?? null,
    stdout,
    stderr,
    timedOut: w.timed_out,
    oomKilled: w.oom_killed,
    stdoutTruncated: w.stdout_truncated,
    stderrTruncated: w.stderr_truncated,
    stdoutBytes: w.stdout_bytes,
    stderrBytes: w.stderr_bytes,
    durationMs: w.duration_ms,
  };
}

function checked(r: CommandResult, check: boolean | undefined): CommandResult {
  if (!check) return r;
  if (r.timedOut) {
    throw new TimeoutError(`command timed out after ${r.durationMs} ms`, { result: r });
  }
  if (r.exitCode !== 0) throw new CommandExitError(r);
  return r;
}

/** A running background command. */
export class CommandHandle {
  readonly #api: ApiClient;
  readonly #base: string;
  readonly #check: boolean;

  /** @internal */
  constructor(
    api: ApiClient,
    sandboxId: string,
    readonly id: number,
    readonly pid: number | undefined,
    check = false,
  ) {
    this.#api = api;
    this.#base = `/v1/sandboxes/${seg(sandboxId)}/commands/${seg(id)}`;
    this.#check = check;
  }

  /** Waits for the command to end and returns its buffered output. */
  async wait(options: { signal?: AbortSignal } = {}): Promise<CommandResult> {
    const w = await this.#api.json<WireResult>("GET", this.#base, {
      query: { wait: true, encoding: "utf8" },
      signal: options.signal,
    });
    return checked(fromWire(w), this.#check);
  }

  /** Sends a signal (default SIGKILL, which kills every process the command started). */
  async kill(signal: Signal = 9): Promise<void> {
    const n =
      typeof signal === "number"
        ? signal
        : (SIGNALS as Record<string, number | undefined>)[String(signal).toUpperCase()];
    if (n === undefined) throw new InvalidArgumentError(`unknown signal ${signal}`);
    await this.#api.send("POST", `${this.#base}/kill`, { json: { signal: n } });
  }

  /** Writes to the command's stdin; `close: true` closes it afterwards (EOF). */
  async sendStdin(data: string | Uint8Array, options: { close?: boolean } = {}): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.#api.send("POST", `${this.#base}/stdin`, {
      body: body as BodyInit,
      query: { close: options.close ? true : undefined },
    });
  }

  /** Closes the command's stdin. */
  async closeStdin(): Promise<void> {
    await this.sendStdin(new Uint8Array(0), { close: true });
  }
}

/** `sandbox.commands`. */
export class Commands {
  readonly #api: ApiClient;
  readonly #sandboxId: string;

  /** @internal */
  constructor(api: ApiClient, sandboxId: string) {
    this.#api = api;
    this.#sandboxId = sandboxId;
  }

  /**
   * Runs a command: an argv array, or a string for `/bin/sh -c`. Resolves when it ends — a
   * non-zero exit is a result, not an error, unless `check: true`. With `background: true`
   * resolves at once with a {@link CommandHandle}.
   */
  run(cmd: string | string[], options: CommandOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], options?: CommandOptions & { background?: false }): Promise<CommandResult>;
  run(
    cmd: string | string[],
    options?: CommandOptions & { background?: boolean },
  ): Promise<CommandResult | CommandHandle>;
  async run(
    cmd: string | string[],
    options: CommandOptions & { background?: boolean } = {},
  ): Promise<CommandResult | CommandHandle> {
    const streaming = options.onStdout !== undefined || options.onStderr !== undefined;
    if (options.background && streaming) {
      throw new InvalidArgumentError(
        "onStdout/onStderr cannot be used with background: true (use handle.wait())",
      );
    }
    const body: Record<string, unknown> = { cmd };
    if (options.cwd !== undefined) body["cwd"] = options.cwd;
    if (options.env !== undefined) body["env"] = options.env;
    if (options.timeoutMs !== undefined) body["timeout_ms"] = options.timeoutMs;
    if (options.maxOutputBytes !== undefined) body["max_output_bytes"] = options.maxOutputBytes;
    if (options.outputTailBytes !== undefined) body["output_tail_bytes"] = options.outputTailBytes;
    if (typeof options.stdin === "string") body["stdin"] = options.stdin;
    else if (options.stdin !== undefined) body["stdin_base64"] = bytesToBase64(options.stdin);
    const path = `/v1/sandboxes/${seg(this.#sandboxId)}/exec`;

    if (options.background) {
      body["background"] = true;
      const s = await this.#api.json<{ id: number; pid: number }>("POST", path, {
        json: body,
        signal: options.signal,
      });
      return new CommandHandle(this.#api, this.#sandboxId, s.id, s.pid, options.check);
    }
    if (!streaming) {
      body["encoding"] = "utf8";
      const w = await this.#api.json<WireResult>("POST", path, { json: body, signal: options.signal });
      return checked(fromWire(w), options.check);
    }
    // Streamed: base64 chunks so a multi-byte character split across chunks decodes intact.
    body["encoding"] = "base64";
    const res = await this.#api.request("POST", path, {
      json: body,
      accept: "application/x-ndjson",
      signal: options.signal,
    });
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const out = { stdout: "", stderr: "" };
    const emit = (k: "stdout" | "stderr", text: string): void => {
      if (text === "") return;
      out[k] += text;
      (k === "stdout" ? options.onStdout : options.onStderr)?.(text);
    };
    for await (const l of ndjson<StreamLine>(res)) {
      switch (l.type) {
        case "started":
          break;
        case "stdout":
        case "stderr":
          emit(l.type, dec[l.type].decode(base64ToBytes(l.data), { stream: true }));
          break;
        case "exited":
          emit("stdout", dec.stdout.decode());
          emit("stderr", dec.stderr.decode());
          return checked(fromWire(l, out.stdout, out.stderr), options.check);
        case "error":
          throw errorFromApi(0, l.error.code, l.error.message, l.error.reason);
      }
    }
    throw new GloveboxError("the command's output stream ended before the command did", {
      code: "stream_ended",
    });
  }

  /** The sandbox's background commands (running, and the last finished ones). */
  async list(options: { signal?: AbortSignal } = {}): Promise<CommandInfo[]> {
    const r = await this.#api.json<{
      commands: { id: number; pid: number; cmd: string | string[]; running: boolean; exit_code?: number }[];
    }>("GET", `/v1/sandboxes/${seg(this.#sandboxId)}/commands`, { signal: options.signal });
    return r.commands.map((c) => {
      const info: CommandInfo = { id: c.id, pid: c.pid, cmd: c.cmd, running: c.running };
      if (c.exit_code !== undefined && c.exit_code !== null) info.exitCode = c.exit_code;
      return info;
    });
  }

  /** A handle on an existing command (by the id from `list()` or a result), without a request. */
  connect(id: number): CommandHandle {
    return new CommandHandle(this.#api, this.#sandboxId, id, undefined);
  }
}
