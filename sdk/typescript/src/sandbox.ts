/**
 * `Sandbox`: create, connect to, list and destroy sandboxes; `commands`, `files` and the code
 * interpreter hang off an instance.
 */

import { CodeInterpreter } from "./code.js";
import type { CodeContext, Execution, Language, RunCodeOptions } from "./code.js";
import { Commands } from "./commands.js";
import { Pty } from "./pty.js";
import { NotFoundError, NotSupportedError, SandboxGoneError } from "./errors.js";
import { Files } from "./files.js";
import { ApiClient, seg } from "./http.js";
import type { ConnectionOptions } from "./http.js";
import { snapshotFromWire } from "./snapshots.js";
import type { SnapshotInfo, WireSnapshot } from "./snapshots.js";
import { mountBody } from "./volumes.js";
import type { VolumeMount } from "./volumes.js";

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
  /** Volumes to mount (see `Volume`): `"data:/data"`, `"ref:/ref:ro"` or `{ name, path, readOnly }`. */
  volumes?: VolumeMount[];
  /** Start from one of your snapshots (its files are there at once; its template is used). */
  snapshot?: string;
  /**
   * Which kernel its processes run on: `"process"` (the process jail) or `"gvisor"` (gVisor's
   * user-space kernel, see docs/gvisor.md). Absent: the template's, else the daemon's default.
   * A value the daemon does not know rejects with `InvalidArgumentError` (`invalid_request`).
   */
  isolation?: Isolation;
  signal?: AbortSignal;
}

/** An isolation tier; other strings are passed through for the daemon to judge. */
export type Isolation = "process" | "gvisor" | (string & {});

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
  /** How long without activity before the idle clock acts (whole seconds); absent: no idle clock. */
  idleTimeoutMs?: number;
  /** The snapshot it started from (a fork's children: the fork's anonymous one). */
  snapshot?: string;
  /** The sandbox it was forked from. */
  parentId?: string;
  /** Its lineage, parent first (empty when not a fork's child). */
  ancestors: string[];
  /** Which kernel its processes run on: `"process"` (the jail) or `"gvisor"`. */
  isolation: Isolation;
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
  idle_timeout_s?: number | null;
  snapshot?: string | null;
  parent_id?: string | null;
  ancestors?: string[];
  isolation?: string;
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
    ancestors: w.ancestors ?? [],
    isolation: w.isolation ?? "process",
  };
  if (w.snapshot !== undefined && w.snapshot !== null) info.snapshot = w.snapshot;
  if (w.parent_id !== undefined && w.parent_id !== null) info.parentId = w.parent_id;
  if (w.reason !== undefined && w.reason !== null) info.reason = w.reason;
  if (w.idle_timeout_s !== undefined && w.idle_timeout_s !== null) info.idleTimeoutMs = w.idle_timeout_s * 1000;
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
  readonly pty: Pty;
  readonly #api: ApiClient;
  readonly #code: CodeInterpreter;
  readonly #base: string;

  private constructor(api: ApiClient, id: string) {
    this.id = id;
    this.#api = api;
    this.#base = `/v1/sandboxes/${seg(id)}`;
    this.commands = new Commands(api, id);
    this.files = new Files(api, id);
    this.pty = new Pty(api, id);
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
    if (options.volumes !== undefined && options.volumes.length > 0) body["volumes"] = options.volumes.map(mountBody);
    if (options.snapshot !== undefined) body["snapshot"] = options.snapshot;
    if (options.isolation !== undefined) body["isolation"] = options.isolation;
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

  /** Replaces the sandbox's metadata (the whole set), live; list filters see it at once. */
  async setMetadata(metadata: Record<string, string>): Promise<SandboxInfo> {
    return this.#update({ metadata });
  }

  /**
   * Sets the idle timeout to `ms` (whole seconds, rounded up), live: the idle clock uses it
   * from its next check (measured from the last activity); 0 turns the idle clock off. What
   * it does at the end (`onIdle`) stays as created.
   */
  async setIdleTimeout(ms: number): Promise<SandboxInfo> {
    return this.#update({ idle_timeout_s: seconds(ms) });
  }

  async #update(body: { metadata?: Record<string, string>; idle_timeout_s?: number }): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("PATCH", this.#base, { json: body }));
  }

  /**
   * Pauses the sandbox: its processes frozen (memory kept), its clocks stopped with the
   * lifetime left kept. Idempotent. Any command, file or code call resumes it.
   */
  async pause(): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("POST", `${this.#base}/pause`));
  }

  /**
   * Snapshots the sandbox's files as `name` (frozen for the copy, thawed after unless paused).
   * Processes and memory are not kept. `ConflictError` if the name is taken.
   */
  async snapshot(name: string): Promise<SnapshotInfo> {
    return snapshotFromWire(await this.#api.json<WireSnapshot>("POST", `${this.#base}/snapshots`, { json: { name } }));
  }

  /**
   * `count` (1-20) new sandboxes starting from this one's current files, each with a copy of
   * its network policy, limits, environment and labels (`parentId`, `ancestors` in their
   * info). Running processes are NOT copied: each child starts with nothing running.
   */
  async fork(count = 1): Promise<Sandbox[]> {
    const r = await this.#api.json<{ sandboxes: WireSandbox[] }>("POST", `${this.#base}/fork`, { json: { count } });
    return r.sandboxes.map((w) => new Sandbox(this.#api, w.id));
  }

  /** Resumes a paused sandbox (its lifetime clock restarts with what was left). Idempotent. */
  async resume(): Promise<SandboxInfo> {
    return fromWire(await this.#api.json<WireSandbox>("POST", `${this.#base}/resume`));
  }

  /**
   * Exposes `port` (a server listening inside the sandbox) and returns its preview URL,
   * `http://PORT-ID.<domain>:<daemon port>/`: with the port's token in it (`?gb_token=`)
   * unless `public`, in which case it needs no credential.
   */
  async expose(port: number, opts: { public?: boolean } = {}): Promise<string> {
    const p = await this.#api.json<{ url: string; public: boolean; token: string }>(
      "POST",
      `${this.#base}/ports/${Math.trunc(port)}`,
      { json: { public: opts.public ?? false } },
    );
    return p.public ? p.url : `${p.url}?gb_token=${p.token}`;
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
