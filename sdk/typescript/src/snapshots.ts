/**
 * `Snapshot`: a sandbox's files at one moment, kept as a read-only layer (docs/snapshots.md).
 * Take one with `sandbox.snapshot(name)`, start from one with `Sandbox.create({ snapshot })`,
 * fork with `sandbox.fork(count)`. Processes and memory are never part of a snapshot.
 */

import { ApiClient, seg } from "./http.js";
import type { ConnectionOptions } from "./http.js";

export interface SnapshotInfo {
  name: string;
  template: string;
  sourceSandbox: string;
  createdAt: string;
  layer: string;
  sizeBytes: number;
  /** Special files (fifos, sockets, device nodes) left out. */
  skipped: number;
  /** Live sandboxes started from it. */
  sandboxes: number;
}

export interface WireSnapshot {
  name: string;
  template: string;
  source_sandbox: string;
  created_at: string;
  layer: string;
  size_bytes: number;
  skipped?: number;
  sandboxes: number;
}

type Options = ConnectionOptions & { signal?: AbortSignal };

export function snapshotFromWire(w: WireSnapshot): SnapshotInfo {
  return {
    name: w.name,
    template: w.template,
    sourceSandbox: w.source_sandbox,
    createdAt: w.created_at,
    layer: w.layer,
    sizeBytes: w.size_bytes,
    skipped: w.skipped ?? 0,
    sandboxes: w.sandboxes,
  };
}

/** Snapshot operations, each one call of docs/api.md#snapshots-and-forks. */
export const Snapshot = {
  /** The caller's snapshots, by name. */
  async list(options: Options = {}): Promise<SnapshotInfo[]> {
    const r = await new ApiClient(options).json<{ snapshots: WireSnapshot[] }>("GET", "/v1/snapshots", {
      signal: options.signal,
    });
    return r.snapshots.map(snapshotFromWire);
  },

  /** One snapshot (`NotFoundError`, code `snapshot_not_found`, if there is none). */
  async get(name: string, options: Options = {}): Promise<SnapshotInfo> {
    return snapshotFromWire(
      await new ApiClient(options).json<WireSnapshot>("GET", `/v1/snapshots/${seg(name)}`, { signal: options.signal }),
    );
  },

  /** Deletes a snapshot; never refused for being in use (its files go with its last sandbox). */
  async delete(name: string, options: Options = {}): Promise<void> {
    await new ApiClient(options).send("DELETE", `/v1/snapshots/${seg(name)}`, { signal: options.signal });
  },
};
