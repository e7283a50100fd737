//! The agent-sandbox front-end: every sandbox reachable through **sandboxd**, the in-sandbox
//! runtime protocol of Kubernetes agent-sandbox (KEP-539.2), and through the older
//! "python-runtime" HTTP API that the `k8s-agent-sandbox` SDK (1.0.8, pinned in
//! `proto/sandboxd`) speaks in its direct-URL mode — both served by the daemon on its own port
//! and mapped onto the manager and `ops` (no second implementation of anything).
//! docs/sandboxd.md has the mapping and what is refused.
//!
//! Three surfaces, one routing rule — the one agent-sandbox's router uses: a request names its
//! sandbox in `X-Sandbox-ID` (gRPC: the `x-sandbox-id` metadata):
//! - gRPC `process.v1.ProcessService` (Start with optional PTY, Execute, WriteStdin,
//!   SendSignal, ResizeTTY) over HTTP/2 (`server` hands it every connection that opens with
//!   the HTTP/2 preface, and `route` takes the calls whose path is this service's);
//! - sandboxd's REST files and probes (`/v1/files/{path}`, `/v1/health`, `/v1/metadata`);
//! - the python-runtime API of the SDK's direct-URL mode (`/execute`, `/upload`,
//!   `/download/…`, `/list/…`, `/exists/…`).
//!
//! A fourth way in, for agent-sandbox's router, which never forwards the caller's key (and
//! in its Python version drops `X-Sandbox-ID` too): the opt-in router-facing listener
//! (`by_host`), which picks the sandbox by the `Host` name the router dialed and serves only
//! the HTTP routes above.
//!
//! Invariants: on the daemon's listener every request is authenticated with a Glovebox API
//! key (`Authorization: Bearer …` or `X-API-Key`) before anything else; on the router-facing
//! one none is, and nothing but these routes for the admin tenant's claim-named sandboxes is
//! reachable there (`by_host` says why); a caller only ever reaches its own tenant's
//! sandboxes (another's answers as one that does not exist); a process started by `Start` is
//! addressed only through this front-end and only while its `Start` stream is open (closing
//! the stream kills it, as sandboxd does); a feature refused
//! is refused by name (gRPC UNIMPLEMENTED or FAILED_PRECONDITION, HTTP 4xx), never a hang.

mod by_host;
mod paths;
pub mod pb;
mod process;
mod rest;
#[cfg(test)]
mod router_tests;
mod runtime;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use tonic::Status;

use crate::error::Error;
use crate::http::AppState;
use crate::manager::Sb;
use crate::tenants::Caller;

pub use by_host::{router_app, META_NAME, META_NAMESPACE};
pub use rest::intercept;

/// The header (gRPC: metadata key) naming the sandbox a request is for.
pub const SANDBOX_ID: &str = "x-sandbox-id";
/// The gRPC service served.
pub const SERVICE: &str = "process.v1.ProcessService";

/// The sandboxd front-end's state: the app's, and the processes `Start` streams have open.
#[derive(Clone)]
pub struct Sandboxd {
    inner: Arc<Inner>,
}

struct Inner {
    app: AppState,
    /// (sandbox id, agent command id) of every process a `Start` stream has open → whether
    /// it runs on a terminal.
    open: Mutex<HashMap<(String, u64), bool>>,
}

impl Sandboxd {
    pub fn new(app: AppState) -> Sandboxd {
        Sandboxd { inner: Arc::new(Inner { app, open: Mutex::default() }) }
    }

    fn manager(&self) -> &Arc<crate::manager::Manager> {
        &self.inner.app.manager
    }

    /// Whether a gRPC call's path is for this front-end (the others are the Modal one's).
    pub fn serves(path: &str) -> bool {
        path.trim_start_matches('/').split_once('/').is_some_and(|(s, _)| s == SERVICE)
    }

    /// Answers one gRPC call (HTTP/2): authenticates it, finds its sandbox, and hands it to
    /// the generated service (which answers UNIMPLEMENTED for a method the protocol lacks).
    pub async fn route(
        &self,
        req: axum::http::Request<hyper::body::Incoming>,
    ) -> axum::http::Response<tonic::body::Body> {
        use tower::ServiceExt;
        let mut req = req;
        let target = match target(self.manager(), req.headers()) {
            Ok(t) => t,
            Err(e) => return grpc_status(e).into_http(),
        };
        req.extensions_mut().insert(target);
        let svc = pb::process_service_server::ProcessServiceServer::new(process::Process(self.clone()))
            .max_decoding_message_size(MAX_MESSAGE);
        match svc.oneshot(req).await {
            Ok(r) => r,
            // The generated service never fails as a tower service.
            Err(e) => Status::internal(format!("{e}")).into_http(),
        }
    }
}

/// Largest gRPC request accepted (a stdin write).
const MAX_MESSAGE: usize = 16 << 20;

/// The sandbox a request addresses, for the caller who may address it.
#[derive(Clone)]
pub struct Target {
    pub sb: Arc<Sb>,
    pub caller: Caller,
}

