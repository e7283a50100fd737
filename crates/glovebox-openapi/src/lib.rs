//! The OpenAPI 3.0 document of Glovebox's HTTP API, committed as `docs/api/openapi.yaml`.
//!
//! Two halves:
//! - `components/schemas` are generated from the wire types in `glovebox_proto::api`
//!   (`schemars`, with the proto crate's `schema` feature), never written by hand. The three
//!   agent types that module re-exports have mirrors in [`foreign`], kept honest by tests.
//! - `paths` is a hand-written table ([`paths::ops`]); the `valid` test checks it covers
//!   every route of the daemon's router, and that every `$ref` resolves.
//!
//! The output is deterministic whatever serde_json's features: map keys are emitted sorted
//! (a few well-known keys first), so a diff of the YAML is a diff of the API. The `drift`
//! test fails when the committed file differs from what this crate generates.

pub mod foreign;
pub mod paths;

use glovebox_proto::api;
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

/// The OpenAPI version the document follows.
pub const OPENAPI_VERSION: &str = "3.0.3";

/// The command that regenerates the committed file.
pub const REGENERATE: &str = "cargo run -p glovebox-openapi > docs/api/openapi.yaml";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("schema {schema} has no property {field} to link to {target}")]
    MissingField { schema: &'static str, field: &'static str, target: &'static str },
    #[error("render yaml: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// How an API field whose type lives in the agent protocol points at its mirror's schema.
enum Link {
    To(&'static str),
    ArrayOf(&'static str),
}

/// Fields of API types whose Rust type is an agent type (their derive uses
/// `schemars(with = "serde_json::Value")`, which says nothing); they are pointed at the
/// mirrors here.
const FOREIGN_FIELDS: &[(&str, &str, Link)] = &[
    ("ExecRequest", "cmd", Link::To("Command")),
    ("CommandSummary", "cmd", Link::To("Command")),
    ("Entries", "entries", Link::ArrayOf("FileInfo")),
];

/// `components/schemas`: every API body type and what it references.
pub fn schemas() -> Result<Map<String, Value>, Error> {
    let mut g = SchemaSettings::openapi3().into_generator();
    macro_rules! register {
        ($($t:ty),* $(,)?) => { $( let _ = g.subschema_for::<$t>(); )* };
    }
    register!(
        api::CreateSandbox,
        api::Sandbox,
        api::SandboxList,
        api::SetTimeout,
        api::UpdateSandbox,
        api::ExposePort,
        api::ExposedPort,
        api::ExposedPortList,
        api::Resources,
        api::Limits,
        api::NetworkPolicy,
        api::ExecRequest,
        api::ExecResult,
        api::ExecStreamLine,
        api::Started,
        api::CommandList,
        api::SignalRequest,
        api::PtyRequest,
        api::PtyResize,
        api::PtyControl,
        api::PtyEvent,
        api::PtyExit,
        api::MakeDir,
        api::Rename,
        api::Entries,
        api::ErrorBody,
        api::RunCode,
        api::Execution,
        api::CodeStreamLine,
        api::CreateContext,
        api::Context,
        api::ContextList,
        api::SandboxMetrics,
        api::EventList,
        api::LifecycleEvent,
        api::EgressLog,
        api::PutSecret,
        api::SecretInfo,
        api::SecretList,
        api::VolumeMount,
        api::CreateVolume,
        api::VolumeInfo,
        api::VolumeList,
        api::VolumesSwept,
        api::CreateSnapshot,
        api::SnapshotInfo,
        api::SnapshotList,
        api::ForkSandbox,
        api::Forked,
        api::Encoding,
        api::CreateKey,
        api::ApiKeyInfo,
        api::CreatedKey,
        api::KeyList,
        api::TenantQuota,
        api::Usage,
        api::SandboxUsage,
        api::UsageReport,
        api::TenantUsage,
        api::BuildTemplate,
        api::TemplateInfo,
        api::TemplateList,
        api::BuildLine,
        api::LayersFreed,
        foreign::Command,
        foreign::FileInfo,
    );
    let mut defs = g.take_definitions(true);
    for (schema, field, link) in FOREIGN_FIELDS {
        let (target, linked) = match link {
            Link::To(t) => (*t, json!({ "allOf": [{ "$ref": format!("#/components/schemas/{t}") }] })),
            Link::ArrayOf(t) => {
                (*t, json!({ "type": "array", "items": { "$ref": format!("#/components/schemas/{t}") } }))
            }
        };
        let prop = defs
            .get_mut(*schema)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(*field))
            .and_then(Value::as_object_mut)
            .ok_or(Error::MissingField { schema, field, target })?;
        // Keep the field's own doc comment (`description`); replace the empty schema.
        prop.retain(|k, _| k == "description");
        if let Value::Object(l) = linked {
            prop.extend(l);
        }
    }
    Ok(defs)
}

/// The whole document.
pub fn spec() -> Result<Value, Error> {
    Ok(json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Glovebox API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The native HTTP API of `glovebox serve`: disposable, isolated sandboxes for \
                            untrusted code. Generated by `glovebox-openapi` from the Rust wire types; \
                            the prose reference is docs/api.md. Every `/v1` route needs the API key. \
                            Request bodies reject unknown fields.",
            "license": { "name": "Apache-2.0" },
        },
        "servers": [{ "url": "http://127.0.0.1:7171", "description": "The default listen address" }],
        "security": [{ "bearerAuth": [] }, { "apiKeyHeader": [] }],
        "tags": [
            { "name": "sandboxes", "description": "Create, inspect, extend and destroy sandboxes." },
            { "name": "commands", "description": "Run commands, in the foreground or the background." },
            { "name": "terminals", "description": "Commands on a pseudo-terminal, attached over a WebSocket." },
            { "name": "files", "description": "The sandbox's filesystem; paths are resolved inside the sandbox." },
            { "name": "code", "description": "The code interpreter: stateful language contexts." },
            { "name": "network", "description": "Network policy and egress audit." },
            { "name": "tenants", "description": "API keys, tenants, quotas and metered usage." },
            { "name": "secrets", "description": "Host-side secrets for brokered headers (values are write-only)." },
            { "name": "events", "description": "Lifecycle events: created, adopted after a restart, ended and why." },
            { "name": "templates", "description": "Build root filesystems from a spec; sandboxes start from them." },
            { "name": "snapshots", "description": "Snapshots of sandboxes' files as read-only layers, sandboxes started from them, and forks (files only: processes are not copied)." },
            { "name": "volumes", "description": "Disk-backed volumes with a size cap, mounted into sandboxes at create; they outlive sandboxes and daemon restarts." },
            { "name": "daemon", "description": "Health and Prometheus metrics." },
        ],
        "paths": paths::paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": { "type": "http", "scheme": "bearer", "description": "`Authorization: Bearer <key>`" },
                "apiKeyHeader": { "type": "apiKey", "in": "header", "name": "X-API-Key" },
            },
            "responses": paths::error_responses(),
            "schemas": schemas()?,
        },
    }))
}

