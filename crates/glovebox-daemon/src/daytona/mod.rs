//! The Daytona-compatible API: what the official `daytona` SDK speaks, mapped onto the
//! manager and `ops` (no second implementation of anything).
//!
//! Two surfaces, both under `/daytona` so nothing collides with `/v1` or E2B's routes:
//! - the control plane, `/daytona/api/sandbox…` (point `DaytonaConfig.api_url` at
//!   `http://HOST:PORT/daytona/api`);
//! - the toolbox (commands, sessions, files), `/daytona/toolbox/{id}/…`: every sandbox
//!   answers `toolboxProxyUrl = http://HOST:PORT/daytona/toolbox`, where the SDK sends it.
//!
//! Both take the API key as `Authorization: Bearer` (the daemon's admin key or a tenant's
//! key), as the SDK sends it on every request.
//!
//! Invariants: every handler authorizes first (`Key` for the control plane, `Tb` for a
//! sandbox's toolbox, which also checks the caller may address it); errors have Daytona's
//! shape (`statusCode`, `message`, `code`, `source`) so the SDK raises its own exception
//! types; what Glovebox does not do is answered with an error that says so, never ignored.

mod control;
mod files;
mod git;
mod multipart;
mod previews;
mod process;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::error::Error;
use crate::http::AppState;
use crate::manager::Sb;
use crate::tenants::Caller;

/// Where the control plane is mounted.
pub const API_PREFIX: &str = "/daytona/api";
/// Where the toolbox is mounted (followed by the sandbox id).
pub const TOOLBOX_PREFIX: &str = "/daytona/toolbox";
/// Daytona's `source` for errors raised by the in-sandbox daemon (the SDK picks precise
/// exception types by it and `code`).
const SOURCE_DAEMON: &str = "DAYTONA_DAEMON";
const SOURCE_API: &str = "DAYTONA_API";
/// Most an upload request may carry (it is read whole before the files are written).
const MAX_UPLOAD: usize = 512 << 20;

/// State of the Daytona surface: the app's, plus the sessions (named groups of commands).
#[derive(Clone)]
pub struct Daytona {
    pub app: AppState,
    sessions: Arc<Mutex<HashMap<String, process::Sessions>>>,
}

pub fn router(app: AppState) -> Router {
    let st = Daytona { app, sessions: Arc::new(Mutex::new(HashMap::new())) };
    let toolbox = Router::new()
        .merge(process::routes())
        .merge(git::routes())
        .merge(files::routes().layer(DefaultBodyLimit::max(MAX_UPLOAD)))
        .fallback(toolbox_unsupported);
    Router::new()
        .nest(API_PREFIX, control::routes().merge(previews::routes()))
        .nest(&format!("{TOOLBOX_PREFIX}/{{id}}"), toolbox)
        .with_state(st)
}

/// An error in the shape of Daytona's answers.
#[derive(Debug)]
pub struct DtError {
    pub status: StatusCode,
    pub message: String,
    /// Daytona's machine code (`FILE_NOT_FOUND`, …), when one fits.
    pub code: Option<&'static str>,
    pub source: &'static str,
}

impl DtError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> DtError {
        DtError { status, message: message.into(), code: None, source: SOURCE_API }
    }

    pub fn bad(message: impl Into<String>) -> DtError {
        DtError::new(StatusCode::BAD_REQUEST, message)
    }

    /// What Glovebox does not do (the SDK raises its base `DaytonaError` for a 501).
    pub fn unsupported(what: &str) -> DtError {
        DtError {
            code: Some("NOT_SUPPORTED"),
            ..DtError::new(StatusCode::NOT_IMPLEMENTED, format!("{what} is not supported by Glovebox"))
        }
    }

    fn daemon(status: StatusCode, code: &'static str, message: impl Into<String>) -> DtError {
        DtError { status, message: message.into(), code: Some(code), source: SOURCE_DAEMON }
    }

    fn sandbox_not_found(id: &str) -> DtError {
        DtError::new(StatusCode::NOT_FOUND, format!("Sandbox with ID or name {id} not found"))
    }
}

impl IntoResponse for DtError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({
            "statusCode": self.status.as_u16(),
            "message": self.message,
            "error": self.status.canonical_reason().unwrap_or("Error"),
            "source": self.source,
            "timestamp": crate::util::rfc3339(std::time::SystemTime::now()),
        });
        if let Some(c) = self.code {
            body["code"] = c.into();
        }
        let mut r = (self.status, axum::Json(body)).into_response();
        // The request's body may be unread; the SDK's pooled clients must not reuse this.
        r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        r
    }
}

