//! The HTTP side: the middleware that takes every request carrying `X-Sandbox-ID` (as
//! agent-sandbox's router routes on it) away from the daemon's other routes, and sandboxd's
//! REST API — `/v1/files/{path}` (GET a file or a directory listing, HEAD, PUT, DELETE),
//! `/v1/health`, `/v1/metadata`. The python-runtime routes are in `runtime`.

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use glovebox_proto::agent::{ErrorCode as C, FileType};
use serde::Deserialize;
use serde_json::json;

use super::{paths, runtime, target, Refused, Target, SANDBOX_ID};
use crate::agent::NewFile;
use crate::error::Error;
use crate::http::{multipart, AppState};
use crate::ops;

/// The in-sandbox ports whose APIs the daemon itself serves: the python-runtime's (the SDK's
/// default `server_port`) and sandboxd's REST port.
const SERVED_PORTS: [u16; 2] = [8888, 8080];

/// An error in sandboxd's shape: `{"code": "NOT_FOUND", "message": …}`.
#[derive(Debug)]
pub struct HttpError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> HttpError {
        HttpError { status, code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    pub fn escapes() -> HttpError {
        HttpError::new(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "path traversal outside the sandbox root is forbidden",
        )
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "code": self.code, "message": self.message }))).into_response();
        // The request's body may be unread: the connection cannot carry another request.
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    }
}

impl From<Error> for HttpError {
    fn from(e: Error) -> HttpError {
        let msg = e.to_string();
        let (status, code) = match &e {
            Error::Invalid(_) => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
            Error::SandboxNotFound(_)
            | Error::NotFound { .. }
            | Error::Gone { .. }
            | Error::TemplateNotBuilt { .. } => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            Error::Conflict(_)
            | Error::Paused(_)
            | Error::PausedMeanwhile(_)
            | Error::VolumeInUse(_)
            | Error::HibernateUnavailable(_) => (StatusCode::CONFLICT, "FAILED_PRECONDITION"),
            Error::Quota(_) => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            Error::File { code, .. } => match code {
                C::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
                C::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
                C::AlreadyExists | C::NotEmpty => (StatusCode::CONFLICT, "CONFLICT"),
                C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => {
                    (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT")
                }
                C::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "RESOURCE_EXHAUSTED"),
                C::Protocol | C::Io => return internal(&e),
            },
            Error::SnapshotFailed(_) | Error::Start(_) | Error::Agent(_) | Error::Internal(_) => return internal(&e),
        };
        HttpError::new(status, code, msg)
    }
}

fn internal(e: &Error) -> HttpError {
    tracing::warn!("sandboxd: {e}");
    HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error (see the daemon log)")
}

pub type HttpResult<T> = Result<T, HttpError>;

/// Middleware in front of every other route: a request carrying `X-Sandbox-ID` is this
/// front-end's (authenticated, its sandbox found, then answered by the routes below); any
/// other goes on.
pub async fn intercept(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !req.headers().contains_key(SANDBOX_ID) {
        return next.run(req).await;
    }
    let refused = |r: Refused| match r {
        Refused::Unauthenticated(m) => HttpError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", m),
        Refused::NoSandbox => HttpError::invalid("X-Sandbox-ID header is required"),
        Refused::Sandbox(e) => HttpError::from(e),
    };
    let t = match target(&st.manager, req.headers()).map_err(refused).and_then(|t| port(req.headers()).map(|()| t)) {
        Ok(t) => t,
        Err(e) => {
            crate::http::drain(req.into_body()).await;
            return e.into_response();
        }
    };
    answer(st, t, req).await
}

