//! The Modal front-end: the gRPC protocol of the `modal` Python client (1.6.4, the version
//! pinned in `proto/modal`), served on the daemon's own port over HTTP/2 (`server` hands it
//! every connection that opens with the HTTP/2 preface), mapped onto the manager, the
//! template builder and `ops` — no second implementation of anything. docs/modal.md has the
//! mapping and what is refused.
//!
//! Two services: `ModalClient` (apps, images, sandboxes; authenticated by the client's token
//! pair on every call, the secret being a Glovebox API key) and `TaskCommandRouter` (exec; the
//! client reaches it at the URL `SandboxGetCommandRouterAccess` gives, this same daemon, with
//! a short-lived token naming one sandbox).
//!
//! Invariants: every call is authenticated before it reaches a handler; a caller only ever
//! addresses its own tenant's sandboxes, images' templates being shared as all templates are;
//! a method not served is answered UNIMPLEMENTED with the feature it belongs to, and a
//! feature refused inside a served method FAILED_PRECONDITION naming it — never a hang, never
//! a status the client retries (UNKNOWN, INTERNAL, UNAVAILABLE) for something that will not
//! change.

mod apps;
mod control;
mod exec;
mod images;
pub mod pb;
mod router;
mod sandboxes;
mod served;
mod tokens;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tonic::Status;

use crate::error::Error;
use crate::http::AppState;
use crate::manager::Sb;
use crate::tenants::Caller;

pub use served::SERVED;

const CONTROL: &str = "modal.client.ModalClient";
const ROUTER: &str = "modal.task_command_router.TaskCommandRouter";

/// The Modal front-end's state: the app's, plus what Modal has and Glovebox does not keep
/// (apps, image build logs, exec ids, ephemeral secrets), all in memory.
#[derive(Clone)]
pub struct Modal {
    inner: Arc<Inner>,
}

struct Inner {
    app: AppState,
    tokens: tokens::Signer,
    apps: apps::Apps,
    images: images::Images,
    execs: exec::Execs,
    /// Methods already logged as unimplemented (each is logged once).
    refused: Mutex<HashSet<String>>,
}

impl Modal {
    pub fn new(app: AppState) -> Modal {
        Modal {
            inner: Arc::new(Inner {
                app,
                tokens: tokens::Signer::new(),
                apps: apps::Apps::default(),
                images: images::Images::default(),
                execs: exec::Execs::default(),
                refused: Mutex::default(),
            }),
        }
    }

    fn manager(&self) -> &Arc<crate::manager::Manager> {
        &self.inner.app.manager
    }

    /// Answers one gRPC request (HTTP/2): authenticates it, then hands it to the generated
    /// service, or answers UNIMPLEMENTED for a method not served.
    pub async fn route(
        &self,
        req: axum::http::Request<hyper::body::Incoming>,
    ) -> axum::http::Response<tonic::body::Body> {
        use tower::ServiceExt;
        let path = req.uri().path().to_string();
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or(("", ""));
        if !is_served(service, method) {
            return self.refuse(service, method).into_http();
        }
        let mut req = req;
        let authority =
            req.uri().authority().map(|a| a.to_string()).or_else(|| {
                req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string)
            });
        if let Some(a) = authority {
            req.extensions_mut().insert(sandboxes::Authority(a));
        }
        let res = if service == CONTROL {
            match self.caller(req.headers()) {
                Ok(c) => {
                    req.extensions_mut().insert(c);
                    pb::api::modal_client_server::ModalClientServer::new(control::Control(self.clone()))
                        .max_decoding_message_size(MAX_MESSAGE)
                        .oneshot(req)
                        .await
                }
                Err(s) => return s.into_http(),
            }
        } else {
            match self.inner.tokens.verify_router(req.headers()) {
                Ok(g) => {
                    req.extensions_mut().insert(g);
                    pb::router::task_command_router_server::TaskCommandRouterServer::new(router::Router(self.clone()))
                        .max_decoding_message_size(MAX_MESSAGE)
                        .oneshot(req)
                        .await
                }
                Err(s) => return s.into_http(),
            }
        };
        match res {
            Ok(r) => r,
            // The generated services never fail as tower services.
            Err(e) => Status::internal(format!("{e}")).into_http(),
        }
    }

    /// The caller of a `ModalClient` request: its token secret is a Glovebox API key (the
    /// daemon's or a tenant's); the token id is not checked (any `ak-…` id will do).
    fn caller(&self, h: &axum::http::HeaderMap) -> Result<Caller, Status> {
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
        let Some(secret) = get("x-modal-token-secret") else {
            return Err(Status::unauthenticated(
                "missing token: set MODAL_TOKEN_ID (any ak-… id) and MODAL_TOKEN_SECRET (a Glovebox API key)",
            ));
        };
        self.manager().tenants.authenticate(secret).ok_or_else(|| {
            Status::unauthenticated("invalid token: MODAL_TOKEN_SECRET is not an API key of this Glovebox daemon")
        })
    }

    /// UNIMPLEMENTED for a method not served, naming the feature it belongs to (logged once
    /// per method).
    fn refuse(&self, service: &str, method: &str) -> Status {
        let what = if service == CONTROL || service == ROUTER {
            feature_of(method)
        } else {
            format!("the gRPC service {service:?}")
        };
        let first = self.inner.refused.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{service}/{method}"));
        if first {
            tracing::info!("modal: refused {service}/{method} ({what})");
        }
        let short = service.rsplit('.').next().unwrap_or(service);
        Status::unimplemented(format!(
            "{what} is not supported by Glovebox ({short}/{method}); see docs/modal.md for what is"
        ))
    }

    /// The live sandbox `id` if `caller` may address it (someone else's is answered as one
    /// that does not exist). A paused sandbox is resumed.
    fn sandbox(&self, caller: &Caller, id: &str) -> Result<Arc<Sb>, Status> {
        let id = sandboxes::glovebox_id(id);
        let m = self.manager();
        crate::http::authorize(m, caller, id).map_err(status)?;
        let sb = m.get(id).map_err(status)?;
        m.wake_for_request(&sb).map_err(status)?;
        Ok(sb)
    }
}