impl From<Error> for DtError {
    fn from(e: Error) -> DtError {
        use glovebox_proto::agent::ErrorCode as C;
        let status = match &e {
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::SandboxNotFound(id) | Error::Gone { id, .. } => return DtError::sandbox_not_found(id),
            Error::NotFound { what: "command", .. } => {
                return DtError::daemon(StatusCode::NOT_FOUND, "PROCESS_NOT_FOUND", e.to_string())
            }
            Error::NotFound { .. } | Error::TemplateNotBuilt { .. } => StatusCode::NOT_FOUND,
            Error::Conflict(_) | Error::Paused(_) | Error::PausedMeanwhile(_) | Error::VolumeInUse(_) => {
                StatusCode::CONFLICT
            }
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::HibernateUnavailable(_) => StatusCode::NOT_IMPLEMENTED,
            Error::SnapshotFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::File { code, message } => {
                let (status, dc) = match code {
                    C::NotFound => (StatusCode::NOT_FOUND, "FILE_NOT_FOUND"),
                    C::PermissionDenied => (StatusCode::FORBIDDEN, "FILE_ACCESS_DENIED"),
                    C::AlreadyExists | C::NotEmpty => (StatusCode::CONFLICT, "FILE_CONFLICT"),
                    C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => {
                        (StatusCode::BAD_REQUEST, "INVALID_FILE_PATH")
                    }
                    C::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "NO_SPACE"),
                    C::Protocol | C::Io => (StatusCode::INTERNAL_SERVER_ERROR, "FILE_READ_FAILED"),
                };
                return DtError::daemon(status, dc, message.clone());
            }
            Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
                tracing::warn!("daytona: {e}");
                return DtError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error (see the daemon log)");
            }
        };
        DtError::new(status, e.to_string())
    }
}

/// Resolves the bearer key to its caller (a tenant's key, or the daemon's admin key): the
/// one place this surface decides who may manage sandboxes.
fn check_key(st: &Daytona, h: &HeaderMap) -> Result<Caller, DtError> {
    match crate::http::presented_key(h) {
        Some(k) => st
            .app
            .manager
            .tenants
            .authenticate(k.trim())
            .ok_or_else(|| DtError::new(StatusCode::UNAUTHORIZED, "Invalid API key")),
        None => Err(DtError::new(StatusCode::UNAUTHORIZED, "Missing API key (send Authorization: Bearer)")),
    }
}

/// The caller, checked to be allowed to address sandbox `id` (someone else's sandbox is
/// answered like one that never existed).
fn caller_for(st: &Daytona, h: &HeaderMap, id: &str) -> Result<Caller, DtError> {
    let caller = check_key(st, h)?;
    crate::http::authorize(&st.app.manager, &caller, id).map_err(|_| DtError::sandbox_not_found(id))?;
    Ok(caller)
}

/// A toolbox request: the live sandbox named in the path, after the key check, resumed if
/// it was stopped (paused). The sandbox counts as busy for its idle clock while this lives.
pub struct Tb {
    pub sb: Arc<Sb>,
    _busy: crate::idle::Guard,
}

impl FromRequestParts<Daytona> for Tb {
    type Rejection = DtError;

    async fn from_request_parts(parts: &mut Parts, st: &Daytona) -> Result<Self, Self::Rejection> {
        let params = RawPathParams::from_request_parts(parts, st)
            .await
            .map_err(|_| DtError::bad("missing sandbox id in the path"))?;
        let id = params.iter().find(|(k, _)| *k == "id").map(|(_, v)| v.to_string()).unwrap_or_default();
        caller_for(st, &parts.headers, &id)?;
        let sb = st.app.manager.get(&id).map_err(|_| DtError::sandbox_not_found(&id))?;
        st.app.manager.wake_for_request(&sb)?;
        let busy = sb.activity.guard();
        Ok(Tb { sb, _busy: busy })
    }
}

async fn toolbox_unsupported(uri: axum::http::Uri) -> DtError {
    let what = uri.path().split('/').filter(|s| !s.is_empty()).take(2).collect::<Vec<_>>().join("/");
    if what.starts_with("git") {
        return DtError::unsupported(&format!("/{what} (git push, pull, reset, restore, remotes and config)"));
    }
    DtError::unsupported(&format!("the toolbox endpoint /{what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_daytonas_codes() {
        let e = DtError::from(Error::File { code: glovebox_proto::agent::ErrorCode::NotFound, message: "no".into() });
        assert_eq!((e.status, e.code, e.source), (StatusCode::NOT_FOUND, Some("FILE_NOT_FOUND"), SOURCE_DAEMON));
        let e = DtError::from(Error::SandboxNotFound("abc".into()));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e.message.contains("abc"));
        assert_eq!(DtError::unsupported("x").status, StatusCode::NOT_IMPLEMENTED);
    }
}
