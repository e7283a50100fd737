//! The native HTTP API under `/v1`. Handlers only parse, authorize, call the manager (or the
//! sandbox's agent through `ops`) and map errors; one `ApiError` gives every failure one
//! status and one stable machine code.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use glovebox_proto::agent::ErrorCode;
use glovebox_proto::api::{
    CreateKey, CreateSandbox, CreatedKey, EndReason, Entries, ErrorBody, ErrorDetail, ExecRequest, KeyList, MakeDir,
    Rename, SandboxList, SetTimeout, SignalRequest, TenantQuota, UsageReport,
};
use serde::Deserialize;

use crate::error::Error;
use crate::manager::Manager;
use crate::ops;
use crate::secrets::handlers as secrets;
use crate::tenants::Caller;
use axum::Extension;

/// Largest JSON body accepted (stdin given inline counts here; use the file API for more).
pub const MAX_JSON_BODY: usize = 16 << 20;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub api_key: Arc<String>,
}

pub fn router(state: AppState) -> Router {
    state.manager.tenants.set_admin_key(&state.api_key);
    let v1 = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/network", axum::routing::put(set_network))
        .route("/sandboxes/{id}/egress", get(egress_log))
        .route("/sandboxes/{id}/exec", post(exec))
        .route("/sandboxes/{id}/commands", get(commands))
        .route("/sandboxes/{id}/commands/{cid}", get(command))
        .route("/sandboxes/{id}/commands/{cid}/kill", post(signal))
        .route("/sandboxes/{id}/commands/{cid}/stdin", post(stdin))
        .route("/sandboxes/{id}/files", get(download).put(upload).delete(remove).layer(DefaultBodyLimit::disable()))
        .route("/sandboxes/{id}/code", post(run_code))
        .route("/sandboxes/{id}/metrics", get(sandbox_metrics))
        .route("/sandboxes/{id}/usage", get(sandbox_usage))
        .route("/usage", get(usage_report))
        .route("/keys", post(create_key).get(list_keys))
        .route("/keys/{kid}", axum::routing::delete(revoke_key))
        .route("/tenants/{tenant}/quota", get(get_quota).put(set_quota))
        .route("/sandboxes/{id}/contexts", post(create_context).get(list_contexts))
        .route("/sandboxes/{id}/contexts/{cid}", axum::routing::delete(remove_context))
        .route("/sandboxes/{id}/contexts/{cid}/restart", post(restart_context))
        .route("/sandboxes/{id}/files/list", get(list_dir))
        .route("/sandboxes/{id}/files/stat", get(stat))
        .route("/sandboxes/{id}/files/mkdir", post(mkdir))
        .route("/sandboxes/{id}/files/rename", post(rename))
        .route("/secrets", get(secrets::list).post(secrets::create))
        .route("/secrets/{name}", get(secrets::show).put(secrets::put).delete(secrets::delete))
        .route("/sandboxes/{id}/keepalive", post(keepalive))
        .route("/sandboxes/{id}/events", get(crate::events::of_sandbox))
        .route("/events", get(crate::events::all))
        .route("/templates", post(crate::templates::http::build).get(crate::templates::http::list))
        .route("/templates/gc", post(crate::templates::http::gc))
        .route("/templates/{name}", get(crate::templates::http::get_one).delete(crate::templates::http::delete))
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .route_layer(middleware::from_fn_with_state(state.clone(), crate::idle::track))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let prom = Router::new()
        .route("/metrics", get(prometheus))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(prom)
        .nest("/v1", v1)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(state.clone())
        .merge(crate::e2b::router(state.clone()))
        .layer(middleware::from_fn_with_state(state, count_responses))
}

/// Counts every response by status class (`glovebox_http_responses_total`).
async fn count_responses(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    st.manager.metrics.response(resp.status().as_u16());
    resp
}