/// Answers a request whose sandbox is found (by `X-Sandbox-ID` here, by the Host name on the
/// router-facing listener) with sandboxd's and the python-runtime's routes.
pub(super) async fn answer(st: AppState, t: Target, req: Request) -> Response {
    // The sandbox is busy (for its idle clock) while the request is handled and its answer
    // streams, as on the native routes.
    let guards = (t.sb.activity.guard(), st.manager.sandbox_work.guard());
    let mut req = req;
    req.extensions_mut().insert(t);
    req.extensions_mut().insert(st.clone());
    let resp = match tower::ServiceExt::oneshot(routes(), req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    if axum::body::HttpBody::size_hint(resp.body()).exact().is_some() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = body.into_data_stream().map(move |c| {
        let _held = &guards;
        c
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// `X-Sandbox-Port` names an in-sandbox port; the daemon serves the runtime APIs' own.
fn port(h: &HeaderMap) -> HttpResult<()> {
    let Some(v) = h.get("x-sandbox-port") else { return Ok(()) };
    match v.to_str().ok().and_then(|p| p.trim().parse::<u16>().ok()) {
        Some(p) if SERVED_PORTS.contains(&p) => Ok(()),
        Some(p) => Err(HttpError::invalid(format!(
            "X-Sandbox-Port {p}: Glovebox serves the sandbox runtime's APIs (ports 8888 and 8080) here; \
             reach a program's own port through Glovebox's port forwarding (docs/ports.md)"
        ))),
        None => Err(HttpError::invalid("invalid X-Sandbox-Port")),
    }
}

fn routes() -> Router {
    static R: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        Router::new()
            .route("/v1/files", get(get_file).head(get_file).put(put_file).delete(delete_file))
            .route("/v1/files/", get(get_file).head(get_file).put(put_file).delete(delete_file))
            .route("/v1/files/{*path}", get(get_file).head(get_file).put(put_file).delete(delete_file))
            .route("/v1/health", get(health))
            .route("/v1/metadata", get(metadata))
            .merge(runtime::routes())
            .fallback(not_served)
    })
    .clone()
}

/// Anything else: not part of either API.
async fn not_served(method: Method, uri: axum::http::Uri, body: Body) -> HttpError {
    crate::http::drain(body).await;
    HttpError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!(
            "{method} {}: not a sandboxd (/v1/files, /v1/health, /v1/metadata) or python-runtime route; \
             see docs/sandboxd.md",
            uri.path()
        ),
    )
}

/// The wildcard part of a files path (none for the root itself).
fn given(p: Option<Path<String>>) -> String {
    p.map(|Path(p)| p).unwrap_or_default()
}

/// A sandbox path from a request's path under the sandbox's root.
pub fn sandbox_path(t: &Target, given: &str) -> HttpResult<String> {
    paths::resolve(&paths::root(&t.sb), given).map_err(|_| HttpError::escapes())
}

async fn get_file(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    p: Option<Path<String>>,
    method: Method,
) -> HttpResult<Response> {
    let given = given(p);
    let path = sandbox_path(&t, &given)?;
    let m = &st.manager;
    let info = ops::stat(m, &t.sb, path.clone()).await?;
    if info.kind == FileType::Dir {
        let entries = ops::list_dir(m, &t.sb, path, 1).await?;
        let entries: Vec<_> = entries
            .iter()
            .filter(|e| matches!(e.kind, FileType::File | FileType::Dir))
            .map(|e| {
                json!({
                    "name": e.name,
                    "size": e.size,
                    "type": if e.kind == FileType::Dir { "directory" } else { "file" },
                    "modified_at": rfc3339(e.mtime),
                    "mode": format!("{:04o}", e.mode & 0o7777),
                })
            })
            .collect();
        return Ok(Json(json!({ "path": paths::shown(&given), "entries": entries })).into_response());
    }
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH, info.size.to_string()),
    ];
    if method == Method::HEAD {
        return Ok((headers, Body::empty()).into_response());
    }
    let (_, stream) = ops::download(m.clone(), t.sb.clone(), path).await?;
    Ok((headers, Body::from_stream(stream)).into_response())
}

#[derive(Deserialize)]
struct PutQuery {
    mode: Option<String>,
}

