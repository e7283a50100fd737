/**
 * The code interpreter: stateful language contexts (kernels) and the `Execution` shape E2B
 * users know.
 */

import { GloveboxError } from "./errors.js";
import { ApiClient, ndjson, seg } from "./http.js";

export type Language = "python" | "javascript" | "typescript" | "bash" | "r" | "java";

/** A MIME bundle: the last expression's value, a `display(…)`, or a figure. */
export class Result {
  /** The value of the cell's last expression (as opposed to displays and figures). */
  readonly isMainResult: boolean;
  /** MIME type → content (`image/png` is base64). */
  readonly data: Readonly<Record<string, unknown>>;

  constructor(isMainResult: boolean, data: Record<string, unknown>) {
    this.isMainResult = isMainResult;
    this.data = data;
  }

  #str(mime: string): string | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? v : undefined;
  }

  get text(): string | undefined {
    return this.#str("text/plain");
  }
  get html(): string | undefined {
    return this.#str("text/html");
  }
  /** Base64-encoded PNG. */
  get png(): string | undefined {
    return this.#str("image/png");
  }
  get svg(): string | undefined {
    return this.#str("image/svg+xml");
  }
  get json(): unknown {
    return this.data["application/json"];
  }
  get markdown(): string | undefined {
    return this.#str("text/markdown");
  }
  get latex(): string | undefined {
    return this.#str("text/latex");
  }
  /** The MIME types present. */
  formats(): string[] {
    return Object.keys(this.data);
  }
}

export interface ExecutionError {
  /** The exception's class (`ZeroDivisionError`, `TimeoutError` when the cell ran out of time). */
  name: string;
  value: string;
  traceback: string;
}

/** What a cell produced. An exception in the cell is `error`, not a thrown error. */
export class Execution {
  results: Result[] = [];
  logs: { stdout: string[]; stderr: string[] } = { stdout: [], stderr: [] };
  error?: ExecutionError;
  executionCount = 0;
  /** The context was restarted (state lost): the cell could not be interrupted, or it died. */
  contextRestarted = false;

  /** The main result's text, if there is one. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
}

export interface CodeContext {
  id: string;
  language: Language;
  cwd: string;
}

export interface RunCodeOptions {
  /** Default python; ignored when `context` is given (a context has its language). */
  language?: Language;
  /** A context from `createCodeContext` (or its id); default: the language's default context. */
  context?: CodeContext | string;
  /** The cell's time budget (default 60 000); on expiry it is interrupted, the context kept. */
  timeoutMs?: number;
  /** Set in the context's environment for this cell only (restored when it ends). */
  env?: Record<string, string>;
  /** Streaming callbacks: the request then streams events as they happen. */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (result: Result) => void;
  onError?: (error: ExecutionError) => void;
  /** Cancels the HTTP request (the cell runs on until it ends or times out). */
  signal?: AbortSignal;
}

interface WireResult {
  is_main_result: boolean;
  data: Record<string, unknown>;
}

interface WireExecution {
  results: WireResult[];
  logs: { stdout: string[]; stderr: string[] };
  error?: ExecutionError;
  execution_count: number;
  context_restarted?: boolean;
}

type CodeLine =
  | { type: "stdout" | "stderr"; text: string }
  | ({ type: "result" } & WireResult)
  | ({ type: "error" } & ExecutionError)
  | { type: "end"; execution_count: number; context_restarted?: boolean };

/** The name the daemon gives a stream's last line when it failed (not the user's code). */
const DAEMON_ERROR = "GloveboxError";

function contextId(ctx: CodeContext | string): string {
  return typeof ctx === "string" ? ctx : ctx.id;
}

/** The code-interpreter half of a sandbox (mixed into `Sandbox`). */
export class CodeInterpreter {
  readonly #api: ApiClient;
  readonly #base: string;