/// Largest request message accepted (stdin chunks, context files).
const MAX_MESSAGE: usize = 64 << 20;

fn is_served(service: &str, method: &str) -> bool {
    SERVED.iter().any(|(s, ms)| *s == service && ms.contains(&method))
}

/// The Modal feature a method belongs to, for the message that refuses it.
fn feature_of(method: &str) -> String {
    const FEATURES: &[(&str, &str)] = &[
        ("SandboxSnapshot", "sandbox snapshots"),
        ("SandboxRestore", "restoring sandbox snapshots"),
        ("SandboxGetTunnels", "tunnels (encrypted_ports, unencrypted_ports)"),
        ("SandboxCreateConnectToken", "sandbox connect tokens"),
        ("SandboxGetFromName", "named sandboxes (Sandbox.from_name)"),
        ("SandboxSetName", "naming a sandbox"),
        ("SandboxGetLogs", "sandbox logs"),
        ("SandboxGetExitSnapshot", "exit snapshots"),
        ("SandboxGetStats", "sandbox stats"),
        ("SandboxContainer", "sandbox sidecars"),
        ("SandboxStdinWrite", "writing a sandbox's entrypoint stdin"),
        ("SandboxGetResourceUsage", "sandbox resource usage"),
        ("SandboxGetTimeRangeStats", "sandbox stats"),
        ("TaskMountDirectory", "mounting images into a sandbox"),
        ("TaskUnmountDirectory", "mounting images into a sandbox"),
        ("TaskSnapshot", "sandbox snapshots"),
        ("TaskSetNetworkAccess", "changing a running sandbox's network access"),
        ("TaskSetOutboundPolicy", "outbound policies"),
        ("TaskReloadVolumes", "Modal Volumes"),
        ("TaskContainer", "sandbox sidecars"),
        ("TaskExecStdinWriteStream", "streaming stdin uploads"),
        ("FunctionCall", "Modal Functions"),
        ("Function", "Modal Functions"),
        ("Class", "Modal classes (modal.Cls)"),
        ("SharedVolume", "network file systems"),
        ("Volume", "Modal Volumes"),
        ("Mount", "local files in images (add_local_file, add_local_dir, add_local_python_source)"),
        ("Blob", "blob uploads (large payloads and local files)"),
        ("Dict", "modal.Dict"),
        ("Queue", "modal.Queue"),
        ("Secret", "named Secrets (Secret.from_name; pass Secret.from_dict or env instead)"),
        ("Proxy", "Modal Proxies"),
        ("Cluster", "clusters"),
        ("Image", "this image operation"),
        ("App", "this app operation (deployments)"),
        ("Environment", "environments"),
        ("Workspace", "workspaces"),
        ("Token", "token management"),
        ("Domain", "custom domains"),
        ("Schedule", "schedules"),
        ("Webhook", "web endpoints"),
        ("Notebook", "notebooks"),
        ("Task", "this task operation"),
        ("Container", "containers (Modal Functions)"),
    ];
    FEATURES
        .iter()
        .find(|(p, _)| method.starts_with(p))
        .map_or_else(|| format!("the Modal call {method}"), |(_, f)| f.to_string())
}

