//! Who is calling: the API key check in front of every native route, which sandboxes a
//! caller may address, the admin-only guard, and the early refusals (401, 413) that read
//! the request's body away first so the client sees them.
//!
//! Invariant: a request never reaches a handler without a `Caller` extension, and never
//! names another tenant's sandbox there (that is answered as 404, like an unknown id).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::ErrorCode;

use super::error::{ApiError, ApiResult};
use super::{AppState, MAX_JSON_BODY};
use crate::error::Error;
use crate::manager::Manager;
use crate::tenants::Caller;

/// The API key a request presents (`Authorization: Bearer …` or `X-API-Key`).
pub fn presented_key(h: &HeaderMap) -> Option<&str> {
    h.get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// The subprotocol a browser's WebSocket offers so the daemon can answer one it knows (a
/// browser cannot set `Authorization` on a WebSocket; the dashboard sends its key this way).
pub const WS_PROTOCOL: &str = "glovebox";
/// Prefix of the subprotocol that carries the key: `glovebox.bearer.<base64url(key)>`
/// (unpadded; base64url keeps any key within the token characters a subprotocol allows).
pub const WS_KEY_PROTOCOL_PREFIX: &str = "glovebox.bearer.";

/// The API key offered in `Sec-WebSocket-Protocol` as `glovebox.bearer.<base64url(key)>`.
/// Only the native API reads it there; an exposed port never does (its requests go on into
/// the sandbox, and a key must never).
pub fn websocket_protocol_key(h: &HeaderMap) -> Option<String> {
    use base64::Engine;
    h.get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_KEY_PROTOCOL_PREFIX))
        .and_then(|b| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(b.trim_end_matches('=')).ok())
        .and_then(|k| String::from_utf8(k).ok())
}

/// Whether `caller` may address sandbox `id`. Someone else's sandbox (live or ended) is
/// answered exactly like one that never existed: 404, so ids of other tenants cannot be probed.
pub fn authorize(manager: &Manager, caller: &Caller, id: &str) -> Result<(), Error> {
    match manager.owner_of(id) {
        Some(owner) if !caller.may_access(&owner) => Err(Error::SandboxNotFound(id.to_string())),
        _ => Ok(()),
    }
}

/// Refuses a caller without the admin key (`what` says what needs it).
pub fn require_admin(caller: &Caller, what: &str) -> ApiResult<()> {
    if caller.admin {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, what))
    }
}

/// The sandbox id a `/v1/sandboxes/{id}/…` path names (also without the `/v1`, as a nested
/// router sees it).
pub fn sandbox_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1").unwrap_or(path).strip_prefix("/sandboxes/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Middleware: authenticates the key, checks the sandbox the path names, and refuses a
/// JSON body declared over the limit before anyone reads it.
pub async fn auth(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let h = req.headers();
    let key = presented_key(h).map(str::to_owned).or_else(|| websocket_protocol_key(h));
    let caller = key.as_deref().and_then(|k| st.manager.tenants.authenticate(k));
    match (key, caller) {
        (_, Some(caller)) => {
            if let Some(id) = sandbox_in_path(req.uri().path()) {
                if let Err(e) = authorize(&st.manager, &caller, id) {
                    drain(req.into_body()).await;
                    return ApiError::from(e).into_response();
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
            ApiError::new(ErrorCode::Unauthorized, "invalid API key").into_response()
        }
        (None, None) => {
            drain(req.into_body()).await;
            ApiError::new(ErrorCode::Unauthorized, "missing API key (send `Authorization: Bearer <key>`)")
                .into_response()
        }
    }
}

/// Reads and drops what is left of a request body (bounded in size and time) before an
/// early error answer: a server that answers while the client is still sending resets the
/// connection, and the client then never sees the answer.
pub async fn drain(mut body: Body) {
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
    ApiError::with_status(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::InvalidRequest,
        format!("request body is larger than {} MiB; send files with PUT …/files", MAX_JSON_BODY >> 20),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_from_paths() {
        assert_eq!(sandbox_in_path("/v1/sandboxes/abc/exec"), Some("abc"));
        assert_eq!(sandbox_in_path("/sandboxes/abc"), Some("abc"));
        assert_eq!(sandbox_in_path("/v1/sandboxes"), None);
        assert_eq!(sandbox_in_path("/v1/sandboxes/"), None);
        assert_eq!(sandbox_in_path("/v1/events"), None);
    }

    #[test]
    fn keys_from_websocket_subprotocols() {
        use base64::Engine;
        let mut h = HeaderMap::new();
        assert_eq!(websocket_protocol_key(&h), None);
        let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("e2b_ab/c+d");
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, format!("glovebox, glovebox.bearer.{enc}").parse().unwrap());
        assert_eq!(websocket_protocol_key(&h).as_deref(), Some("e2b_ab/c+d"));
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, "glovebox, glovebox.bearer.!!".parse().unwrap());
        assert_eq!(websocket_protocol_key(&h), None, "not base64url");
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, "glovebox".parse().unwrap());
        assert_eq!(websocket_protocol_key(&h), None);
    }
}
