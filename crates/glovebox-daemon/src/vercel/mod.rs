//! The Vercel Sandbox API: what the official `@vercel/sandbox` SDK (3.x) speaks, mapped onto
//! the manager and `ops` (no second implementation of anything).
//!
//! Everything lives under `/vercel`: the SDK's fixed base (`https://vercel.com/api`) is
//! rewritten to `<daemon>/vercel` by the `fetch` the user hands to `Sandbox.create/get/list`
//! (docs/vercel.md). A Vercel sandbox and its one session are the same Glovebox sandbox: its
//! id is both the sandbox's `name` and the session's `id`.
//!
//! Invariants: every handler checks the bearer key and that its caller may address the
//! sandbox first; every failure answers Vercel's error shape, `{"error": {"code",
//! "message"}}`, with a 4xx for anything the request got wrong or asked for that Glovebox
//! does not do (never silently ignored), so the SDK raises its own `APIError`.

mod commands;
mod files;
mod ports;
#[cfg(test)]
mod router_tests;
mod sandboxes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;

use crate::error::Error;
use crate::http::AppState;
use crate::manager::Sb;
use crate::tenants::Caller;

/// The working directory of every sandbox (created at create, the commands' default cwd).
pub const CWD: &str = "/vercel/sandbox";

/// Most commands whose metadata is kept at once.
const MAX_REMEMBERED: usize = 4096;

/// What the front-end remembers of a command it started (the agent knows only its argv).
#[derive(Clone)]
struct CmdMeta {
    name: String,
    args: Vec<String>,
    cwd: String,
    started_at: u64,
}

/// State of the Vercel surface: the app's, plus the commands' metadata.
#[derive(Clone)]
pub struct Vercel {
    pub app: AppState,
    cmds: Arc<Mutex<HashMap<(String, u64), CmdMeta>>>,
}

impl Vercel {
    fn remember(&self, sb: &str, id: u64, meta: CmdMeta) {
        let mut c = self.cmds.lock().unwrap_or_else(|p| p.into_inner());
        if c.len() >= MAX_REMEMBERED {
            // Forget the commands of sandboxes that ended, then, if live ones started that
            // many, the older half (their metadata is then what the agent still knows).
            c.retain(|(s, _), _| self.app.manager.get(s).is_ok());
            if c.len() >= MAX_REMEMBERED / 2 {
                let mut starts: Vec<u64> = c.values().map(|m| m.started_at).collect();
                starts.sort_unstable();
                let cut = starts[starts.len() / 2];
                c.retain(|_, m| m.started_at > cut);
            }
        }
        c.insert((sb.to_string(), id), meta);
    }

    fn meta(&self, sb: &str, id: u64) -> Option<CmdMeta> {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).get(&(sb.to_string(), id)).cloned()
    }

    fn forget(&self, sb: &str) {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).retain(|(s, _), _| s != sb);
    }
}

pub fn router(app: AppState) -> Router {
    let st = Vercel { app, cmds: Arc::new(Mutex::new(HashMap::new())) };
    let s = "/vercel/v2/sandboxes/sessions/{id}";
    let api = Router::new()
        .route("/vercel/v2/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/vercel/v3/sandboxes", post(sandboxes::create))
        .route("/vercel/v2/sandboxes/sessions", get(sandboxes::list_sessions))
        // Listed before `{name}` would take them.
        .route("/vercel/v2/sandboxes/snapshots", any(unsupported))
        .route("/vercel/v2/sandboxes/drives", any(unsupported))
        .route(
            "/vercel/v2/sandboxes/{name}",
            get(sandboxes::get_one).patch(sandboxes::update).delete(sandboxes::delete),
        )
        .route(s, get(sandboxes::get_session))
        .route(&format!("{s}/stop"), post(sandboxes::stop))
        .route(&format!("{s}/network-policy"), post(sandboxes::network_policy))
        .route(&format!("{s}/extend-timeout"), post(sandboxes::extend_timeout))
        .route(&format!("{s}/cmd"), post(commands::run))
        .route(&format!("{s}/cmd/{{cid}}"), get(commands::get_one))
        .route(&format!("{s}/cmd/{{cid}}/logs"), get(commands::logs))
        .route(&format!("{s}/cmd/{{cid}}/kill"), post(commands::kill))
        .route(&format!("{s}/fs/mkdir"), post(files::mkdir))
        .route(&format!("{s}/fs/read"), post(files::read))
        .layer(DefaultBodyLimit::max(crate::http::MAX_JSON_BODY));
    let upload = Router::new()
        .route(&format!("{s}/fs/write"), post(files::write))
        .layer(DefaultBodyLimit::max(files::MAX_UPLOAD));
    Router::new()
        .merge(api)
        .merge(upload)
        // Snapshots, drives, forks, interactive shells and anything else: a clear 4xx.
        .route("/vercel/{*rest}", any(unsupported))
        .with_state(st)
}

