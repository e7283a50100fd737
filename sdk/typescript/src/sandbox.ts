/**
 * `Sandbox`: create, connect to, list and destroy sandboxes; `commands`, `files` and the code
 * interpreter hang off an instance.
 */

import { CodeInterpreter } from "./code.js";
import type { CodeContext, Execution, Language, RunCodeOptions } from "./code.js";
import { Commands } from "./commands.js";
import { NotFoundError, NotSupportedError, SandboxGoneError } from "./errors.js";
import { Files } from "./files.js";
import { ApiClient, seg } from "./http.js";
import type { ConnectionOptions } from "./http.js";

/** The network policy of a sandbox. Today the daemon knows `deny-all` (loopback only). */
export interface NetworkPolicy {
  mode: "deny-all" | (string & {});
  [key: string]: unknown;
}

export interface SandboxCreateOptions extends ConnectionOptions {
  /** Template name; default `base` (the host's `/usr`). */
  template?: string;
  /** Lifetime; default 300 000 (5 min), at most 24 h. Sent in whole seconds, rounded up. */
  timeoutMs?: number;
  cpus?: number;
  memoryMb?: number;
  diskMb?: number;
  pids?: number;
  /** Environment of every command in the sandbox. */
  env?: Record<string, string>;
  /** Labels, filterable with `Sandbox.list({metadata})`. */
  metadata?: Record<string, string>;
  network?: NetworkPolicy;
  /** Stop (or pause, see `onIdle`) after this long without activity (whole seconds, rounded up). */
  idleTimeoutMs?: number;
  /** What the idle timeout does: `"kill"` (default) or `"pause"`. */
  onIdle?: "kill" | "pause" | "hibernate";
  signal?: AbortSignal;
}

export interface SandboxLimits {
  cpus: number;
  memoryMb: number;
  diskMb: number;
  pids: number;
}

export interface SandboxInfo {
  id: string;
  template: string;
  /** `running`, or how it ended. */
  state: string;
  createdAt: Date;
  expiresAt: Date;
  limits: SandboxLimits;
  metadata: Record<string, string>;
  network: NetworkPolicy;
  /** Why it ended, once it has. */
  reason?: string;
}

/** One entry of a sandbox's egress audit log (shape defined by the daemon). */
export type EgressEvent = Record<string, unknown>;

/** Resource usage of a sandbox, now. */
export interface SandboxMetrics {
  /** Average CPU use since the previous `metrics()` call (100 = one core). */
  cpuPercent: number;
  cpuUsageMs: number;
  memoryUsedBytes: number;
  /** Where the host's cgroup reports it. */
  memoryPeakBytes?: number;
  memoryLimitBytes: number;
  diskUsedBytes: number;
  diskLimitBytes: number;
  pids: number;
  pidsLimit: number;
  oomKills: number;
}

interface WireMetrics {
  cpu_percent: number;
  cpu_usage_ms: number;
  memory_used_bytes: number;
  memory_peak_bytes?: number | null;
  memory_limit_bytes: number;
  disk_used_bytes: number;
  disk_limit_bytes: number;
  pids: number;
  pids_limit: number;
  oom_kills: number;
}

interface WireSandbox {
  id: string;
  template: string;
  state: string;
  created_at: string;
  expires_at: string;
  limits: { cpus: number; memory_mb: number; disk_mb: number; pids: number };
  metadata: Record<string, string>;
  network: NetworkPolicy;
  reason?: string;
}

function fromWire(w: WireSandbox): SandboxInfo {
  const info: SandboxInfo = {
    id: w.id,
    template: w.template,
    state: w.state,
    createdAt: new Date(w.created_at),
    expiresAt: new Date(w.expires_at),
    limits: {
      cpus: w.limits.cpus,
      memoryMb: w.limits.memory_mb,
      diskMb: w.limits.disk_mb,
      pids: w.limits.pids,
    },
    metadata: w.metadata ?? {},
    network: w.network,
  };
  if (w.reason !== undefined && w.reason !== null) info.reason = w.reason;
  return info;
}

function seconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

// Node 20 has `Symbol.asyncDispose`; a runtime without it still gets a well-defined key.
const asyncDispose: typeof Symbol.asyncDispose =
  Symbol.asyncDispose ?? (Symbol.for("Symbol.asyncDispose") as typeof Symbol.asyncDispose);

export class Sandbox {
  readonly id: string;
  readonly commands: Commands;
  readonly files: Files;
  readonly #api: ApiClient;
  readonly #code: CodeInterpreter;
  readonly #base: string;

  private constructor(api: ApiClient, id: string) {
    this.id = id;
    this.#api = api;
    this.#base = `/v1/sandboxes/${seg(id)}`;
    this.commands = new Commands(api, id);
    this.files = new Files(api, id);
    this.#code = new CodeInterpreter(api, id);
  }

  /** Creates a sandbox (connection from the options, else `GLOVEBOX_URL`/`GLOVEBOX_API_KEY`). */
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const api = new ApiClient(options);
    const body: Record<string, unknown> = {};
    if (options.template !== undefined) body["template"] = options.template;
    if (options.timeoutMs !== undefined) body["timeout_s"] = seconds(options.timeoutMs);
    const resources: Record<string, number> = {};
    if (options.cpus !== undefined) resources["cpus"] = options.cpus;
    if (options.memoryMb !== undefined) resources["memory_mb"] = options.memoryMb;
    if (options.diskMb !== undefined) resources["disk_mb"] = options.diskMb;
    if (options.pids !== undefined) resources["pids"] = options.pids;
    if (Object.keys(resources).length > 0) body["resources"] = resources;
    if (options.env !== undefined) body["env"] = options.env;
    if (options.metadata !== undefined) body["metadata"] = options.metadata;
    if (options.network !== undefined) body["network"] = options.network;
    if (options.idleTimeoutMs !== undefined) body["idle_timeout_s"] = seconds(options.idleTimeoutMs);
    if (options.onIdle !== undefined) body["on_idle"] = options.onIdle;
    const w = await api.json<WireSandbox>("POST", "/v1/sandboxes", { json: body, signal: options.signal });
    return new Sandbox(api, w.id);
  }

  /** Attaches to an existing sandbox; throws if it is unknown or gone. */
  static async connect(id: string, options: ConnectionOptions & { signal?: AbortSignal } = {}): Promise<Sandbox> {
    const sb = new Sandbox(new ApiClient(options), id);
    await sb.info({ signal: options.signal });
    return sb;
  }

  /** Live sandboxes, optionally only those whose metadata has all the given pairs. */
  static async list(
    options: ConnectionOptions & { metadata?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<SandboxInfo[]> {
    const api = new ApiClient(options);
    const md = Object.entries(options.metadata ?? {});
    const query = md.length > 0 ? { metadata: md.map(([k, v]) => `${k}=${v}`).join(",") } : {};
    const r = await api.json<{ sandboxes: WireSandbox[] }>("GET", "/v1/sandboxes", {
      query,
      signal: options.signal,
    });
    return r.sandboxes.map(fromWire);
  }

  /**
   * Creates a sandbox, runs `fn` with it and kills it however `fn` ends (the portable form of
   * `await using sb = await Sandbox.create()`).
   */
  static async with<T>(options: SandboxCreateOptions, fn: (sandbox: Sandbox) => Promise<T> | T): Promise<T> {
    const sb = await Sandbox.create(options);
    let result: T;
    try {
      result = await fn(sb);
    } catch (e) {
      // The caller's error is the one that matters; a failed kill must not replace it.
      await sb.kill().catch(() => {});
      throw e;
    }
    await sb.kill();
    return result;
  }

  async info(options: { signal?: AbortSignal } = {}): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("GET", this.#base, { signal: options.signal }));
  }

  /** Moves the lifetime deadline to now + `ms` (whole seconds, rounded up). */
  async setTimeout(ms: number): Promise<SandboxInfo> {
    return fromWire(
      await this.#api.json<WireSandbox>("POST", `${this.#base}/timeout`, { json: { timeout_s: seconds(ms) } }),
    );
  }

  /**
   * Pauses the sandbox: its processes frozen (memory kept), its clocks stopped with the
   * lifetime left kept. Idempotent. Any command, file or code call resumes it.
   */
  async pause(): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("POST", `${this.#base}/pause`));
  }

  /** Resumes a paused sandbox (its lifetime clock restarts with what was left). Idempotent. */
  async resume(): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("POST", `${this.#base}/resume`));
  }

  /** Destroys the sandbox and everything in it; `false` if it had already ended. */
  async kill(): Promise<boolean> {
    try {
      await this.#api.send("DELETE", this.#base);
      return true;
    } catch (e) {
      if (e instanceof SandboxGoneError || e instanceof NotFoundError) return false;
      throw e;
    }
  }

  async [asyncDispose](): Promise<void> {
    await this.kill();
  }

  // --- code interpreter --------------------------------------------------------------------

  /** Runs a cell in a stateful context; an exception in the code is `execution.error`. */
  runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    return this.#code.runCode(code, options);
  }

  createCodeContext(options: { language?: Language; cwd?: string; signal?: AbortSignal } = {}): Promise<CodeContext> {
    return this.#code.createCodeContext(options);
  }

  listCodeContexts(options: { signal?: AbortSignal } = {}): Promise<CodeContext[]> {
    return this.#code.listCodeContexts(options);
  }

  restartCodeContext(ctx: CodeContext | string): Promise<CodeContext> {
    return this.#code.restartCodeContext(ctx);
  }

  removeCodeContext(ctx: CodeContext | string): Promise<void> {
    return this.#code.removeCodeContext(ctx);
  }

  // --- network and metrics (routes older daemons lack) --------------------------------------

  /** Replaces the network policy of the running sandbox. */
  async updateNetwork(policy: NetworkPolicy): Promise<SandboxInfo> {
    return fromWire(await this.#unsupported("updateNetwork", "PUT", `${this.#base}/network`, policy));
  }

  /** The sandbox's egress audit log: every connection attempt, allowed or denied. */
  async egressLog(): Promise<EgressEvent[]> {
    const r = await this.#unsupported<EgressEvent[] | Record<string, unknown>>(
      "egressLog",
      "GET",
      `${this.#base}/egress`,
    );
    if (Array.isArray(r)) return r;
    const list = Object.values(r).find(Array.isArray);
    return (list ?? []) as EgressEvent[];
  }

  /** Resource usage of the sandbox. */
  async metrics(): Promise<SandboxMetrics> {
    const w = await this.#unsupported<WireMetrics>("metrics", "GET", `${this.#base}/metrics`);
    const m: SandboxMetrics = {
      cpuPercent: w.cpu_percent,
      cpuUsageMs: w.cpu_usage_ms,
      memoryUsedBytes: w.memory_used_bytes,
      memoryLimitBytes: w.memory_limit_bytes,
      diskUsedBytes: w.disk_used_bytes,
      diskLimitBytes: w.disk_limit_bytes,
      pids: w.pids,
      pidsLimit: w.pids_limit,
      oomKills: w.oom_kills,
    };
    if (w.memory_peak_bytes !== undefined && w.memory_peak_bytes !== null) m.memoryPeakBytes = w.memory_peak_bytes;
    return m;
  }

  /** A request to a route older daemons lack: their 404 `not_found` becomes a clear error. */
  async #unsupported<T>(what: string, method: string, path: string, json?: unknown): Promise<T> {
    try {
      return await this.#api.json<T>(method, path, json === undefined ? {} : { json });
    } catch (e) {
      if (e instanceof NotFoundError && e.code === "not_found") {
        throw new NotSupportedError(`${what} is not supported by this daemon (upgrade glovebox)`, {
          code: "not_supported",
          status: e.status,
          cause: e,
        });
      }
      throw e;
    }
  }
}