/// Why a request reaches no sandbox.
#[derive(Debug)]
pub enum Refused {
    /// No key, or a key this daemon does not know.
    Unauthenticated(&'static str),
    /// No `X-Sandbox-ID`.
    NoSandbox,
    /// The sandbox does not exist (for this caller), has ended, or cannot be woken.
    Sandbox(Error),
}

/// Authenticates a request's key and finds the sandbox its `X-Sandbox-ID` names (a paused
/// sandbox is resumed, as any request that reaches its processes resumes it).
pub fn target(m: &crate::manager::Manager, h: &HeaderMap) -> Result<Target, Refused> {
    let key = crate::http::presented_key(h)
        .ok_or(Refused::Unauthenticated("missing API key (send `Authorization: Bearer <Glovebox API key>`)"))?;
    let caller = m
        .tenants
        .authenticate(key)
        .ok_or(Refused::Unauthenticated("invalid API key: not a key of this Glovebox daemon"))?;
    let id = h
        .get(SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or(Refused::NoSandbox)?;
    crate::http::authorize(m, &caller, id).map_err(Refused::Sandbox)?;
    let sb = m.get(id).map_err(Refused::Sandbox)?;
    m.wake_for_request(&sb).map_err(Refused::Sandbox)?;
    Ok(Target { sb, caller })
}

fn grpc_status(r: Refused) -> Status {
    match r {
        Refused::Unauthenticated(m) => Status::unauthenticated(m),
        Refused::NoSandbox => {
            Status::invalid_argument("x-sandbox-id metadata is required: it names the Glovebox sandbox to reach")
        }
        Refused::Sandbox(e) => status(e),
    }
}

/// The daemon's error as a gRPC status; never one a client retries (UNAVAILABLE) for
/// something that will not change.
pub(crate) fn status(e: Error) -> Status {
    use glovebox_proto::agent::ErrorCode as C;
    let msg = e.to_string();
    match &e {
        Error::Invalid(_) => Status::invalid_argument(msg),
        Error::SandboxNotFound(_) | Error::NotFound { .. } | Error::TemplateNotBuilt { .. } | Error::Gone { .. } => {
            Status::not_found(msg)
        }
        Error::Conflict(_)
        | Error::Paused(_)
        | Error::PausedMeanwhile(_)
        | Error::VolumeInUse(_)
        | Error::HibernateUnavailable(_) => Status::failed_precondition(msg),
        Error::Quota(_) => Status::resource_exhausted(msg),
        Error::Unavailable(_) => Status::unavailable(msg),
        Error::SnapshotFailed(_) => Status::aborted(msg),
        Error::File { code, .. } => match code {
            C::NotFound => Status::not_found(msg),
            C::AlreadyExists | C::NotEmpty => Status::already_exists(msg),
            C::PermissionDenied => Status::permission_denied(msg),
            C::NoSpace => Status::resource_exhausted(msg),
            C::NotADirectory | C::IsADirectory | C::InvalidArgument => Status::invalid_argument(msg),
            // The command could not be started (no such program, not executable): sandboxd
            // answers NOT_FOUND for a missing binary.
            C::SpawnFailed => Status::not_found(msg),
            C::Protocol | C::Io => {
                tracing::warn!("sandboxd: {e}");
                Status::internal("internal error (see the daemon log)")
            }
        },
        Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
            tracing::warn!("sandboxd: {e}");
            Status::internal("internal error (see the daemon log)")
        }
    }
}

/// The environment variables `/v1/metadata` may show: sandboxd's rule (names with the
/// `SANDBOX_` prefix, none that looks like a credential).
fn metadata_env(env: &std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, String> {
    const SENSITIVE: [&str; 10] =
        ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CRED", "KEY", "AUTH", "BEARER", "PRIVATE", "CERT"];
    env.iter()
        .filter(|(k, _)| k.starts_with("SANDBOX_"))
        .filter(|(k, _)| !SENSITIVE.iter().any(|s| k.to_ascii_uppercase().contains(s)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_paths_are_told_apart() {
        assert!(Sandboxd::serves("/process.v1.ProcessService/Start"));
        assert!(Sandboxd::serves("/process.v1.ProcessService/Frobnicate"));
        assert!(!Sandboxd::serves("/modal.client.ModalClient/ClientHello"));
        assert!(!Sandboxd::serves("/process.v1.ProcessServiceX/Start"));
        assert!(!Sandboxd::serves("/"));
    }

    #[test]
    fn metadata_shows_no_credentials() {
        let env: std::collections::BTreeMap<String, String> = [
            ("SANDBOX_REGION", "eu"),
            ("SANDBOX_API_TOKEN", "t"),
            ("SANDBOX_db_password", "p"),
            ("HOME", "/root"),
            ("SANDBOX_KEYRING", "k"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let shown = metadata_env(&env);
        assert_eq!(shown.keys().collect::<Vec<_>>(), ["SANDBOX_REGION"]);
    }

    #[test]
    fn errors_are_final_statuses() {
        use tonic::Code;
        assert_eq!(status(Error::SandboxNotFound("x".into())).code(), Code::NotFound);
        let gone = Error::Gone { id: "x".into(), reason: glovebox_proto::api::EndReason::Timeout };
        assert_eq!(status(gone).code(), Code::NotFound);
        assert_eq!(status(Error::Invalid("bad".into())).code(), Code::InvalidArgument);
        assert_eq!(grpc_status(Refused::NoSandbox).code(), Code::InvalidArgument);
        assert_eq!(grpc_status(Refused::Unauthenticated("no")).code(), Code::Unauthenticated);
    }
}