/// Keys emitted first, in this order, in any map that has them; the rest follow sorted.
const FIRST_KEYS: &[&str] = &[
    "openapi",
    "info",
    "servers",
    "name",
    "operationId",
    "summary",
    "title",
    "description",
    "security",
    "tags",
    "paths",
    "components",
    "type",
    "in",
];

fn ordered(v: &Value) -> serde_norway::Value {
    use serde_norway::Value as Y;
    match v {
        Value::Null => Y::Null,
        Value::Bool(b) => Y::Bool(*b),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Y::Number(u.into())
            } else if let Some(i) = n.as_i64() {
                Y::Number(i.into())
            } else {
                // serde_json numbers are u64, i64 or f64: this is the f64 case.
                Y::Number(n.as_f64().unwrap_or(f64::NAN).into())
            }
        }
        Value::String(s) => Y::String(s.clone()),
        Value::Array(a) => Y::Sequence(a.iter().map(ordered).collect()),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            let rank = |k: &str| FIRST_KEYS.iter().position(|f| *f == k).unwrap_or(FIRST_KEYS.len());
            keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
            let mut out = serde_norway::Mapping::new();
            for k in keys {
                out.insert(Y::String(k.clone()), ordered(&m[k]));
            }
            Y::Mapping(out)
        }
    }
}

/// `doc` as YAML, keys in a stable order.
pub fn to_yaml(doc: &Value) -> Result<String, Error> {
    let body = serde_norway::to_string(&ordered(doc))?;
    Ok(format!("# Generated from the Rust API types by crates/glovebox-openapi; do not edit.\n# Regenerate: {REGENERATE}\n{body}"))
}

/// The committed file's contents.
pub fn render() -> Result<String, Error> {
    to_yaml(&spec()?)
}
