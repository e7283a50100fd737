import type { CommandResult } from "./commands.js";

/**
 * Errors raised by the SDK. Every daemon error maps to one class by its stable `code` (and
 * HTTP status); the message is the daemon's own.
 */

export interface GloveboxErrorOptions {
  /** The daemon's stable machine code (`sandbox_gone`, `invalid_request`, …). */
  code?: string;
  /** The HTTP status, or 0 when no response came (connection failure, a stream error line). */
  status?: number;
  cause?: unknown;
}

/** Base class of every error this SDK throws (an aborted request throws the signal's reason). */
export class GloveboxError extends Error {
  readonly code: string;
  readonly status: number;

  constructor(message: string, options: GloveboxErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? "error";
    this.status = options.status ?? 0;
  }
}

/** 400: a malformed request or a value out of bounds (the message names it). */
export class InvalidArgumentError extends GloveboxError {}

/** 401: missing or wrong API key. */
export class AuthError extends GloveboxError {}

/** 404: no such sandbox, file, command, context or template. */
export class NotFoundError extends GloveboxError {}

/** 409: the file exists, the directory is not empty, the command is still running, … */
export class ConflictError extends GloveboxError {}

/** The daemon has no such route: it predates the feature (code `not_supported`). */
export class NotSupportedError extends GloveboxError {}

/** 429: a quota or rate limit was hit. */
export class QuotaError extends GloveboxError {}

/** Why a sandbox ended, as the daemon reports it on 410 `sandbox_gone`. */
export type SandboxEndReason = "timeout" | "killed" | "oom" | "error" | "daemon_restart" | "idle";

/** 410: the sandbox has ended; `reason` says why. */
export class SandboxGoneError extends GloveboxError {
  readonly reason: SandboxEndReason | string | undefined;

  constructor(message: string, options: GloveboxErrorOptions & { reason?: string } = {}) {
    super(message, options);
    this.reason = options.reason;
  }
}

/** A command ran out of its time budget (only thrown with `check: true`); `result` is its result. */
export class TimeoutError extends GloveboxError {
  readonly result: CommandResult | undefined;

  constructor(message: string, options: GloveboxErrorOptions & { result?: CommandResult } = {}) {
    super(message, { code: "timeout", ...options });
    this.result = options.result;
  }
}

/** A command ended with a non-zero exit code (only thrown with `check: true`). */
export class CommandExitError extends GloveboxError {
  readonly result: CommandResult;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;

  constructor(result: CommandResult) {
    let msg = `command exited with code ${result.exitCode}`;
    if (result.oomKilled) msg += " (killed by the out-of-memory killer)";
    const err = result.stderr.trim();
    if (err !== "") msg += `: ${err.slice(-500)}`;
    super(msg, { code: "command_exit" });
    this.result = result;
    this.exitCode = result.exitCode;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
  }
}

type ErrorClass = new (message: string, options: GloveboxErrorOptions) => GloveboxError;

// Every code the daemon returns (the Rust enum `glovebox_proto::api::ErrorCode`; a test in
// crates/glovebox-openapi checks that this table names exactly that set), the same table as
// the Python SDK's: the code decides the class, the status is the fallback.
const BY_CODE: Record<string, ErrorClass> = {
  invalid_request: InvalidArgumentError,
  invalid_path: InvalidArgumentError,
  not_a_directory: InvalidArgumentError,
  is_a_directory: InvalidArgumentError,
  spawn_failed: InvalidArgumentError,
  unauthorized: AuthError,
  forbidden: GloveboxError,
  permission_denied: GloveboxError,
  sandbox_not_found: NotFoundError,
  template_not_found: NotFoundError,
  context_not_found: NotFoundError,
  command_not_found: NotFoundError,
  secret_not_found: NotFoundError,
  volume_not_found: NotFoundError,
  snapshot_not_found: NotFoundError,
  file_not_found: NotFoundError,
  not_found: NotFoundError,
  sandbox_gone: SandboxGoneError,
  conflict: ConflictError,
  volume_in_use: ConflictError,
  sandbox_paused: ConflictError,
  file_exists: ConflictError,
  directory_not_empty: ConflictError,
  quota_exceeded: QuotaError,
  unavailable: GloveboxError,
  start_failed: GloveboxError,
  build_failed: GloveboxError,
  snapshot_failed: GloveboxError,
  disk_full: GloveboxError,
  agent_error: GloveboxError,
  port_not_listening: GloveboxError,
  hibernate_unavailable: NotSupportedError,
  internal: GloveboxError,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidArgumentError,
  401: AuthError,
  404: NotFoundError,
  409: ConflictError,
  413: InvalidArgumentError,
  415: InvalidArgumentError,
  429: QuotaError,
};

/** Builds the typed error for a daemon error body (or an NDJSON `error` line: status 0). */
export function errorFromApi(
  status: number,
  code: string,
  message: string,
  reason?: string,
): GloveboxError {
  const opts = { code, status };
  if (code === "sandbox_gone" || status === 410) {
    return new SandboxGoneError(message, { ...opts, ...(reason === undefined ? {} : { reason }) });
  }
  if (code === "unauthorized" && !message.includes("GLOVEBOX_API_KEY")) {
    message += " (set GLOVEBOX_API_KEY or pass apiKey)";
  }
  const cls = BY_CODE[code] ?? BY_STATUS[status] ?? GloveboxError;
  return new cls(message, opts);
}
