/**
 * The sandbox's filesystem. Paths are sandbox paths (relative ones start at `/home/user`);
 * the daemon resolves them inside the sandbox, so `..` and symlinks cannot leave it.
 */

import { GloveboxError, InvalidArgumentError, NotFoundError } from "./errors.js";
import { ApiClient, seg } from "./http.js";

export type FileType = "file" | "dir" | "symlink" | "other";

export interface FileInfo {
  /** Absolute sandbox path. */
  path: string;
  name: string;
  type: FileType;
  size: number;
  /** Permission bits (e.g. `0o644`). */
  mode: number;
  uid: number;
  gid: number;
  mtime: Date;
  /** A symlink's target. */
  target?: string;
}

/** What `files.write` accepts: text (UTF-8), bytes, a blob, or a stream of bytes. */
export type WriteData =
  | string
  | Uint8Array
  | ArrayBuffer
  | Blob
  | ReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array | string>;

export type ReadFormat = "text" | "bytes" | "stream";

interface WireFileInfo {
  path: string;
  name: string;
  type: FileType;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  mtime: number;
  target?: string;
}

function fromWire(w: WireFileInfo): FileInfo {
  const info: FileInfo = {
    path: w.path,
    name: w.name,
    type: w.type,
    size: w.size,
    mode: w.mode,
    uid: w.uid,
    gid: w.gid,
    mtime: new Date(w.mtime * 1000),
  };
  if (w.target !== undefined && w.target !== null) info.target = w.target;
  return info;
}

function toStream(it: AsyncIterable<Uint8Array | string>): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  const iter = it[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await iter.next();
      if (done) controller.close();
      else controller.enqueue(typeof value === "string" ? enc.encode(value) : value);
    },
    async cancel(reason) {
      await iter.return?.(reason);
    },
  });
}

function toBody(data: WriteData): BodyInit {
  if (typeof data === "string") return new TextEncoder().encode(data);
  // (Any Uint8Array is a valid body; TS's DOM lib only admits ones over a plain ArrayBuffer.)
  if (data instanceof Uint8Array || data instanceof ArrayBuffer) return data as BodyInit;
  if (data instanceof ReadableStream) return data;
  if (typeof Blob !== "undefined" && data instanceof Blob) return data;
  if (typeof (data as AsyncIterable<unknown>)[Symbol.asyncIterator] === "function") {
    return toStream(data as AsyncIterable<Uint8Array | string>);
  }
  throw new InvalidArgumentError("files.write: data must be a string, bytes, a Blob or a stream");
}

interface Opts {
  signal?: AbortSignal;
}

/** `sandbox.files`. */
export class Files {
  readonly #api: ApiClient;
  readonly #base: string;

  /** @internal */
  constructor(api: ApiClient, sandboxId: string) {
    this.#api = api;
    this.#base = `/v1/sandboxes/${seg(sandboxId)}/files`;
  }

  /**
   * Writes a file (created or replaced; missing parent directories are created). Streams
   * are uploaded as they are read, so any size within the sandbox's disk budget works.
   */
  async write(path: string, data: WriteData, options: Opts & { mode?: number } = {}): Promise<FileInfo> {
    const query: Record<string, string> = { path };
    if (options.mode !== undefined) query["mode"] = options.mode.toString(8).padStart(4, "0");
    const w = await this.#api.json<WireFileInfo>("PUT", this.#base, {
      query,
      body: toBody(data),
      signal: options.signal,
    });
    return fromWire(w);
  }

  /** Reads a file: as UTF-8 text (default), as bytes, or as a stream of bytes. */
  read(path: string, options?: Opts & { format?: "text" }): Promise<string>;
  read(path: string, options: Opts & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, options: Opts & { format: "stream" }): Promise<ReadableStream<Uint8Array>>;
  read(path: string, options?: Opts & { format?: ReadFormat }): Promise<string | Uint8Array | ReadableStream<Uint8Array>>;
  async read(
    path: string,
    options: Opts & { format?: ReadFormat } = {},
  ): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    const res = await this.#api.request("GET", this.#base, { query: { path }, signal: options.signal });
    switch (options.format ?? "text") {
      case "text":
        return await res.text();
      case "bytes":
        return new Uint8Array(await res.arrayBuffer());
      case "stream":
        if (res.body === null) return new ReadableStream<Uint8Array>({ start: (c) => c.close() });
        return res.body as ReadableStream<Uint8Array>;
      default:
        await res.body?.cancel();
        throw new InvalidArgumentError(`files.read: unknown format ${String(options.format)}`);
    }
  }

  /** Entries under a directory, `depth` levels deep (default 1, at most 32). */
  async list(path: string, options: Opts & { depth?: number } = {}): Promise<FileInfo[]> {
    const r = await this.#api.json<{ entries: WireFileInfo[] }>("GET", `${this.#base}/list`, {
      query: { path, depth: options.depth },
      signal: options.signal,
    });
    return r.entries.map(fromWire);
  }

  /** Whether something exists at the path (a dangling symlink counts: it is not followed). */
  async exists(path: string, options: Opts = {}): Promise<boolean> {
    try {
      await this.getInfo(path, options);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      // A path through a regular file ("a.txt/b") names nothing either.
      if (e instanceof GloveboxError && e.code === "not_a_directory") return false;
      throw e;
    }
  }

  /** Metadata of one path (a symlink is reported as one, not followed). */
  async getInfo(path: string, options: Opts = {}): Promise<FileInfo> {
    return fromWire(
      await this.#api.json<WireFileInfo>("GET", `${this.#base}/stat`, {
        query: { path },
        signal: options.signal,
      }),
    );
  }

  /** Removes a file or an empty directory; `recursive: true` removes a whole tree. */
  async remove(path: string, options: Opts & { recursive?: boolean } = {}): Promise<void> {
    await this.#api.send("DELETE", this.#base, {
      query: { path, recursive: options.recursive ? true : undefined },
      signal: options.signal,
    });
  }

  /** Moves a file or directory; returns the new path's metadata. */
  async rename(from: string, to: string, options: Opts = {}): Promise<FileInfo> {
    return fromWire(
      await this.#api.json<WireFileInfo>("POST", `${this.#base}/rename`, {
        json: { from, to },
        signal: options.signal,
      }),
    );
  }

  /** Creates a directory and any missing parents. */
  async makeDir(path: string, options: Opts = {}): Promise<FileInfo> {
    return fromWire(
      await this.#api.json<WireFileInfo>("POST", `${this.#base}/mkdir`, {
        json: { path },
        signal: options.signal,
      }),
    );
  }
}
