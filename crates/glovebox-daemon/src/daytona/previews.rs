//! Daytona's preview links over the daemon's exposed ports (`crate::ports`): the standard
//! link (the port's preview host, opened with the port's token in `X-Daytona-Preview-Token`),
//! signed links (a token with its expiry inside its HMAC, carried as the URL's first path
//! segment, revocable), and public sandboxes (every port open without a token).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use glovebox_proto::api::MAX_TIMEOUT_S;
use serde_json::json;

use super::{caller_for, Daytona, DtError};

/// How long a signed link lives unless asked otherwise (Daytona's default).
const DEFAULT_SIGNED_S: u64 = 60;

pub fn routes() -> Router<Daytona> {
    Router::new()
        .route("/sandbox/{id}/ports/{port}/preview-url", get(preview_url))
        .route("/sandbox/{id}/ports/{port}/signed-preview-url", get(signed_preview_url))
        .route("/sandbox/{id}/ports/{port}/signed-preview-url/{token}/expire", post(expire_signed))
}

/// The live sandbox `id` the caller may address, and the port named in the path (exposed).
fn exposed(st: &Daytona, h: &HeaderMap, id: &str, port: &str) -> Result<u16, DtError> {
    caller_for(st, h, id)?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| DtError::bad("port must be 1-65535"))?;
    crate::http::expose_live(&st.app, id, port, false)?;
    Ok(port)
}

/// `http://P-<id>.<preview domain>:<daemon port>`, as the caller reached the daemon.
fn base_url(st: &Daytona, h: &HeaderMap, id: &str, port: u16) -> String {
    format!("http://{}", st.app.manager.ports.host_via(id, port, crate::http::api_host(h)))
}

/// `get_preview_link(port)`: the port's preview host and its token (for the
/// `X-Daytona-Preview-Token` header; a public sandbox needs none).
async fn preview_url(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, port)): Path<(String, String)>,
) -> Result<Response, DtError> {
    let port = exposed(&st, &h, &id, &port)?;
    let token = st.app.manager.ports.token(&id, port);
    Ok(axum::Json(json!({ "sandboxId": id, "url": base_url(&st, &h, &id, port), "token": token })).into_response())
}

/// `create_signed_preview_url(port, expires_in_seconds)`: a URL that opens the port by
/// itself until it expires (default 60 s, at most the longest sandbox lifetime).
async fn signed_preview_url(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, port)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, DtError> {
    let secs = match q.get("expiresInSeconds") {
        None => DEFAULT_SIGNED_S,
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=MAX_TIMEOUT_S).contains(s))
            .ok_or_else(|| DtError::bad(format!("expiresInSeconds must be 1 to {MAX_TIMEOUT_S}")))?,
    };
    let port = exposed(&st, &h, &id, &port)?;
    let token = st.app.manager.ports.signed_token(&id, port, crate::ports::unix_now() + secs);
    let url = format!("{}/{token}", base_url(&st, &h, &id, port));
    Ok(axum::Json(json!({ "sandboxId": id, "port": port, "token": token, "url": url })).into_response())
}

/// `expire_signed_preview_url(port, token)`: the signed URL stops working now.
async fn expire_signed(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, port, token)): Path<(String, String, String)>,
) -> Result<Response, DtError> {
    let port = exposed(&st, &h, &id, &port)?;
    if !st.app.manager.ports.revoke(&id, port, &token) {
        return Err(DtError::new(
            StatusCode::NOT_FOUND,
            format!("no signed preview URL of port {port} of sandbox {id} has that token"),
        ));
    }
    Ok(StatusCode::OK.into_response())
}