/// The API key a request presents (`Authorization: Bearer …` or `X-API-Key`).
pub fn presented_key(h: &HeaderMap) -> Option<&str> {
    h.get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// Whether `caller` may address sandbox `id`. Someone else's sandbox (live or ended) is
/// answered exactly like one that never existed: 404, so ids of other tenants cannot be probed.
pub fn authorize(manager: &Manager, caller: &Caller, id: &str) -> Result<(), ApiError> {
    match manager.owner_of(id) {
        Some(owner) if !caller.may_access(&owner) => Err(Error::SandboxNotFound(id.to_string()).into()),
        _ => Ok(()),
    }
}

/// The sandbox id a `/v1/sandboxes/{id}/…` path names.
fn sandbox_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1").unwrap_or(path).strip_prefix("/sandboxes/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

async fn auth(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let h = req.headers();
    let caller = presented_key(h).and_then(|k| st.manager.tenants.authenticate(k));
    match (presented_key(h), caller) {
        (_, Some(caller)) => {
            if let Some(id) = sandbox_in_path(req.uri().path()) {
                if let Err(e) = authorize(&st.manager, &caller, id) {
                    drain(req.into_body()).await;
                    return e.into_response();
                }
            }
            req.extensions_mut().insert(caller);
            let h = req.headers();
            let declared =
                h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
            let is_file_body = req.uri().path().ends_with("/files") || req.uri().path().ends_with("/stdin");
            match declared {
                Some(n) if n > MAX_JSON_BODY as u64 && !is_file_body => too_large(req).await,
                _ => next.run(req).await,
            }
        }
        (Some(_), None) => {
            drain(req.into_body()).await;
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "invalid API key").into_response()
        }
        (None, None) => {
            drain(req.into_body()).await;
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing API key (send `Authorization: Bearer <key>`)",
            )
            .into_response()
        }
    }
}

/// Reads and drops what is left of a request body (bounded in size and time) before an
/// early error answer: a server that answers while the client is still sending resets the
/// connection, and the client then never sees the answer.
pub(crate) async fn drain(mut body: Body) {
    use http_body_util::BodyExt;
    const DRAIN_MAX: usize = 64 << 20;
    let mut seen = 0usize;
    let go = async {
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), go).await;
}

/// Answers 413 to a body declared larger than the JSON limit — after reading (and dropping)
/// it, up to a bound: a server that answers while the client is still sending resets the
/// connection, and the client then never sees the 413.
async fn too_large(req: Request) -> Response {
    drain(req.into_body()).await;
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request",
        format!("request body is larger than {} MiB; send files with PUT …/files", MAX_JSON_BODY >> 20),
    )
    .into_response()
}

/// An error response: status + stable code + message (+ reason for `sandbox_gone`).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody { error: ErrorDetail { code: code.into(), message: message.into(), reason: None } },
        }
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        self.status
    }
    pub fn into_detail(self) -> ErrorDetail {
        self.body.error
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let msg = e.to_string();
        let (status, code) = match &e {
            Error::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Error::SandboxNotFound(_) => (StatusCode::NOT_FOUND, "sandbox_not_found"),
            Error::NotFound { what: "template", .. } => (StatusCode::NOT_FOUND, "template_not_found"),
            Error::NotFound { what: "context", .. } => (StatusCode::NOT_FOUND, "context_not_found"),
            Error::NotFound { what: "command", .. } => (StatusCode::NOT_FOUND, "command_not_found"),
            Error::NotFound { what: "secret", .. } => (StatusCode::NOT_FOUND, "secret_not_found"),
            Error::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Error::Gone { reason, .. } => {
                let mut a = ApiError::new(StatusCode::GONE, "sandbox_gone", msg);
                a.body.error.reason = Some(*reason);
                return a;
            }
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Quota(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Error::Start(_) => {
                tracing::error!("{msg}");
                (StatusCode::INTERNAL_SERVER_ERROR, "start_failed")
            }
            Error::File { code, .. } => match code {
                ErrorCode::NotFound => (StatusCode::NOT_FOUND, "file_not_found"),
                ErrorCode::AlreadyExists => (StatusCode::CONFLICT, "file_exists"),
                ErrorCode::NotADirectory => (StatusCode::BAD_REQUEST, "not_a_directory"),
                ErrorCode::IsADirectory => (StatusCode::BAD_REQUEST, "is_a_directory"),
                ErrorCode::NotEmpty => (StatusCode::CONFLICT, "directory_not_empty"),
                ErrorCode::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
                ErrorCode::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_path"),
                ErrorCode::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "disk_full"),
                ErrorCode::SpawnFailed => (StatusCode::BAD_REQUEST, "spawn_failed"),
                ErrorCode::Protocol | ErrorCode::Io => (StatusCode::BAD_GATEWAY, "agent_error"),
            },
            Error::Agent(_) => {
                tracing::warn!("{msg}");
                (StatusCode::BAD_GATEWAY, "agent_error")
            }
            Error::Internal(_) => {
                tracing::error!("{msg}");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error (see the daemon log)",
                );
            }
        };
        ApiError::new(status, code, msg)
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// `Json` with rejections turned into our error shape (400 + what was wrong).
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(r) => Err(json_rejection(r)),
        }
    }
}