/// An error in the shape of Vercel's API answers: `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// A Vercel feature Glovebox does not have: 400 (a 5xx would make the SDK retry).
    fn unsupported(what: &str) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "not_supported", format!("{what} is not supported by Glovebox"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        use glovebox_proto::agent::ErrorCode as C;
        let (status, code) = match &e {
            Error::Invalid(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Error::SandboxNotFound(_) => (StatusCode::NOT_FOUND, "sandbox_not_found"),
            // The SDK reads 410 as "the session stopped".
            Error::Gone { .. } => (StatusCode::GONE, "sandbox_stopped"),
            Error::NotFound { .. } | Error::TemplateNotBuilt { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Error::Conflict(_) | Error::Paused(_) | Error::PausedMeanwhile(_) | Error::VolumeInUse(_) => {
                (StatusCode::CONFLICT, "conflict")
            }
            Error::Quota(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::HibernateUnavailable(_) => (StatusCode::BAD_REQUEST, "not_supported"),
            Error::SnapshotFailed(_) => (StatusCode::UNPROCESSABLE_ENTITY, "snapshot_failed"),
            Error::File { code, .. } => match code {
                C::NotFound => (StatusCode::NOT_FOUND, "file_not_found"),
                C::AlreadyExists | C::NotEmpty => (StatusCode::CONFLICT, "conflict"),
                C::PermissionDenied => (StatusCode::FORBIDDEN, "forbidden"),
                C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => {
                    (StatusCode::BAD_REQUEST, "bad_request")
                }
                C::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
                C::Protocol | C::Io => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
            },
            Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
                tracing::warn!("vercel: {e}");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "internal error (see the daemon log)",
                );
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// Resolves the bearer key (a tenant's, or the daemon's admin key) to its caller.
fn check_key(st: &Vercel, h: &HeaderMap) -> Result<Caller, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::FORBIDDEN, "forbidden", m);
    match crate::http::presented_key(h) {
        Some(k) => st.app.manager.tenants.authenticate(k.trim()).ok_or_else(|| unauthorized("invalid token")),
        None => Err(unauthorized("missing token (send Authorization: Bearer <key>)")),
    }
}

/// The live sandbox `id`, after checking the key and that its caller may address it
/// (someone else's sandbox is answered like one that never existed). A paused sandbox is
/// resumed.
fn sandbox(st: &Vercel, h: &HeaderMap, id: &str) -> Result<Arc<Sb>, ApiError> {
    let caller = check_key(st, h)?;
    crate::http::authorize(&st.app.manager, &caller, id)?;
    let sb = st.app.manager.get(id)?;
    st.app.manager.wake_for_request(&sb)?;
    Ok(sb)
}

/// A JSON body (an empty one is the type's default).
fn body<T: for<'de> serde::Deserialize<'de> + Default>(b: &[u8]) -> Result<T, ApiError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| ApiError::bad(format!("invalid body: {e}")))
}

/// A user path as Vercel means it: relative to `cwd` (default the sandbox's working
/// directory). `..` is refused rather than resolved, so a path names what it says; the agent
/// resolves the result inside the sandbox.
fn sandbox_path(p: &str, cwd: Option<&str>) -> Result<String, ApiError> {
    if p.is_empty() {
        return Err(ApiError::bad("path must not be empty"));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(ApiError::bad(format!("path {p:?} must not contain '..'")));
    }
    if p.starts_with('/') {
        return Ok(p.to_string());
    }
    let base = cwd.unwrap_or(CWD);
    if !base.starts_with('/') || base.split('/').any(|c| c == "..") {
        return Err(ApiError::bad(format!("cwd {base:?} must be absolute, without '..'")));
    }
    Ok(format!("{}/{p}", base.trim_end_matches('/')))
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn unsupported(State(st): State<Vercel>, h: HeaderMap, uri: axum::http::Uri) -> ApiError {
    if let Err(e) = check_key(&st, &h) {
        return e;
    }
    let p = uri.path().trim_start_matches("/vercel");
    let what = if p.contains("/snapshot") {
        "snapshots"
    } else if p.contains("/drives") {
        "drives"
    } else if p.ends_with("/fork") {
        "forking a sandbox"
    } else if p.ends_with("/interactive") {
        "interactive shells"
    } else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no route {p}"));
    };
    ApiError::unsupported(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_under_the_working_directory() {
        assert_eq!(sandbox_path("a.mjs", None).unwrap(), "/vercel/sandbox/a.mjs");
        assert_eq!(sandbox_path("/etc/x", None).unwrap(), "/etc/x");
        assert_eq!(sandbox_path("x/y", Some("/tmp/")).unwrap(), "/tmp/x/y");
        assert!(sandbox_path("../etc/passwd", None).is_err());
        assert!(sandbox_path("/vercel/../../etc", None).is_err());
        assert!(sandbox_path("x", Some("rel")).is_err());
        assert!(sandbox_path("", None).is_err());
    }

    #[test]
    fn errors_have_vercels_shape() {
        assert_eq!(ApiError::from(Error::SandboxNotFound("x".into())).status, StatusCode::NOT_FOUND);
        let gone = ApiError::from(Error::Gone { id: "x".into(), reason: glovebox_proto::api::EndReason::Killed });
        assert_eq!((gone.status, gone.code), (StatusCode::GONE, "sandbox_stopped"));
        assert_eq!(ApiError::unsupported("drives").status, StatusCode::BAD_REQUEST);
    }
}
