/**
 * `@glovebox/sdk`: the TypeScript client of Glovebox, the self-hosted sandbox service.
 *
 * ```ts
 * import { Sandbox } from "@glovebox/sdk";
 * await Sandbox.with({}, async (sb) => {
 *   const r = await sb.commands.run("echo hello");
 *   console.log(r.stdout);
 * });
 * ```
 */

export { Sandbox } from "./sandbox.js";
export type {
  EgressEvent,
  NetworkPolicy,
  Isolation,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxLimits,
  SandboxMetrics,
} from "./sandbox.js";
export { CommandHandle, Commands } from "./commands.js";
export type { CommandInfo, CommandOptions, CommandResult, Signal } from "./commands.js";
export { Pty, PtyHandle } from "./pty.js";
export type { PtyCreateOptions } from "./pty.js";
export { Volume } from "./volumes.js";
export { Snapshot } from "./snapshots.js";
export type { SnapshotInfo } from "./snapshots.js";
export type { VolumeInfo, VolumeMount } from "./volumes.js";
export { Files } from "./files.js";
export type { FileInfo, FileType, ReadFormat, WriteData } from "./files.js";
export { Execution, Result } from "./code.js";
export type { CodeContext, ExecutionError, Language, RunCodeOptions } from "./code.js";
export { DEFAULT_URL } from "./http.js";
export type { ConnectionOptions } from "./http.js";
export {
  AuthError,
  CommandExitError,
  ConflictError,
  GloveboxError,
  InvalidArgumentError,
  NotFoundError,
  NotSupportedError,
  QuotaError,
  SandboxGoneError,
  TimeoutError,
} from "./errors.js";
export type { GloveboxErrorOptions, SandboxEndReason } from "./errors.js";