async fn put_file(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    p: Option<Path<String>>,
    Query(q): Query<PutQuery>,
    h: HeaderMap,
    body: Body,
) -> HttpResult<StatusCode> {
    let checked = sandbox_path(&t, &given(p)).and_then(|path| Ok((path, file_mode(q.mode.as_deref())?)));
    let (path, mode) = match checked {
        Ok(v) => v,
        Err(e) => {
            crate::http::drain(body).await;
            return Err(e);
        }
    };
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    upload(&st, &t, path, mode, ct, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Writes `body` to `path`: the bytes as sent, or a form's first file part.
pub async fn upload(st: &AppState, t: &Target, path: String, mode: u32, ct: &str, body: Body) -> HttpResult<()> {
    let m = &st.manager;
    let stream = body.into_data_stream();
    let Some(boundary) = multipart::boundary(ct) else {
        ops::upload(m, &t.sb, path, NewFile::with_mode(Some(mode)), stream).await?;
        return Ok(());
    };
    let bad = |e: multipart::Malformed| HttpError::invalid(e.to_string());
    let mut form = multipart::Reader::new(stream, &boundary);
    if form.next_part().await.map_err(bad)?.is_none() {
        return Err(HttpError::invalid("the form has no file part"));
    }
    let chunks = futures_util::stream::unfold(&mut form, |f| async move {
        match f.chunk().await {
            Ok(Some(c)) => Some((Ok::<_, String>(c), f)),
            Ok(None) => None,
            Err(e) => Some((Err(e.to_string()), f)),
        }
    });
    ops::upload(m, &t.sb, path, NewFile::with_mode(Some(mode)), Box::pin(chunks)).await?;
    // The rest of the form (further parts) is read and dropped.
    while form.next_part().await.map_err(bad)?.is_some() {}
    Ok(())
}

/// A `mode` query: `0` and three octal digits (default `0644`).
fn file_mode(q: Option<&str>) -> HttpResult<u32> {
    let Some(m) = q.filter(|m| !m.is_empty()) else { return Ok(0o644) };
    let ok = m.len() == 4 && m.starts_with('0') && m.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !ok {
        return Err(HttpError::invalid(format!("mode {m:?} must match ^0[0-7]{{3}}$")));
    }
    u32::from_str_radix(m, 8).map_err(|e| HttpError::invalid(e.to_string()))
}

#[derive(Deserialize)]
struct DeleteQuery {
    #[serde(default)]
    recursive: Option<String>,
}

async fn delete_file(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    p: Option<Path<String>>,
    Query(q): Query<DeleteQuery>,
) -> HttpResult<StatusCode> {
    let path = sandbox_path(&t, &given(p))?;
    if path == paths::root(&t.sb).trim_end_matches('/') || path == "/" {
        return Err(HttpError::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", "the sandbox root cannot be deleted"));
    }
    let recursive = match q.recursive.as_deref() {
        None | Some("") | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(v) => return Err(HttpError::invalid(format!("recursive must be true or false, got {v:?}"))),
    };
    let m = &st.manager;
    // Existence first: the agent's remove may answer a missing path as done.
    ops::stat(m, &t.sb, path.clone()).await?;
    match ops::remove(m, &t.sb, path, recursive).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(Error::File { code: C::NotEmpty, .. }) => {
            Err(HttpError::new(StatusCode::CONFLICT, "CONFLICT", "directory is not empty (delete with recursive=true)"))
        }
        Err(e) => Err(e.into()),
    }
}

async fn health(Extension(t): Extension<Target>) -> Json<serde_json::Value> {
    let up = t.sb.created_at.elapsed().map_or(0, |d| d.as_secs());
    Json(json!({ "status": "ok", "uptime_seconds": up }))
}

async fn metadata(Extension(t): Extension<Target>) -> Json<serde_json::Value> {
    Json(json!({ "env": super::metadata_env(&t.sb.env) }))
}

/// Seconds since the epoch as RFC 3339 (UTC, whole seconds).
pub fn rfc3339(secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    crate::util::rfc3339(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_with_a_leading_zero() {
        assert_eq!(file_mode(None).unwrap(), 0o644);
        assert_eq!(file_mode(Some("0755")).unwrap(), 0o755);
        assert!(file_mode(Some("755")).is_err());
        assert!(file_mode(Some("0789")).is_err());
        assert!(file_mode(Some("01777")).is_err());
    }

    #[test]
    fn only_the_runtime_ports_are_served() {
        let mut h = HeaderMap::new();
        assert!(port(&h).is_ok());
        h.insert("x-sandbox-port", "8888".parse().unwrap());
        assert!(port(&h).is_ok());
        h.insert("x-sandbox-port", "8080".parse().unwrap());
        assert!(port(&h).is_ok());
        h.insert("x-sandbox-port", "3000".parse().unwrap());
        assert_eq!(port(&h).unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn dates() {
        assert!(rfc3339(0).starts_with("1970-01-01T00:00:00"), "{}", rfc3339(0));
    }
}
