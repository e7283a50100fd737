//! The hand-written half of the document: one row per (method, route) the daemon serves
//! (`crates/glovebox-daemon/src/http/mod.rs`, `router`), naming the request and response bodies
//! by their schema names. The `valid` test parses the router's `.route("…")` calls and fails
//! when a route or method here is missing.

use serde_json::{json, Map, Value};

/// A request or response body.
#[derive(Clone, Copy)]
pub enum Body {
    None,
    /// `application/json` with this schema.
    Json(&'static str),
    /// `application/json`, or one JSON object of the second schema per line with
    /// `Accept: application/x-ndjson`.
    JsonOrNdjson(&'static str, &'static str),
    /// Raw bytes (`application/octet-stream`).
    Bytes,
    /// `text/plain`.
    Text,
}

/// A parameter's schema.
#[derive(Clone, Copy)]
pub enum Ty {
    Str,
    Bool,
    /// An integer in `[min, max]` with a default.
    Int {
        min: u64,
        max: u64,
        default: u64,
    },
    /// An unsigned 64-bit integer.
    U64,
    /// A string matching a regular expression.
    Pattern(&'static str),
    /// A component schema.
    Ref(&'static str),
}

#[derive(Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    /// `path` or `query`.
    pub place: &'static str,
    pub ty: Ty,
    pub required: bool,
    pub description: &'static str,
}

const fn path(name: &'static str, ty: Ty, description: &'static str) -> Param {
    Param { name, place: "path", ty, required: true, description }
}

const fn query(name: &'static str, ty: Ty, description: &'static str) -> Param {
    Param { name, place: "query", ty, required: false, description }
}

const ID: Param = path("id", Ty::Str, "Sandbox id.");
const TPL: Param = path("name", Ty::Str, "Template name.");
const SECRET: Param = path("name", Ty::Str, "Secret name.");
const VOLUME: Param = path("name", Ty::Str, "Volume name.");
const SNAPSHOT: Param = path("name", Ty::Str, "Snapshot name.");
const CMD_ID: Param = path("cid", Ty::U64, "Command id (`id` of `Started` or `ExecResult`).");
const CTX_ID: Param = path("cid", Ty::Str, "Context id (`id` of `Context`).");
const FILE_PATH: Param = Param {
    name: "path",
    place: "query",
    ty: Ty::Str,
    required: true,
    description: "Sandbox path; relative paths start at `/home/user`. Resolved inside the sandbox: `..` \
                  and symlinks cannot leave it.",
};

/// A success response.
#[derive(Clone, Copy)]
pub struct Reply {
    pub status: u16,
    pub description: &'static str,
    pub body: Body,
}

const fn reply(status: u16, description: &'static str, body: Body) -> Reply {
    Reply { status, description, body }
}

const NO_CONTENT: Reply = reply(204, "Done.", Body::None);

/// One operation.
pub struct Op {
    pub method: &'static str,
    pub path: &'static str,
    pub id: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
    pub params: &'static [Param],
    pub body: Body,
    /// Whether `body` may be left out.
    pub body_optional: bool,
    pub replies: &'static [Reply],
    /// Error statuses, each a `components/responses` entry with an `ErrorBody`.
    pub errors: &'static [u16],
    /// Served without an API key.
    pub public: bool,
}

const OP: Op = Op {
    method: "",
    path: "",
    id: "",
    tag: "",
    summary: "",
    description: "",
    params: &[],
    body: Body::None,
    body_optional: false,
    replies: &[],
    errors: &[],
    public: false,
};

/// Errors of a route that looks up a sandbox.
const SB: &[u16] = &[401, 404, 410, 500];
/// … and takes a JSON body.
const SB_JSON: &[u16] = &[400, 401, 404, 410, 413, 415, 500];
/// … and talks to the sandbox's agent.
const SB_AGENT: &[u16] = &[400, 401, 404, 410, 500, 502];
/// … a file operation.
const SB_FILE: &[u16] = &[400, 401, 403, 404, 409, 410, 500, 502, 507];
const SB_FILE_JSON: &[u16] = &[400, 401, 403, 404, 409, 410, 413, 415, 500, 502, 507];

const EVENT_PARAMS: [Param; 4] = [
    query("after", Ty::U64, "Only events with a larger `seq` (default 0)."),
    query("limit", Ty::Int { min: 1, max: 1000, default: 1000 }, "Most events returned."),
    query("follow", Ty::Bool, "Stream NDJSON and keep following new events (default false)."),
    query("timeout_s", Ty::Int { min: 1, max: 3600, default: 300 }, "How long a follow stream stays open."),
];
const EVENT_PARAMS_SB: [Param; 5] = [ID, EVENT_PARAMS[0], EVENT_PARAMS[1], EVENT_PARAMS[2], EVENT_PARAMS[3]];

pub const OPS: &[Op] = &[
    // --- sandboxes ---------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes",
        id: "createSandbox",
        tag: "sandboxes",
        summary: "Create a sandbox",
        description: "All fields are optional. Bounds: `timeout_s` 1–86400; `cpus` 0.01–64; `memory_mb` \
                      16–262144; `disk_mb` 1–1048576; `pids` 8–65536. `on_idle` `hibernate` is \
                      answered 501 `hibernate_unavailable` on hosts that cannot checkpoint processes. \
                      `snapshot` starts from one of the caller's snapshots (404 `snapshot_not_found`): its \
                      files are there at once and its template is used.",
        body: Body::Json("CreateSandbox"),
        replies: &[reply(201, "The new sandbox.", Body::Json("Sandbox"))],
        errors: &[400, 401, 404, 409, 413, 415, 429, 500, 501, 503],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes",
        id: "listSandboxes",
        tag: "sandboxes",
        summary: "List live sandboxes",
        params: &[query(
            "metadata",
            Ty::Str,
            "`key=value` filters, comma separated (`k1=v1,k2=v2`); every pair must match.",
        )],
        replies: &[reply(200, "The live sandboxes.", Body::Json("SandboxList"))],
        errors: &[400, 401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}",
        id: "getSandbox",
        tag: "sandboxes",
        summary: "Get a sandbox",
        description: "A sandbox that has ended answers 410 `sandbox_gone` with the `reason`.",
        params: &[ID],
        replies: &[reply(200, "The sandbox.", Body::Json("Sandbox"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/sandboxes/{id}",
        id: "deleteSandbox",
        tag: "sandboxes",
        summary: "Destroy a sandbox",
        description: "Everything running in it is killed.",
        params: &[ID],
        replies: &[NO_CONTENT],
        errors: SB,
        ..OP
    },
    Op {
        method: "patch",
        path: "/v1/sandboxes/{id}",
        id: "updateSandbox",
        tag: "sandboxes",
        summary: "Change a sandbox's labels or idle timeout",
        description: "Each field given replaces the current value (`metadata`: the whole set); each left \
                      out stays. `idle_timeout_s` is used from the idle clock's next check on; 0 turns the \
                      idle clock off. The new values are stored: a restarted daemon keeps them.",
        params: &[ID],
        body: Body::Json("UpdateSandbox"),
        replies: &[reply(200, "The sandbox with its new settings.", Body::Json("Sandbox"))],
        errors: SB_JSON,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/timeout",
        id: "setSandboxTimeout",
        tag: "sandboxes",
        summary: "Move a sandbox's lifetime deadline",
        description: "The deadline becomes now + `timeout_s`.",
        params: &[ID],
        body: Body::Json("SetTimeout"),
        replies: &[reply(200, "The sandbox with its new deadline.", Body::Json("Sandbox"))],
        errors: SB_JSON,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/pause",
        id: "pauseSandbox",
        tag: "sandboxes",
        summary: "Pause a sandbox",
        description: "Freezes every process where it stands (its memory stays) and stops its lifetime and \
                      idle clocks, keeping the lifetime it had left. Idempotent. Any request that reaches \
                      its processes (exec, commands, files, code, contexts, keepalive) resumes it first.",
        params: &[ID],
        replies: &[reply(200, "The sandbox, `state` `paused`.", Body::Json("Sandbox"))],
        errors: &[401, 404, 409, 410, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/resume",
        id: "resumeSandbox",
        tag: "sandboxes",
        summary: "Resume a paused sandbox",
        description: "Thaws its processes and restarts its lifetime clock with the time it had left when \
                      paused. Idempotent.",
        params: &[ID],
        replies: &[reply(200, "The sandbox, `state` `running`.", Body::Json("Sandbox"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "put",
        path: "/v1/sandboxes/{id}/network",
        id: "setSandboxNetwork",
        tag: "network",
        summary: "Replace a sandbox's network policy",
        description: "Takes effect at once; connections the new policy no longer allows are reset.",
        params: &[ID],
        body: Body::Json("NetworkPolicy"),
        replies: &[reply(200, "The sandbox with its new policy.", Body::Json("Sandbox"))],
        errors: &[400, 401, 404, 410, 413, 415, 500, 502, 503],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/egress",
        id: "getEgressLog",
        tag: "network",
        summary: "The sandbox's egress attempts",
        params: &[ID],
        replies: &[reply(200, "Recent egress attempts, allowed and denied.", Body::Json("EgressLog"))],
        errors: SB,
        ..OP
    },
    // --- secrets -----------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/secrets",
        id: "createSecret",
        tag: "secrets",
        summary: "Create or replace a secret",
        description: "`name`: 1–64 of `A-Z a-z 0-9 _ . -`, starting with a letter or `_`; `value`: 1–8192 \
                      bytes without control characters. Policies reference it as `${secret:NAME}` in \
                      `inject_headers`. The value is never returned.",
        body: Body::Json("PutSecret"),
        replies: &[
            reply(201, "Created (metadata only).", Body::Json("SecretInfo")),
            reply(200, "Replaced (metadata only).", Body::Json("SecretInfo")),
        ],
        errors: &[400, 401, 409, 413, 415, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/secrets",
        id: "listSecrets",
        tag: "secrets",
        summary: "List secrets (names and dates, never values)",
        replies: &[reply(200, "The secrets, by name.", Body::Json("SecretList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/secrets/{name}",
        id: "getSecret",
        tag: "secrets",
        summary: "A secret's metadata (never its value)",
        params: &[SECRET],
        replies: &[reply(200, "Name and dates.", Body::Json("SecretInfo"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "put",
        path: "/v1/secrets/{name}",
        id: "putSecret",
        tag: "secrets",
        summary: "Create or replace a secret by name",
        description: "New connections of brokering sandboxes use the new value.",
        params: &[SECRET],
        body: Body::Json("PutSecret"),
        replies: &[
            reply(201, "Created (metadata only).", Body::Json("SecretInfo")),
            reply(200, "Replaced (metadata only).", Body::Json("SecretInfo")),
        ],
        errors: &[400, 401, 409, 413, 415, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/secrets/{name}",
        id: "deleteSecret",
        tag: "secrets",
        summary: "Delete a secret",
        description: "Brokered connections opened afterwards that reference it are refused (audited).",
        params: &[SECRET],
        replies: &[reply(204, "Deleted.", Body::None)],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/metrics",
        id: "getSandboxMetrics",
        tag: "sandboxes",
        summary: "Resource use of a sandbox",
        description: "`cpu_percent` is the average since the previous call (100 = one core).",
        params: &[ID],
        replies: &[reply(200, "Current usage and limits.", Body::Json("SandboxMetrics"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/usage",
        id: "getSandboxUsage",
        tag: "tenants",
        summary: "Metered use of a sandbox (running or ended)",
        description: "CPU-seconds, memory GiB-seconds and peak, wall time and egress bytes. Kept after the \
                      sandbox ended (`ended_at` set).",
        params: &[ID],
        replies: &[reply(200, "The sandbox's usage.", Body::Json("SandboxUsage"))],
        errors: &[401, 404],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/keepalive",
        id: "keepAlive",
        tag: "sandboxes",
        summary: "Count as activity for the idle clock",
        description: "Restarts the idle period of a sandbox created with `idle_timeout_s` (any other \
                      request on it, a running command or an open stream does too). No body.",
        params: &[ID],
        body_optional: true,
        replies: &[reply(200, "The sandbox.", Body::Json("Sandbox"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/ports/{port}",
        id: "exposePort",
        tag: "sandboxes",
        summary: "Expose a port of a sandbox (preview URL and token)",
        description: "A server listening on `127.0.0.1:{port}` inside the sandbox is then reached at `url` \
                      (`http://{port}-{id}.<preview domain>:<daemon port>/`, routed on the Host header) and at \
                      `path_url` (`/v1/sandboxes/{id}/ports/{port}/…`, any method, WebSocket upgrades and \
                      streaming bodies pass through). Private unless `public`: the path takes the API key, \
                      both take the port's `token` (`?gb_token=`, then a cookie, or `X-Glovebox-Port-Token`). \
                      The connection is made inside the sandbox's network namespace: no host port is opened \
                      and the sandbox's network policy is unchanged. Nothing listening answers 502 \
                      `port_not_listening`. No body means `{}`.",
        params: &[ID, path("port", Ty::Int { min: 1, max: 65535, default: 8000 }, "Port inside the sandbox.")],
        body: Body::Json("ExposePort"),
        body_optional: true,
        replies: &[reply(200, "Where the port is reached.", Body::Json("ExposedPort"))],
        errors: SB_JSON,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/ports",
        id: "listPorts",
        tag: "sandboxes",
        summary: "The exposed ports of a sandbox",
        params: &[ID],
        replies: &[reply(200, "Exposed ports, lowest first.", Body::Json("ExposedPortList"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/events",
        id: "getSandboxEvents",
        tag: "events",
        summary: "Lifecycle events of a sandbox (running or ended)",
        description: "`created`, `adopted` (by a restarted daemon), `ended` with its reason. With \
                      `follow=true`: NDJSON, one `LifecycleEvent` per line, new ones as they happen, \
                      until `timeout_s`.",
        params: &EVENT_PARAMS_SB,
        replies: &[reply(200, "Events, oldest first.", Body::JsonOrNdjson("EventList", "LifecycleEvent"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/events",
        id: "getEvents",
        tag: "events",
        summary: "Lifecycle events of all the caller's sandboxes",
        description: "Like the per-sandbox list; the admin key sees every tenant's.",
        params: &EVENT_PARAMS,
        replies: &[reply(200, "Events, oldest first.", Body::JsonOrNdjson("EventList", "LifecycleEvent"))],
        errors: &[400, 401, 500],
        ..OP
    },
    // --- commands ----------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/exec",
        id: "exec",
        tag: "commands",
        summary: "Run a command",
        description: "Waits for the command and returns its result. With `Accept: application/x-ndjson` \
                      the response streams one `ExecStreamLine` per line: `started`, `stdout`/`stderr` \
                      chunks as they happen, then `exited` (with empty output fields) or `error`. With \
                      `\"background\": true` it answers 202 at once; fetch the result from \
                      `GET …/commands/{cid}`.",
        params: &[ID],
        body: Body::Json("ExecRequest"),
        replies: &[
            reply(
                200,
                "The finished command (or its event stream).",
                Body::JsonOrNdjson("ExecResult", "ExecStreamLine"),
            ),
            reply(202, "A background command was started.", Body::Json("Started")),
        ],
        errors: &[400, 401, 404, 410, 413, 415, 500, 502],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/commands",
        id: "listCommands",
        tag: "commands",
        summary: "List the sandbox's commands",
        description: "Running commands and the last 64 finished ones.",
        params: &[ID],
        replies: &[reply(200, "The commands.", Body::Json("CommandList"))],
        errors: SB_AGENT,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/commands/{cid}",
        id: "getCommand",
        tag: "commands",
        summary: "A command's result",
        description: "With `wait=true` waits for the command to end; with `wait=false` a command still \
                      running is a 409. A finished command's record (exit, timing, the first 64 KiB of \
                      each stream) is kept for the daemon's retention period (default 24 h), also after \
                      the sandbox ended.",
        params: &[
            ID,
            CMD_ID,
            query("wait", Ty::Bool, "Wait for the command to end (default false)."),
            query("encoding", Ty::Ref("Encoding"), "How the output fields are encoded (default utf8)."),
        ],
        replies: &[reply(200, "The finished command.", Body::Json("ExecResult"))],
        errors: &[400, 401, 404, 409, 410, 500, 502],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/commands/{cid}/kill",
        id: "killCommand",
        tag: "commands",
        summary: "Signal a command",
        description: "An empty body sends SIGKILL, which kills every process the command started.",
        params: &[ID, CMD_ID],
        body: Body::Json("SignalRequest"),
        body_optional: true,
        replies: &[NO_CONTENT],
        errors: SB_AGENT,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/commands/{cid}/stdin",
        id: "sendStdin",
        tag: "commands",
        summary: "Feed a background command's stdin",
        params: &[ID, CMD_ID, query("close", Ty::Bool, "Close stdin after these bytes (default false).")],
        body: Body::Bytes,
        body_optional: true,
        replies: &[NO_CONTENT],
        errors: &[400, 401, 404, 409, 410, 500, 502],
        ..OP
    },
    // --- terminals ---------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/pty",
        id: "createPty",
        tag: "terminals",
        summary: "Start a command on a pseudo-terminal",
        description: "Runs in the background (only the sandbox's lifetime bounds it) with the terminal as its \
                      stdin, stdout, stderr and controlling terminal; `TERM` defaults to `xterm-256color`. \
                      Default command: a login shell (`/bin/bash -l`, else `/bin/sh -l`). Attach with \
                      `GET …/pty/{cid}/ws`; input also through `…/commands/{cid}/stdin`, signals through \
                      `…/commands/{cid}/kill`, the exit status through `…/commands/{cid}?wait=true`. \
                      Output is not kept: while nobody is attached a bounded backlog fills, then the program \
                      waits to write.",
        params: &[ID],
        body: Body::Json("PtyRequest"),
        replies: &[reply(201, "Started.", Body::Json("Started"))],
        errors: SB_JSON,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/pty/{cid}/resize",
        id: "resizePty",
        tag: "terminals",
        summary: "Resize a terminal",
        description: "Both sides 1 to 1000; the program in the foreground gets SIGWINCH.",
        params: &[ID, CMD_ID],
        body: Body::Json("PtyResize"),
        replies: &[NO_CONTENT],
        errors: &[400, 401, 404, 410, 413, 415, 500, 502],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/pty/{cid}/ws",
        id: "attachPty",
        tag: "terminals",
        summary: "Attach to a terminal (WebSocket)",
        description: "A WebSocket upgrade. Binary frames are the terminal's bytes both ways; text frames are \
                      JSON: `PtyControl` from the client (`{\"resize\":{\"cols\":C,\"rows\":R}}`, \
                      `{\"signal\":N}` for the foreground process group), `PtyEvent` from the daemon (an \
                      `error` for a refused control message; `exited` last, then the close). Closing the \
                      socket detaches; the program keeps running. A new attachment takes the terminal over: \
                      the one before is closed with code 4001.",
        params: &[ID, CMD_ID],
        replies: &[reply(101, "Switching to the WebSocket protocol.", Body::None)],
        errors: SB_AGENT,
        ..OP
    },
    // --- files -------------------------------------------------------------------------
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/files",
        id: "downloadFile",
        tag: "files",
        summary: "Download a file",
        params: &[ID, FILE_PATH],
        replies: &[reply(200, "The file's bytes (streamed).", Body::Bytes)],
        errors: SB_FILE,
        ..OP
    },
    Op {
        method: "put",
        path: "/v1/sandboxes/{id}/files",
        id: "uploadFile",
        tag: "files",
        summary: "Upload a file",
        description: "The body is streamed (any size within the disk budget); missing parent directories \
                      are created.",
        params: &[ID, FILE_PATH, query("mode", Ty::Pattern("^(0o)?[0-7]{1,4}$"), "Octal file mode, e.g. `0644`.")],
        body: Body::Bytes,
        replies: &[reply(200, "The written file.", Body::Json("FileInfo"))],
        errors: SB_FILE,
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/sandboxes/{id}/files",
        id: "removeFile",
        tag: "files",
        summary: "Remove a file or directory",
        params: &[ID, FILE_PATH, query("recursive", Ty::Bool, "Remove a non-empty directory (default false).")],
        replies: &[NO_CONTENT],
        errors: SB_FILE,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/files/list",
        id: "listFiles",
        tag: "files",
        summary: "List a directory",
        description: "At most 10,000 entries.",
        params: &[ID, FILE_PATH, query("depth", Ty::Int { min: 1, max: 32, default: 1 }, "How deep to descend.")],
        replies: &[reply(200, "The entries.", Body::Json("Entries"))],
        errors: SB_FILE,
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/files/stat",
        id: "statFile",
        tag: "files",
        summary: "Describe a path",
        description: "A symlink is reported as one (not followed).",
        params: &[ID, FILE_PATH],
        replies: &[reply(200, "The path's metadata.", Body::Json("FileInfo"))],
        errors: SB_FILE,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/files/mkdir",
        id: "makeDir",
        tag: "files",
        summary: "Create a directory (and its parents)",
        params: &[ID],
        body: Body::Json("MakeDir"),
        replies: &[reply(200, "The directory.", Body::Json("FileInfo"))],
        errors: SB_FILE_JSON,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/files/rename",
        id: "renameFile",
        tag: "files",
        summary: "Rename or move a path",
        params: &[ID],
        body: Body::Json("Rename"),
        replies: &[reply(200, "The path at its new name.", Body::Json("FileInfo"))],
        errors: SB_FILE_JSON,
        ..OP
    },
    // --- code interpreter --------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/code",
        id: "runCode",
        tag: "code",
        summary: "Run code in a stateful context",
        description: "Without `context_id` the sandbox's default context of `language` is used (created on \
                      first use). An exception in the cell is not an HTTP error: it is `error` in the \
                      `Execution`. With `Accept: application/x-ndjson` one `CodeStreamLine` per event as it \
                      happens, ending with `end`.",
        params: &[ID],
        body: Body::Json("RunCode"),
        replies: &[reply(
            200,
            "What the cell produced (or its event stream).",
            Body::JsonOrNdjson("Execution", "CodeStreamLine"),
        )],
        errors: &[400, 401, 404, 410, 413, 415, 500, 502],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/contexts",
        id: "createContext",
        tag: "code",
        summary: "Create a code context",
        params: &[ID],
        body: Body::Json("CreateContext"),
        replies: &[reply(201, "The new context.", Body::Json("Context"))],
        errors: &[400, 401, 404, 410, 413, 415, 500, 502],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/sandboxes/{id}/contexts",
        id: "listContexts",
        tag: "code",
        summary: "List code contexts",
        params: &[ID],
        replies: &[reply(200, "The contexts.", Body::Json("ContextList"))],
        errors: SB,
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/sandboxes/{id}/contexts/{cid}",
        id: "removeContext",
        tag: "code",
        summary: "Remove a code context",
        params: &[ID, CTX_ID],
        replies: &[NO_CONTENT],
        errors: SB,
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/contexts/{cid}/restart",
        id: "restartContext",
        tag: "code",
        summary: "Restart a code context (its state is cleared)",
        params: &[ID, CTX_ID],
        replies: &[reply(200, "The context.", Body::Json("Context"))],
        errors: SB_AGENT,
        ..OP
    },
    // --- tenants -----------------------------------------------------------------------
    Op {
        method: "get",
        path: "/v1/usage",
        id: "getUsage",
        tag: "tenants",
        summary: "Usage totals per tenant",
        description: "A tenant key sees its own tenant; the admin key sees every tenant, or one with `tenant`.",
        params: &[query("tenant", Ty::Str, "One tenant (admin key only).")],
        replies: &[reply(200, "Totals over running and ended sandboxes.", Body::Json("UsageReport"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/keys",
        id: "createKey",
        tag: "tenants",
        summary: "Create an API key for a tenant (admin key)",
        description: "The plain key is in this answer only; the daemon keeps its SHA-256 digest.",
        body: Body::Json("CreateKey"),
        replies: &[reply(201, "The new key.", Body::Json("CreatedKey"))],
        errors: &[400, 401, 403, 415],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/keys",
        id: "listKeys",
        tag: "tenants",
        summary: "List API keys (admin key)",
        replies: &[reply(200, "Every key, revoked ones included; never the keys themselves.", Body::Json("KeyList"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/keys/{kid}",
        id: "revokeKey",
        tag: "tenants",
        summary: "Revoke an API key (admin key)",
        description: "The key stops authenticating at once.",
        params: &[path("kid", Ty::Str, "Key id (`id` of `ApiKeyInfo`).")],
        replies: &[reply(200, "The revoked key.", Body::Json("ApiKeyInfo"))],
        errors: &[401, 403, 404],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/tenants/{tenant}/quota",
        id: "getQuota",
        tag: "tenants",
        summary: "A tenant's quotas",
        description: "The admin key reads any tenant's; a tenant key its own.",
        params: &[path("tenant", Ty::Str, "Tenant name.")],
        replies: &[reply(200, "The quotas; absent fields are unlimited.", Body::Json("TenantQuota"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "put",
        path: "/v1/tenants/{tenant}/quota",
        id: "setQuota",
        tag: "tenants",
        summary: "Set a tenant's quotas (admin key)",
        description: "Replaces all of the tenant's quotas. Creates beyond a quota fail with 429 `quota_exceeded`.",
        params: &[path("tenant", Ty::Str, "Tenant name.")],
        body: Body::Json("TenantQuota"),
        replies: &[reply(200, "The quotas now in force.", Body::Json("TenantQuota"))],
        errors: &[400, 401, 403, 415],
        ..OP
    },
    // --- templates ---------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/templates",
        id: "buildTemplate",
        tag: "templates",
        summary: "Build a template from a spec",
        description: "Each `RUN`/`COPY`/`WORKDIR` step runs in a build sandbox (`RUN` with network \
                      `allow-all`) and becomes a cached, content-addressed layer; an unchanged prefix of \
                      steps is reused (`no_cache` rebuilds). With `Accept: application/x-ndjson` the \
                      build log streams one `BuildLine` per line (`base`, `step`, `output`, then `done` \
                      or `error`); otherwise the answer is 201 with the template, or 422 \
                      `build_failed` naming the step, its exit code and output tail. A failed build \
                      saves no template. A malformed spec is a 400 naming the line. Admin key only \
                      (templates are shared by every tenant).",
        body: Body::Json("BuildTemplate"),
        replies: &[reply(201, "The template (or the build log).", Body::JsonOrNdjson("TemplateInfo", "BuildLine"))],
        errors: &[400, 401, 403, 413, 415, 422, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/templates",
        id: "listTemplates",
        tag: "templates",
        summary: "List built templates",
        replies: &[reply(200, "The templates.", Body::Json("TemplateList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/templates/{name}",
        id: "getTemplate",
        tag: "templates",
        summary: "Get a template",
        params: &[TPL],
        replies: &[reply(200, "The template.", Body::Json("TemplateInfo"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/templates/{name}",
        id: "deleteTemplate",
        tag: "templates",
        summary: "Delete a template",
        description: "Refused with 409 `conflict` while a live sandbox runs from it. Its layers that no \
                      other template uses are removed.",
        params: &[TPL],
        replies: &[reply(200, "Deleted.", Body::Json("LayersFreed"))],
        errors: &[400, 401, 403, 404, 409, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/templates/gc",
        id: "gcTemplates",
        tag: "templates",
        summary: "Remove unused layers",
        description: "Removes every layer that no template and no live or warm sandbox uses (Debian base \
                      layers are kept).",
        replies: &[reply(200, "Collected.", Body::Json("LayersFreed"))],
        errors: &[401, 403, 500],
        ..OP
    },
    // --- snapshots and forks ------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/snapshots",
        id: "snapshotSandbox",
        tag: "snapshots",
        summary: "Snapshot a sandbox's files",
        description: "Captures the sandbox's writable layer (its files; not its processes or memory) as a new \
                      content-addressed layer, freezing the sandbox for the copy (thawed after, unless it was \
                      paused). Owners, modes, symlinks (as links, never followed), `user.*` xattrs, deletions \
                      and replaced directories are kept; fifos, sockets and device nodes are left out \
                      (`skipped`). Bounded by the sandbox's disk cap and 128 directory levels: beyond either, \
                      422 `snapshot_failed`. `name`: 1–63 of `a-z 0-9 . _ -`, starting with a letter or \
                      digit, unique per tenant (409 `conflict` when taken).",
        params: &[ID],
        body: Body::Json("CreateSnapshot"),
        replies: &[reply(201, "The snapshot.", Body::Json("SnapshotInfo"))],
        errors: &[400, 401, 404, 409, 410, 413, 415, 422, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/fork",
        id: "forkSandbox",
        tag: "snapshots",
        summary: "Fork a sandbox into new ones",
        description: "Snapshots the sandbox's files (anonymously: the children share it, it is removed with the \
                      last of them) and starts `count` (1–20, default 1) sandboxes on it, each with a copy of \
                      the parent's network policy, limits, environment, labels, idle settings and remaining \
                      lifetime, and its lineage (`parent_id`, `ancestors`). Processes, memory and code \
                      contexts are NOT copied (no checkpointing on this host): each child starts with nothing \
                      running; `processes_copied` is always false. Volumes are not mounted in the children. \
                      All or nothing: if one child cannot start, the others are destroyed. A policy with \
                      literal header values (not `${secret:NAME}` references) cannot be copied (400). \
                      The body may be empty.",
        params: &[ID],
        body: Body::Json("ForkSandbox"),
        replies: &[reply(201, "The children.", Body::Json("Forked"))],
        errors: &[400, 401, 404, 409, 410, 422, 429, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/snapshots",
        id: "listSnapshots",
        tag: "snapshots",
        summary: "List the caller's snapshots",
        description: "Named snapshots only (a fork's anonymous snapshot is not listed).",
        replies: &[reply(200, "The snapshots, by name.", Body::Json("SnapshotList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/snapshots/{name}",
        id: "getSnapshot",
        tag: "snapshots",
        summary: "A snapshot: its template, layer, size and how many live sandboxes run on it",
        params: &[SNAPSHOT],
        replies: &[reply(200, "The snapshot.", Body::Json("SnapshotInfo"))],
        errors: &[401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/snapshots/{name}",
        id: "deleteSnapshot",
        tag: "snapshots",
        summary: "Delete a snapshot",
        description: "Never refused for being in use: the name goes at once (and may be taken again), while \
                      sandboxes started from it keep running on its layer, which is collected when the last of \
                      them ends (deferred deletion).",
        params: &[SNAPSHOT],
        replies: &[reply(204, "Deleted.", Body::None)],
        errors: &[401, 404, 500],
        ..OP
    },
    // --- volumes -----------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/volumes",
        id: "createVolume",
        tag: "volumes",
        summary: "Create a volume",
        description: "An ext4 filesystem in a disk image of `size_mb` MiB (16 to 1048576): writes beyond it \
                      fail with ENOSPC in the writing sandbox only. `name`: 1–63 of `a-z 0-9 . _ -`, \
                      starting with a letter or digit; a tenant's names are its own. Mount it with the \
                      create body's `volumes: [{name, path, read_only}]`; many sandboxes may mount one \
                      volume at once, readers and writers alike (one filesystem, shared).",
        body: Body::Json("CreateVolume"),
        replies: &[reply(201, "Created.", Body::Json("VolumeInfo"))],
        errors: &[400, 401, 409, 413, 415, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/volumes",
        id: "listVolumes",
        tag: "volumes",
        summary: "List the caller's volumes",
        replies: &[reply(200, "The volumes, by name.", Body::Json("VolumeList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/volumes/{name}",
        id: "getVolume",
        tag: "volumes",
        summary: "A volume: its size and how many live sandboxes mount it",
        params: &[VOLUME],
        replies: &[reply(200, "The volume.", Body::Json("VolumeInfo"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/volumes/{name}",
        id: "deleteVolume",
        tag: "volumes",
        summary: "Delete a volume and its data",
        description: "Refused with 409 `volume_in_use` while a live sandbox mounts it.",
        params: &[VOLUME],
        replies: &[reply(204, "Deleted.", Body::None)],
        errors: &[400, 401, 404, 409, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/volumes/gc",
        id: "gcVolumes",
        tag: "volumes",
        summary: "Sweep volume leftovers (admin)",
        description: "Unmounts host mounts of volumes no live sandbox uses and removes volumes whose create \
                      was interrupted (the daemon also does this at start).",
        replies: &[reply(200, "What was removed.", Body::Json("VolumesSwept"))],
        errors: &[401, 403, 500],
        ..OP
    },
    // --- the daemon --------------------------------------------------------------------
    Op {
        method: "get",
        path: "/metrics",
        id: "prometheusMetrics",
        tag: "daemon",
        summary: "Prometheus metrics of the daemon",
        description: "Text exposition format 0.0.4 (`text/plain; version=0.0.4`).",
        replies: &[reply(200, "The metrics.", Body::Text)],
        errors: &[401],
        ..OP
    },
    Op {
        method: "get",
        path: "/healthz",
        id: "healthz",
        tag: "daemon",
        summary: "Liveness check (no API key needed)",
        replies: &[reply(200, "`ok`", Body::Text)],
        public: true,
        ..OP
    },
];

/// The error responses under `components/responses`: status, name, description.
pub const ERRORS: &[(u16, &str, &str)] = &[
    (400, "BadRequest", "`invalid_request` (malformed JSON, unknown field, value out of bounds: the message names it), or from the file API `invalid_path`, `not_a_directory`, `is_a_directory`, `spawn_failed`."),
    (401, "Unauthorized", "`unauthorized`: missing or wrong API key."),
    (403, "Forbidden", "`permission_denied`: the sandbox's own permissions refuse the file operation; or `forbidden`: the route needs the admin API key."),
    (404, "NotFound", "`sandbox_not_found`, `template_not_found`, `command_not_found`, `context_not_found`, `snapshot_not_found`, `volume_not_found`, `file_not_found` or `not_found`."),
    (409, "Conflict", "`conflict` (e.g. a command still running, a sandbox that cannot be paused), `file_exists` or `directory_not_empty`."),
    (410, "Gone", "`sandbox_gone`: the sandbox ended; `reason` is `timeout`, `killed`, `oom`, `error` or `daemon_restart`."),
    (413, "PayloadTooLarge", "`invalid_request`: the JSON body is over 16 MiB (use the file API for more)."),
    (415, "UnsupportedMediaType", "`invalid_request`: the body is not `application/json`."),
    (429, "TooManyRequests", "`quota_exceeded`: the tenant's quota (the message names it) would be exceeded."),
    (422, "BuildFailed", "`build_failed`: a template build step failed (the message names the step, its exit code and output tail); `snapshot_failed`: the sandbox's files cannot be captured (over its disk cap, nested too deep, or it ended meanwhile)."),
    (500, "InternalError", "`start_failed` or `internal`; details are in the daemon's log."),
    (501, "NotImplemented", "`hibernate_unavailable`: hibernation is not available on this host (the message says why)."),
    (502, "BadGateway", "`agent_error`: the sandbox's agent misbehaved or vanished mid-request; `port_not_listening`: nothing listens on an exposed port."),
    (503, "Unavailable", "`unavailable`: a host resource the request needs is missing or used up."),
    (507, "InsufficientStorage", "`disk_full`: the sandbox's disk budget is used up."),
];

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn ty(t: Ty) -> Value {
    match t {
        Ty::Str => json!({ "type": "string" }),
        Ty::Bool => json!({ "type": "boolean", "default": false }),
        Ty::Int { min, max, default } => {
            json!({ "type": "integer", "format": "uint32", "minimum": min, "maximum": max, "default": default })
        }
        Ty::U64 => json!({ "type": "integer", "format": "uint64", "minimum": 0 }),
        Ty::Pattern(p) => json!({ "type": "string", "pattern": p }),
        Ty::Ref(name) => schema_ref(name),
    }
}

fn content(b: Body) -> Option<Value> {
    let binary = json!({ "schema": { "type": "string", "format": "binary" } });
    match b {
        Body::None => None,
        Body::Json(s) => Some(json!({ "application/json": { "schema": schema_ref(s) } })),
        Body::JsonOrNdjson(s, line) => Some(json!({
            "application/json": { "schema": schema_ref(s) },
            "application/x-ndjson": { "schema": schema_ref(line) },
        })),
        Body::Bytes => Some(json!({ "application/octet-stream": binary })),
        Body::Text => Some(json!({ "text/plain": { "schema": { "type": "string" } } })),
    }
}

fn operation(op: &Op) -> Value {
    let mut o = Map::new();
    o.insert("operationId".into(), op.id.into());
    o.insert("tags".into(), json!([op.tag]));
    o.insert("summary".into(), op.summary.into());
    if !op.description.is_empty() {
        o.insert("description".into(), op.description.into());
    }
    if !op.params.is_empty() {
        let ps: Vec<Value> = op
            .params
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "in": p.place,
                    "required": p.required,
                    "description": p.description,
                    "schema": ty(p.ty),
                })
            })
            .collect();
        o.insert("parameters".into(), ps.into());
    }
    if let Some(c) = content(op.body) {
        o.insert("requestBody".into(), json!({ "required": !op.body_optional, "content": c }));
    }
    let mut responses = Map::new();
    for r in op.replies {
        let mut v = json!({ "description": r.description });
        if let Some(c) = content(r.body) {
            v["content"] = c;
        }
        responses.insert(r.status.to_string(), v);
    }
    for status in op.errors {
        // Every status an op lists is in ERRORS (checked by a test); a miss would give a
        // dangling `$ref`, which the validity test also catches.
        let name = ERRORS.iter().find(|e| e.0 == *status).map_or("InternalError", |e| e.1);
        responses.insert(status.to_string(), json!({ "$ref": format!("#/components/responses/{name}") }));
    }
    o.insert("responses".into(), responses.into());
    if op.public {
        o.insert("security".into(), json!([]));
    }
    o.into()
}

/// The `paths` object.
pub fn paths() -> Map<String, Value> {
    let mut paths = Map::new();
    for op in OPS {
        let item = paths.entry(op.path).or_insert_with(|| json!({}));
        item[op.method] = operation(op);
    }
    paths
}

/// The `components/responses` object.
pub fn error_responses() -> Map<String, Value> {
    ERRORS
        .iter()
        .map(|(_, name, description)| {
            let v = json!({
                "description": description,
                "content": { "application/json": { "schema": schema_ref("ErrorBody") } },
            });
            (name.to_string(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_status_has_a_response() {
        for op in OPS {
            for s in op.errors {
                assert!(ERRORS.iter().any(|e| e.0 == *s), "{} {}: no response for {s}", op.method, op.path);
            }
        }
    }

    #[test]
    fn operation_ids_are_unique() {
        let mut ids: Vec<&str> = OPS.iter().map(|o| o.id).collect();
        ids.sort_unstable();
        let before = ids.len();
        ids.dedup();
        assert_eq!(before, ids.len(), "duplicate operationId");
    }
}