  /** @internal */
  constructor(api: ApiClient, sandboxId: string) {
    this.#api = api;
    this.#base = `/v1/sandboxes/${seg(sandboxId)}`;
  }

  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    const body: Record<string, unknown> = { code };
    if (options.context !== undefined) body["context_id"] = contextId(options.context);
    else if (options.language !== undefined) body["language"] = options.language;
    if (options.timeoutMs !== undefined) body["timeout_ms"] = options.timeoutMs;
    if (options.env !== undefined) body["env"] = options.env;
    const streaming =
      options.onStdout !== undefined ||
      options.onStderr !== undefined ||
      options.onResult !== undefined ||
      options.onError !== undefined;
    const ex = new Execution();
    if (!streaming) {
      const w = await this.#api.json<WireExecution>("POST", `${this.#base}/code`, {
        json: body,
        signal: options.signal,
      });
      ex.results = w.results.map((r) => new Result(r.is_main_result, r.data));
      ex.logs = { stdout: w.logs.stdout, stderr: w.logs.stderr };
      if (w.error) ex.error = w.error;
      ex.executionCount = w.execution_count;
      ex.contextRestarted = w.context_restarted ?? false;
      return ex;
    }
    const res = await this.#api.request("POST", `${this.#base}/code`, {
      json: body,
      accept: "application/x-ndjson",
      signal: options.signal,
    });
    // An `error` named like the daemon's own may be the user's exception or the daemon's
    // failure; only the daemon's is the last line (no `end` follows), so its callback waits.
    let held: ExecutionError | undefined;
    for await (const l of ndjson<CodeLine>(res)) {
      if (held !== undefined) {
        options.onError?.(held);
        held = undefined;
      }
      switch (l.type) {
        case "stdout":
          ex.logs.stdout.push(l.text);
          options.onStdout?.(l.text);
          break;
        case "stderr":
          ex.logs.stderr.push(l.text);
          options.onStderr?.(l.text);
          break;
        case "result": {
          const r = new Result(l.is_main_result, l.data);
          ex.results.push(r);
          options.onResult?.(r);
          break;
        }
        case "error": {
          const e = { name: l.name, value: l.value, traceback: l.traceback };
          ex.error = e;
          if (e.name === DAEMON_ERROR) held = e;
          else options.onError?.(e);
          break;
        }
        case "end":
          ex.executionCount = l.execution_count;
          ex.contextRestarted = l.context_restarted ?? false;
          return ex;
      }
    }
    // No `end`: the daemon failed the request mid-stream (its last line says why), which a
    // buffered request would have answered with an HTTP error.
    if (ex.error?.name === DAEMON_ERROR) {
      throw new GloveboxError(ex.error.value, { code: "code_execution_failed" });
    }
    throw new GloveboxError("the code stream ended before the cell did", { code: "stream_ended" });
  }

  async createCodeContext(
    options: { language?: Language; cwd?: string; signal?: AbortSignal } = {},
  ): Promise<CodeContext> {
    const body: Record<string, unknown> = {};
    if (options.language !== undefined) body["language"] = options.language;
    if (options.cwd !== undefined) body["cwd"] = options.cwd;
    return await this.#api.json<CodeContext>("POST", `${this.#base}/contexts`, {
      json: body,
      signal: options.signal,
    });
  }

  async listCodeContexts(options: { signal?: AbortSignal } = {}): Promise<CodeContext[]> {
    const r = await this.#api.json<{ contexts: CodeContext[] }>("GET", `${this.#base}/contexts`, {
      signal: options.signal,
    });
    return r.contexts;
  }

  /** Clears a context's state (a fresh kernel). */
  async restartCodeContext(ctx: CodeContext | string): Promise<CodeContext> {
    return await this.#api.json<CodeContext>(
      "POST",
      `${this.#base}/contexts/${seg(contextId(ctx))}/restart`,
    );
  }

  async removeCodeContext(ctx: CodeContext | string): Promise<void> {
    await this.#api.send("DELETE", `${this.#base}/contexts/${seg(contextId(ctx))}`);
  }
}
