//! The E2B-compatible API: what the official `e2b` and `e2b-code-interpreter` SDKs speak,
//! mapped onto the manager, `ops` and `code` (no second implementation of anything).
//!
//! Three surfaces share the daemon's one listener (point both `E2B_API_URL` and
//! `E2B_SANDBOX_URL` at it):
//! - the control plane (`/sandboxes`, `/v2/sandboxes`), authenticated with `X-API-Key`;
//! - the in-sandbox API ("envd", port 49983): Connect-RPC `process` and `filesystem`
//!   services and the REST `/files` endpoints;
//! - the code interpreter (port 49999): `/execute`, `/contexts`.
//!
//! Requests to a sandbox carry `E2b-Sandbox-Id` and `E2b-Sandbox-Port`, and the sandbox's
//! access token (`X-Access-Token`, or `E2B-Traffic-Access-Token` on the code-interpreter
//! port). Tokens are issued by create/connect and exist only in this daemon's memory.
//!
//! A `/files` URL may carry a signature instead of the token (`Sandbox.download_url` /
//! `upload_url`): `v1_` + unpadded base64 of SHA-256 over `path:operation:user:token` (with
//! `:expiration`, a Unix time, when it expires), as the SDKs compute it. It is only as
//! secret as the token it is made from, and names one path, one operation and one user.
//!
//! Invariants: every handler authorizes first (one function each for the API key and the
//! sandbox token); a missing or ended sandbox answers the way E2B's proxy does (502, "… was
//! not found"), so the SDKs raise their own "sandbox not running" errors.

mod code;
mod connect;
mod control;
mod filesystem;
mod gzip;
mod process;
mod snapshots;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::Error;
use crate::http::AppState;
use crate::manager::Sb;
use crate::tenants::Caller;
use crate::util::{constant_time_eq, random_token};

/// The port the SDKs address envd (commands, files) at.
pub const ENVD_PORT: u16 = 49983;
/// The port the code-interpreter SDK addresses its server at.
pub const JUPYTER_PORT: u16 = 49999;
/// The envd version reported to the SDKs: the features they gate on it (octet-stream
/// uploads, closing stdin, default user, file metadata, gzip, watching with entries and on
/// any mount) are the ones served here.
pub const ENVD_VERSION: &str = "0.6.4";
/// The uid and gid of E2B's default user, `user` (every sandbox's `/etc/passwd` has it).
pub const USER_ID: u32 = 1000;
/// Where relative paths point (E2B's default user's home; the agent's home too).
pub const HOME: &str = "/home/user";

/// State of the E2B surface: the app's, plus the sandboxes' access tokens.
#[derive(Clone)]
pub struct E2b {
    pub app: AppState,
    tokens: Arc<Mutex<HashMap<String, String>>>,
    watchers: watch::Watchers,
}

impl E2b {
    /// The access token of a live sandbox, issued on first use.
    fn token_for(&self, id: &str) -> String {
        let mut t = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the tokens of sandboxes that ended (bounded by the live count + this one).
        if t.len() > 2 * self.app.manager.live_count() + 16 {
            t.retain(|id, _| self.app.manager.get(id).is_ok());
        }
        let token = t.entry(id.to_string()).or_insert_with(|| format!("gbe2b_{}", random_token(32))).clone();
        // It is also the traffic access token: it opens the sandbox's exposed ports.
        self.app.manager.ports.grant(id, &token);
        token
    }

    fn token_is(&self, id: &str, given: &str) -> bool {
        let t = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        t.get(id).is_some_and(|k| constant_time_eq(k.as_bytes(), given.as_bytes()))
    }
}

pub fn router(app: AppState) -> Router {
    let st = E2b { app, tokens: Arc::new(Mutex::new(HashMap::new())), watchers: watch::Watchers::default() };
    let rpc = Router::new()
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .layer(DefaultBodyLimit::max(crate::http::MAX_JSON_BODY));
    let files = Router::new()
        .route("/files", get(filesystem::download).post(filesystem::upload))
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(control::routes())
        .merge(snapshots::routes())
        .merge(rpc)
        .merge(files)
        .route("/health", get(health))
        .merge(code::routes())
        .with_state(st)
        .layer(axum::middleware::map_response(close_after_error))
}

