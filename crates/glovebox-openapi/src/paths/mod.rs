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

mod admin;
mod sandbox;

/// Every operation: the sandbox-scoped routes, then the daemon's own (tenants, templates,
/// snapshots, volumes, health and metrics).
pub fn ops() -> impl Iterator<Item = &'static Op> {
    sandbox::OPS.iter().chain(admin::OPS)
}

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
    for op in ops() {
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
        for op in ops() {
            for s in op.errors {
                assert!(ERRORS.iter().any(|e| e.0 == *s), "{} {}: no response for {s}", op.method, op.path);
            }
        }
    }

    #[test]
    fn operation_ids_are_unique() {
        let mut ids: Vec<&str> = ops().map(|o| o.id).collect();
        ids.sort_unstable();
        let before = ids.len();
        ids.dedup();
        assert_eq!(before, ids.len(), "duplicate operationId");
    }
}
