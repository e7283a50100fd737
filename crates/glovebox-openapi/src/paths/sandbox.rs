//! The routes under `/v1/sandboxes`: a sandbox's life, secrets, commands, terminals, files
//! and code.

use super::*;

pub(super) const OPS: &[Op] = &[
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
];