/// `Path` with rejections in our error shape.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(r) => Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", r.body_text())),
        }
    }
}

/// `Query` with rejections in our error shape.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(r) => Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", r.body_text())),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    let status = match &r {
        JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, "invalid_request", r.body_text())
}

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateSandbox>,
) -> ApiResult<Response> {
    let sb = st.manager.create_for(&caller.tenant, req).await?;
    Ok(json(StatusCode::CREATED, &sb.view()))
}

#[derive(Deserialize)]
struct ListQuery {
    /// `key=value` metadata filters, comma separated.
    #[serde(default)]
    metadata: Option<String>,
}

async fn list(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Response> {
    let mut filters = BTreeMap::new();
    if let Some(m) = &q.metadata {
        for pair in m.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", "metadata filter must be key=value")
            })?;
            filters.insert(k.to_string(), v.to_string());
        }
    }
    let sandboxes = st
        .manager
        .list_for(&caller)
        .into_iter()
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    Ok(json(StatusCode::OK, &SandboxList { sandboxes }))
}

async fn get_one(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.get(&id)?.view()))
}

async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    st.manager.get(&id)?;
    st.manager.destroy(&id, EndReason::Killed).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(t): Json<SetTimeout>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.set_timeout(&id, t.timeout_s)?.view()))
}

fn wants_ndjson(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/x-ndjson"))
}

async fn exec(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    if req.background {
        let cmd = req.cmd.clone();
        let started = ops::exec_background(&st.manager, &sb, req).await?;
        crate::manager::records::watch_background(st.manager.clone(), sb.clone(), started.id, cmd);
        return Ok(json(StatusCode::ACCEPTED, &started));
    }
    if wants_ndjson(&headers) {
        let stream = ops::exec_stream(st.manager.clone(), sb, req).await?;
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(Body::from_stream(stream))
            .map_err(|e| ApiError::from(Error::Internal(e.to_string())));
    }
    Ok(json(StatusCode::OK, &ops::exec(&st.manager, &sb, req).await?))
}

async fn keepalive(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    sb.activity.touch();
    Ok(json(StatusCode::OK, &sb.view()))
}

async fn commands(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::list_commands(&st.manager, &sb).await?))
}

#[derive(Deserialize)]
struct CommandQuery {
    #[serde(default)]
    wait: bool,
    #[serde(default)]
    encoding: glovebox_proto::api::Encoding,
}

