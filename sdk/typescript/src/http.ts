/**
 * The one place that talks HTTP: configuration, authentication, error mapping and the
 * NDJSON line reader. Everything else builds paths and bodies and calls {@link ApiClient}.
 */

import { errorFromApi, GloveboxError } from "./errors.js";

/** Where the daemon is and how to authenticate; each field falls back to the environment. */
export interface ConnectionOptions {
  /** Base URL of the daemon; default `GLOVEBOX_URL`, else `http://127.0.0.1:7171`. */
  url?: string;
  /** API key; default `GLOVEBOX_API_KEY`. */
  apiKey?: string;
}

export const DEFAULT_URL = "http://127.0.0.1:7171";

/** A request body (spelled without DOM-only names so the declarations suit Node's types). */
type Body = NonNullable<RequestInit["body"]>;

type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as is (file uploads, stdin). */
  body?: Body;
  accept?: string;
  signal?: AbortSignal | undefined;
}

function env(name: string): string | undefined {
  // `process` is not part of the web globals this package is typed against; reach it loosely
  // so the SDK still loads where there is no `process` (it then needs explicit options).
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = p?.env?.[name];
  return v === undefined || v === "" ? undefined : v;
}

/** A configured connection to one daemon. @internal */
export class ApiClient {
  readonly url: string;
  readonly apiKey: string | undefined;

  constructor(options: ConnectionOptions = {}) {
    this.url = (options.url ?? env("GLOVEBOX_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? env("GLOVEBOX_API_KEY");
  }

  /** Sends one request; a non-2xx answer throws its typed error, a 2xx returns the response. */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const u = new URL(this.url + path);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v !== undefined) u.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = {};
    if (this.apiKey !== undefined) headers["authorization"] = `Bearer ${this.apiKey}`;
    if (opts.accept !== undefined) headers["accept"] = opts.accept;
    let body: Body | undefined = opts.body;
    if (opts.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(opts.json);
    } else if (body !== undefined) {
      headers["content-type"] = "application/octet-stream";
    }
    const init: RequestInit & { duplex?: "half" } = { method, headers };
    if (body !== undefined) init.body = body;
    // A streamed upload needs half-duplex (Node's fetch refuses a stream body without it).
    if (body instanceof ReadableStream) init.duplex = "half";
    if (opts.signal !== undefined) init.signal = opts.signal;
    let res: Response;
    try {
      res = await fetch(u, init);
    } catch (e) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw new GloveboxError(`cannot reach glovebox at ${this.url}: ${describe(e)}`, {
        code: "connection_error",
        cause: e,
      });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res;
  }

  async json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, { accept: "application/json", ...opts });
    return (await res.json()) as T;
  }

  /** Sends a request whose answer is not read (a 204, or one whose body does not matter). */
  async send(method: string, path: string, opts: RequestOptions = {}): Promise<void> {
    const res = await this.request(method, path, opts);
    await res.body?.cancel();
  }
}

function describe(e: unknown): string {
  const cause = (e as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code) return cause.code;
  if (cause?.message) return cause.message;
  return e instanceof Error ? e.message : String(e);
}

async function errorFromResponse(res: Response): Promise<GloveboxError> {
  const text = await res.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string; reason?: string } };
    if (body.error?.code !== undefined) {
      return errorFromApi(res.status, body.error.code, body.error.message ?? text, body.error.reason);
    }
  } catch {
    // Not the daemon's JSON (a proxy in between, say): fall through with the raw text.
  }
  return errorFromApi(res.status, `http_${res.status}`, text || res.statusText);
}

/** The JSON objects of an NDJSON response body, one per line, as they arrive. */
export async function* ndjson<T>(res: Response): AsyncGenerator<T> {
  if (res.body === null) return;
  const decoder = new TextDecoder();
  let buf = "";
  const reader = res.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line !== "") yield JSON.parse(line) as T;
      }
    }
    buf += decoder.decode();
    if (buf.trim() !== "") yield JSON.parse(buf) as T;
  } finally {
    // Leaving early (a callback threw, the caller aborted) releases the connection.
    await reader.cancel().catch(() => {});
  }
}

/** Path segment encoding for ids. */
export function seg(s: string | number): string {
  return encodeURIComponent(String(s));
}

export function base64ToBytes(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function bytesToBase64(bytes: Uint8Array): string {
  let bin = "";
  const step = 0x8000;
  for (let i = 0; i < bytes.length; i += step) {
    bin += String.fromCharCode(...bytes.subarray(i, i + step));
  }
  return btoa(bin);
}