/// The daemon's error as the gRPC status the client turns into its own exception (NOT_FOUND
/// → NotFoundError, FAILED_PRECONDITION → …); never a status the client retries for
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
            C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => Status::invalid_argument(msg),
            C::Protocol | C::Io => {
                tracing::warn!("modal: {e}");
                Status::internal("internal error (see the daemon log)")
            }
        },
        Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
            tracing::warn!("modal: {e}");
            Status::internal("internal error (see the daemon log)")
        }
    }
}

/// A feature Modal has and Glovebox refuses inside a call it serves.
fn unsupported(what: &str) -> Status {
    Status::failed_precondition(format!("{what} is not supported by Glovebox (see docs/modal.md)"))
}

/// The caller a `ModalClient` handler runs for (set by [`Modal::route`]).
fn caller_of<T>(req: &tonic::Request<T>) -> Result<Caller, Status> {
    req.extensions().get::<Caller>().cloned().ok_or_else(|| Status::unauthenticated("no caller"))
}

/// Seconds since the Unix epoch.
fn now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn tag_map(tags: &[pb::api::SandboxTag]) -> BTreeMap<String, String> {
    tags.iter().map(|t| (t.tag_name.clone(), t.tag_value.clone())).collect()
}

/// A result of the given status (and exit code, message).
fn result(status: pb::api::generic_result::GenericStatus, exitcode: i32, exception: &str) -> pb::api::GenericResult {
    pb::api::GenericResult { status: status as i32, exitcode, exception: exception.to_string(), ..Default::default() }
}

/// A response stream (server streaming).
type Stream<T> = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Keeps per-key state of at most `max` entries, forgetting the oldest half when full.
fn bounded_insert<K: std::hash::Hash + Eq + Clone, V>(map: &mut HashMap<K, (u64, V)>, key: K, v: V, max: usize) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if map.len() >= max && !map.contains_key(&key) {
        let mut seqs: Vec<u64> = map.values().map(|(s, _)| *s).collect();
        seqs.sort_unstable();
        let cut = seqs[seqs.len() / 2];
        map.retain(|_, (s, _)| *s > cut);
    }
    map.insert(key, (SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed), v));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unserved_methods_name_their_feature() {
        assert!(is_served(CONTROL, "SandboxCreateV2"));
        assert!(is_served(ROUTER, "TaskExecStart"));
        assert!(!is_served(CONTROL, "VolumeGetOrCreate"));
        assert!(!is_served("grpc.health.v1.Health", "Check"));
        assert_eq!(feature_of("VolumeGetOrCreate"), "Modal Volumes");
        assert_eq!(feature_of("FunctionCreate"), "Modal Functions");
        assert_eq!(feature_of("SandboxSnapshotFs"), "sandbox snapshots");
        assert_eq!(feature_of("Frobnicate"), "the Modal call Frobnicate");
    }

    #[test]
    fn errors_are_never_retried_statuses_when_final() {
        use tonic::Code;
        assert_eq!(status(Error::SandboxNotFound("x".into())).code(), Code::NotFound);
        let gone = Error::Gone { id: "x".into(), reason: glovebox_proto::api::EndReason::Timeout };
        assert_eq!(status(gone).code(), Code::NotFound);
        assert_eq!(status(Error::Invalid("bad".into())).code(), Code::InvalidArgument);
        assert_eq!(status(Error::Conflict("busy".into())).code(), Code::FailedPrecondition);
        assert_eq!(unsupported("volumes").code(), Code::FailedPrecondition);
    }

    #[test]
    fn bounded_maps_forget_the_oldest() {
        let mut m = HashMap::new();
        for i in 0..10 {
            bounded_insert(&mut m, i, i, 4);
        }
        assert!(m.len() <= 4);
        assert!(m.contains_key(&9));
        assert!(!m.contains_key(&0));
    }
}