/// An error answer may leave the request's body unread (the sandbox lookup rejects before
/// any handler reads it), and then the connection cannot carry another request. Saying so
/// (`Connection: close`) keeps the SDKs' pooled clients from sending their next request on
/// it while it closes — which they report as "connection closed before message completed".
async fn close_after_error(mut r: Response) -> Response {
    if r.status().is_client_error() || r.status().is_server_error() {
        r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    r
}

/// envd's health probe: the SDKs ask it after a failed request to tell a dead sandbox from
/// a network problem.
async fn health(_sb: At<ENVD_PORT>) -> StatusCode {
    StatusCode::NO_CONTENT
}

/// An error in the shape of E2B's REST answers: `{"code": <status>, "message": …}`.
#[derive(Debug)]
pub struct RestError {
    pub status: StatusCode,
    pub message: String,
}

impl RestError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> RestError {
        RestError { status, message: message.into() }
    }

    /// What E2B's proxy answers for a sandbox that does not exist (any more).
    fn sandbox_gone(id: &str) -> RestError {
        RestError::new(StatusCode::BAD_GATEWAY, format!("The sandbox {id} was not found"))
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<Error> for RestError {
    fn from(e: Error) -> RestError {
        use glovebox_proto::agent::ErrorCode as C;
        let status = match &e {
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::SandboxNotFound(id) | Error::Gone { id, .. } => return RestError::sandbox_gone(id),
            Error::NotFound { .. } | Error::TemplateNotBuilt { .. } => StatusCode::NOT_FOUND,
            Error::Conflict(_) | Error::Paused(_) | Error::PausedMeanwhile(_) | Error::VolumeInUse(_) => {
                StatusCode::CONFLICT
            }
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::HibernateUnavailable(_) => StatusCode::NOT_IMPLEMENTED,
            Error::SnapshotFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::File { code, .. } => match code {
                C::NotFound => StatusCode::NOT_FOUND,
                C::AlreadyExists | C::NotEmpty => StatusCode::CONFLICT,
                C::PermissionDenied => StatusCode::FORBIDDEN,
                C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => StatusCode::BAD_REQUEST,
                C::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
                C::Protocol | C::Io => StatusCode::INTERNAL_SERVER_ERROR,
            },
            Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
                tracing::warn!("e2b: {e}");
                return RestError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error (see the daemon log)");
            }
        };
        RestError::new(status, e.to_string())
    }
}

/// Resolves the control plane's `X-API-Key` (or `Authorization: Bearer`) to its caller
/// (a tenant's key, or the daemon's admin key). The one place the E2B surface decides who
/// may manage sandboxes.
fn check_api_key(st: &E2b, h: &HeaderMap) -> Result<Caller, RestError> {
    match crate::http::presented_key(h) {
        Some(k) => st
            .app
            .manager
            .tenants
            .authenticate(k.trim())
            .ok_or_else(|| RestError::new(StatusCode::UNAUTHORIZED, "Invalid API key")),
        None => Err(RestError::new(StatusCode::UNAUTHORIZED, "Missing API key (send X-API-Key)")),
    }
}

/// A request to a sandbox's port `PORT`: the live sandbox, after the token check (resumed
/// if it was paused).
pub struct At<const PORT: u16>(pub Arc<Sb>);

impl<const PORT: u16> FromRequestParts<E2b> for At<PORT> {
    type Rejection = RestError;

    async fn from_request_parts(parts: &mut Parts, st: &E2b) -> Result<Self, Self::Rejection> {
        let h = &parts.headers;
        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::trim);
        let signed_files = PORT == ENVD_PORT && parts.uri.path() == "/files" && !h.contains_key("x-access-token");
        let (id, signed) = match header("e2b-sandbox-id") {
            Some(id) => (id.to_string(), false),
            None if signed_files => (check_file_signature(st, None, parts)?, true),
            None => return Err(RestError::new(StatusCode::BAD_REQUEST, "missing E2b-Sandbox-Id header")),
        };
        let id = id.as_str();
        let port = header("e2b-sandbox-port").and_then(|p| p.parse::<u16>().ok()).unwrap_or(ENVD_PORT);
        let sb = st.app.manager.get(id).map_err(|_| RestError::sandbox_gone(id))?;
        if port != PORT {
            return Err(RestError::new(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} is running but port {port} is not open for this request"),
            ));
        }
        if !signed {
            if let Err(e) = check_sandbox_token(st, id, h, PORT) {
                if !signed_files {
                    return Err(e);
                }
                check_file_signature(st, Some(id), parts)?;
            }
        }
        // A request that reaches a paused sandbox resumes it first when it was created with
        // `lifecycle.auto_resume`; otherwise E2B's proxy answers 502 (the SDK's `is_running`
        // reads that as "not running") until `connect` resumes it.
        match st.app.manager.wake_for_request(&sb) {
            Ok(()) => Ok(At(sb)),
            Err(Error::Paused(_)) => Err(RestError::new(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} is paused: connect to it (Sandbox.connect) to resume it"),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// Checks a sandbox request's access token. The code-interpreter SDK sends the envd token
/// on some calls and the traffic token on others; both are the sandbox's one token here.
fn check_sandbox_token(st: &E2b, id: &str, h: &HeaderMap, port: u16) -> Result<(), RestError> {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::trim);
    let mut given = vec![get("x-access-token")];
    if port == JUPYTER_PORT {
        given.push(get("e2b-traffic-access-token"));
    }
    if given.iter().flatten().any(|t| st.token_is(id, t)) {
        return Ok(());
    }
    Err(RestError::new(StatusCode::UNAUTHORIZED, "missing or invalid sandbox access token (X-Access-Token)"))
}

/// The user named by an `Authorization: Basic` header (`user:`), as the SDKs send it.
fn basic_user(h: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let v = h.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let enc = v.strip_prefix("Basic ").or_else(|| v.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD.decode(enc.trim()).ok()?;
    let s = String::from_utf8(raw).ok()?;
    let user = s.split(':').next().unwrap_or("").to_string();
    (!user.is_empty()).then_some(user)
}

/// The owner of what a request as `user` makes: `root` or `user` when one is named. None
/// named: the agent's own (root), the user sandbox processes run as here (unlike E2B,
/// whose default user is `user`), so that they can change what the API made. Other
/// accounts are refused: a sandbox has only those two.
fn user_owner(user: Option<&str>) -> Result<Option<glovebox_proto::agent::Owner>, String> {
    use glovebox_proto::agent::Owner;
    match user {
        None => Ok(None),
        Some("user") => Ok(Some(Owner { uid: USER_ID, gid: USER_ID })),
        Some("root") => Ok(Some(Owner { uid: 0, gid: 0 })),
        Some(other) => Err(format!("unknown user {:?} (a sandbox has \"user\" and \"root\")", other)),
    }
}

/// A `/files` URL's signature, as the SDKs make it.
fn file_signature(path: &str, operation: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    use base64::Engine;
    use sha2::Digest;
    let raw = match expiration {
        Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

/// Checks a signed `/files` URL (one without a token header): the signature must be made
/// with a sandbox's token for this path, operation (`read` for GET, `write` for POST) and
/// user, and not be expired. The SDKs build these URLs without the sandbox id when the
/// sandbox URL is overridden (as it is for Glovebox), so without `id` the sandbox is the one
/// whose token makes the signature. Returns the sandbox id.
fn check_file_signature(st: &E2b, id: Option<&str>, parts: &Parts) -> Result<String, RestError> {
    let q: HashMap<String, String> = axum::extract::Query::try_from_uri(&parts.uri).map(|q| q.0).unwrap_or_default();
    let unauthorized = |m: &str| RestError::new(StatusCode::UNAUTHORIZED, m);
    let Some(given) = q.get("signature") else {
        return Err(match id {
            Some(_) => unauthorized("missing or invalid sandbox access token (X-Access-Token)"),
            None => RestError::new(StatusCode::BAD_REQUEST, "missing E2b-Sandbox-Id header"),
        });
    };
    let operation = if parts.method == axum::http::Method::GET { "read" } else { "write" };
    let expiration = match q.get("signature_expiration") {
        Some(e) => Some(e.parse::<i64>().map_err(|_| unauthorized("invalid signature expiration"))?),
        None => None,
    };
    let path = q.get("path").map_or("", String::as_str);
    let user = q.get("username").map_or("", String::as_str);
    let signs = |token: &str| {
        constant_time_eq(file_signature(path, operation, user, token, expiration).as_bytes(), given.as_bytes())
    };
    let found = {
        let tokens = st.tokens.lock().unwrap_or_else(|p| p.into_inner());
        match id {
            Some(id) => tokens.get(id).filter(|t| signs(t)).map(|_| id.to_string()),
            None => tokens.iter().find(|(_, t)| signs(t)).map(|(id, _)| id.clone()),
        }
    };
    let Some(found) = found else {
        return Err(unauthorized("invalid signature"));
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if expiration.is_some_and(|e| e < i64::try_from(now).unwrap_or(i64::MAX)) {
        return Err(unauthorized("signature is already expired"));
    }
    Ok(found)
}

/// A user path as E2B means it: relative paths are relative to the default user's home.
/// (A string on the sandbox's side; the agent resolves it inside the sandbox.)
fn sandbox_path(p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else if p.is_empty() {
        HOME.to_string()
    } else {
        format!("{HOME}/{p}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_home() {
        assert_eq!(sandbox_path("/etc/x"), "/etc/x");
        assert_eq!(sandbox_path("data.csv"), "/home/user/data.csv");
        assert_eq!(sandbox_path(""), "/home/user");
    }

    #[test]
    fn users_and_signatures() {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        assert_eq!(user_owner(Some("root")).unwrap().map(|o| o.uid), Some(0));
        assert_eq!(user_owner(Some("user")).unwrap().map(|o| o.uid), Some(USER_ID));
        assert_eq!(user_owner(None).unwrap(), None);
        assert!(user_owner(Some("mallory")).is_err());
        // As the Python SDK computes it: sha256("a.txt:read:user:tok"), base64, no padding.
        assert_eq!(
            file_signature("a.txt", "read", "user", "tok", None),
            "v1_wPjHOh/p+K3FbqiyGd5vwPNc/g4IPd8sigMxb1gqu9I"
        );
        assert_ne!(
            file_signature("a.txt", "read", "user", "tok", Some(1)),
            file_signature("a.txt", "read", "user", "tok", None)
        );
    }

    #[test]
    fn gone_sandboxes_answer_like_the_proxy() {
        let e = RestError::from(Error::SandboxNotFound("abc".into()));
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert!(e.message.contains("was not found"));
    }
}