async fn command(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    Query(q): Query<CommandQuery>,
) -> ApiResult<Response> {
    // A record outlives the agent's memory of the command, and the sandbox.
    let stored = || crate::manager::records::stored_result(&st.manager, &id, cid, q.encoding);
    let sb = match st.manager.get(&id) {
        Ok(sb) => sb,
        Err(e) => return stored().await.map(|r| json(StatusCode::OK, &r)).ok_or_else(|| e.into()),
    };
    match ops::command_result(&st.manager, &sb, cid, q.wait, q.encoding).await {
        Ok(r) => Ok(json(StatusCode::OK, &r)),
        Err(e @ (Error::NotFound { .. } | Error::Gone { .. })) => {
            stored().await.map(|r| json(StatusCode::OK, &r)).ok_or_else(|| e.into())
        }
        Err(e) => Err(e.into()),
    }
}

async fn signal(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let req: SignalRequest = if body.iter().all(|b| b.is_ascii_whitespace()) {
        SignalRequest { signal: None }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))?
    };
    let sig = req.signal.unwrap_or(libc::SIGKILL);
    ops::signal(&st.manager, &sb, cid, sig).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct StdinQuery {
    #[serde(default)]
    close: bool,
}

async fn stdin(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    Query(q): Query<StdinQuery>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    ops::send_stdin(&st.manager, &sb, cid, &body, q.close).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    depth: Option<u32>,
    /// Octal file mode for uploads, e.g. `0755`.
    #[serde(default)]
    mode: Option<String>,
}

async fn download(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let (info, body) = ops::download(st.manager.clone(), sb, q.path).await?;
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, info.size)
        .body(Body::from_stream(body))
        .map_err(|e| Error::Internal(e.to_string()).into())
}

async fn upload(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    body: Body,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let mode = match &q.mode {
        Some(m) => {
            Some(u32::from_str_radix(m.trim_start_matches("0o"), 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", "mode must be octal, e.g. 0644")
            })?)
        }
        None => None,
    };
    let mut stream = body.into_data_stream();
    match ops::upload(&st.manager, &sb, q.path, mode, &mut stream).await {
        Ok(info) => Ok(json(StatusCode::OK, &info)),
        Err(e) => {
            // E.g. the disk filled mid-upload: let the client finish sending, then answer.
            use futures_util::StreamExt;
            let go = async {
                let mut seen = 0usize;
                while let Some(Ok(c)) = stream.next().await {
                    seen += c.len();
                    if seen > 256 << 20 {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), go).await;
            Err(e.into())
        }
    }
}

async fn remove(State(st): State<AppState>, Path(id): Path<String>, Query(q): Query<PathQuery>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    ops::remove(&st.manager, &sb, q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let depth = q.depth.unwrap_or(1);
    if depth == 0 || depth > 32 {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", "depth must be between 1 and 32"));
    }
    let entries = ops::list_dir(&st.manager, &sb, q.path, depth).await?;
    Ok(json(StatusCode::OK, &Entries { entries }))
}

async fn stat(State(st): State<AppState>, Path(id): Path<String>, Query(q): Query<PathQuery>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::stat(&st.manager, &sb, q.path).await?))
}

async fn mkdir(State(st): State<AppState>, Path(id): Path<String>, Json(b): Json<MakeDir>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::make_dir(&st.manager, &sb, b.path).await?))
}

async fn rename(State(st): State<AppState>, Path(id): Path<String>, Json(b): Json<Rename>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::rename(&st.manager, &sb, b.from, b.to).await?))
}

async fn run_code(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<glovebox_proto::api::RunCode>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    if wants_ndjson(&headers) {
        let stream = crate::code::run_code_stream(st.manager.clone(), sb, req)?;
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(Body::from_stream(stream))
            .map_err(|e| ApiError::from(Error::Internal(e.to_string())));
    }
    Ok(json(StatusCode::OK, &crate::code::run_code(&st.manager, &sb, req).await?))
}

async fn create_context(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<glovebox_proto::api::CreateContext>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let cid = format!("ctx-{}", crate::util::random_token(12));
    let k = std::sync::Arc::new(crate::code::Kernel::new(cid, req.language, req.cwd, sb.preload.as_deref()));
    k.ensure(&sb.target()).await.map_err(|e| match e {
        Error::Agent(m) => st.manager.agent_error(&id, m),
        e => e,
    })?;
    sb.kernels.insert(k.clone());
    Ok(json(StatusCode::CREATED, &k.view()))
}

