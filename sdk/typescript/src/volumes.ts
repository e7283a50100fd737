/**
 * `Volume`: disk-backed directories with a size cap that outlive sandboxes and daemon
 * restarts (docs/volumes.md). Mount one with `Sandbox.create({ volumes: [...] })`.
 */

import { InvalidArgumentError } from "./errors.js";
import { ApiClient, seg } from "./http.js";
import type { ConnectionOptions } from "./http.js";

/** A volume to mount at create: `"name:/path"`, `"name:/path:ro"` or an object. */
export type VolumeMount = string | { name: string; path: string; readOnly?: boolean };

export interface VolumeInfo {
  name: string;
  sizeMb: number;
  createdAt: string;
  /** Live sandboxes that have it mounted. */
  mountedBy: number;
}

interface WireVolume {
  name: string;
  size_mb: number;
  created_at: string;
  mounted_by: number;
}

type Options = ConnectionOptions & { signal?: AbortSignal };

function fromWire(w: WireVolume): VolumeInfo {
  return { name: w.name, sizeMb: w.size_mb, createdAt: w.created_at, mountedBy: w.mounted_by };
}

/** One entry of the create body's `volumes`. */
export function mountBody(m: VolumeMount): { name: string; path: string; read_only: boolean } {
  if (typeof m !== "string") return { name: m.name, path: m.path, read_only: m.readOnly ?? false };
  const i = m.indexOf(":");
  const name = i < 0 ? m : m.slice(0, i);
  let path = i < 0 ? "" : m.slice(i + 1);
  const readOnly = path.endsWith(":ro");
  if (readOnly || path.endsWith(":rw")) path = path.slice(0, -3);
  if (name === "" || path === "") {
    throw new InvalidArgumentError(`volume must be "name:/path" or "name:/path:ro", got ${JSON.stringify(m)}`, {
      code: "invalid_request",
    });
  }
  return { name, path, read_only: readOnly };
}

/** Volume operations, each one call of docs/api.md#volumes. */
export const Volume = {
  /** Creates a volume of `sizeMb` MiB (writes beyond it fail with ENOSPC); `ConflictError` if it exists. */
  async create(name: string, sizeMb: number, options: Options = {}): Promise<VolumeInfo> {
    const api = new ApiClient(options);
    const w = await api.json<WireVolume>("POST", "/v1/volumes", {
      json: { name, size_mb: sizeMb },
      signal: options.signal,
    });
    return fromWire(w);
  },

  /** The caller's volumes, by name. */
  async list(options: Options = {}): Promise<VolumeInfo[]> {
    const r = await new ApiClient(options).json<{ volumes: WireVolume[] }>("GET", "/v1/volumes", {
      signal: options.signal,
    });
    return r.volumes.map(fromWire);
  },

  /** One volume (`NotFoundError`, code `volume_not_found`, if there is none). */
  async get(name: string, options: Options = {}): Promise<VolumeInfo> {
    return fromWire(
      await new ApiClient(options).json<WireVolume>("GET", `/v1/volumes/${seg(name)}`, { signal: options.signal }),
    );
  },

  /** Deletes a volume and its data (`ConflictError`, code `volume_in_use`, while mounted). */
  async delete(name: string, options: Options = {}): Promise<void> {
    await new ApiClient(options).send("DELETE", `/v1/volumes/${seg(name)}`, { signal: options.signal });
  },
};