async fn list_contexts(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &glovebox_proto::api::ContextList { contexts: sb.kernels.list() }))
}

async fn restart_context(State(st): State<AppState>, Path((id, cid)): Path<(String, String)>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let k = sb.kernels.get(&cid).ok_or_else(|| Error::NotFound { what: "context", name: cid.clone() })?;
    k.restart(&sb.target()).await?;
    Ok(json(StatusCode::OK, &k.view()))
}

async fn remove_context(State(st): State<AppState>, Path((id, cid)): Path<(String, String)>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let k = sb.kernels.remove(&cid).ok_or_else(|| Error::NotFound { what: "context", name: cid.clone() })?;
    k.shutdown(&sb.target()).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn prometheus(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> Response {
    // Daemon-wide numbers cover every tenant: the operator's.
    if let Err(e) = require_admin(&caller) {
        return e.into_response();
    }
    let body = st.manager.metrics.render(st.manager.live_count(), st.manager.warm_count());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn sandbox_metrics(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let mut m = sb.metrics();
    if let Ok(u) = sb.agent().usage().await {
        m.disk_used_bytes = u.disk_used_bytes;
    }
    Ok(json(StatusCode::OK, &m))
}

async fn set_network(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(p): Json<glovebox_proto::api::NetworkPolicy>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.set_network(&id, p).await?.view()))
}

async fn egress_log(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &glovebox_proto::api::EgressLog { entries: sb.egress.entries() }))
}

fn require_admin(caller: &Caller) -> ApiResult<()> {
    if caller.admin {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this needs the admin API key"))
    }
}

async fn create_key(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Json(req): Json<CreateKey>,
) -> ApiResult<Response> {
    require_admin(&caller)?;
    let (key, info) = st.manager.tenants.create_key(&req.tenant, req.name)?;
    Ok(json(StatusCode::CREATED, &CreatedKey { key, info }))
}

async fn list_keys(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> ApiResult<Response> {
    require_admin(&caller)?;
    Ok(json(StatusCode::OK, &KeyList { keys: st.manager.tenants.list_keys() }))
}

async fn revoke_key(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(kid): Path<String>,
) -> ApiResult<Response> {
    require_admin(&caller)?;
    Ok(json(StatusCode::OK, &st.manager.tenants.revoke_key(&kid)?))
}

async fn get_quota(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(tenant): Path<String>,
) -> ApiResult<Response> {
    if !caller.may_access(&tenant) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "a key may only read its own tenant's quota"));
    }
    Ok(json(StatusCode::OK, &st.manager.tenants.quota(&tenant)))
}

async fn set_quota(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(tenant): Path<String>,
    Json(q): Json<TenantQuota>,
) -> ApiResult<Response> {
    require_admin(&caller)?;
    Ok(json(StatusCode::OK, &st.manager.tenants.set_quota(&tenant, q)?))
}

async fn sandbox_usage(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    match st.manager.usage_of(&id) {
        Some(u) => Ok(json(StatusCode::OK, &u)),
        None => Err(Error::SandboxNotFound(id).into()),
    }
}

#[derive(Deserialize)]
struct UsageQuery {
    #[serde(default)]
    tenant: Option<String>,
}

async fn usage_report(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Query(q): Query<UsageQuery>,
) -> ApiResult<Response> {
    let tenant = match (&q.tenant, caller.admin) {
        (Some(t), true) => Some(t.as_str()),
        (None, true) => None,
        (Some(t), false) if *t != caller.tenant => {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "a key may only read its own tenant's usage"))
        }
        _ => Some(caller.tenant.as_str()),
    };
    Ok(json(StatusCode::OK, &UsageReport { tenants: st.manager.usage_report(tenant) }))
}
