//! The one error type of the native API: a status, a stable code and a message. Domain
//! errors become one through their code ([`crate::error::Error::code`]); the status follows
//! from the code, except where the HTTP layer itself refuses a request (413, 415).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{ErrorBody, ErrorCode, ErrorDetail};

use crate::error::Error;

/// An error response: status + stable code + message (+ reason for `sandbox_gone`).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: ErrorDetail,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with its code's usual status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::with_status(status_of(code), code, message)
    }

    /// An error whose status says more than its code's (e.g. 413 for `invalid_request`).
    pub fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { status, detail: ErrorDetail { code, message: message.into(), reason: None } }
    }
}

/// The status each code is answered with.
fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode as C;
    match code {
        C::InvalidRequest | C::NotADirectory | C::IsADirectory | C::InvalidPath | C::SpawnFailed => {
            StatusCode::BAD_REQUEST
        }
        C::Unauthorized => StatusCode::UNAUTHORIZED,
        C::Forbidden | C::PermissionDenied => StatusCode::FORBIDDEN,
        C::NotFound
        | C::SandboxNotFound
        | C::TemplateNotFound
        | C::ContextNotFound
        | C::CommandNotFound
        | C::SecretNotFound
        | C::VolumeNotFound
        | C::SnapshotNotFound
        | C::FileNotFound => StatusCode::NOT_FOUND,
        C::SandboxGone => StatusCode::GONE,
        C::Conflict | C::SandboxPaused | C::VolumeInUse | C::FileExists | C::DirectoryNotEmpty => StatusCode::CONFLICT,
        C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        C::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
        C::BuildFailed | C::SnapshotFailed => StatusCode::UNPROCESSABLE_ENTITY,
        C::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
        C::AgentError | C::PortNotListening => StatusCode::BAD_GATEWAY,
        C::HibernateUnavailable => StatusCode::NOT_IMPLEMENTED,
        C::StartFailed | C::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(ErrorBody { error: self.detail })).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let detail = e.into_detail();
        ApiError { status: status_of(detail.code), detail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_an_error_status() {
        for c in ErrorCode::ALL {
            let s = status_of(c);
            assert!(s.is_client_error() || s.is_server_error(), "{c}: {s}");
        }
    }

    #[test]
    fn domain_errors_keep_their_codes_and_statuses() {
        let gone = ApiError::from(Error::Gone { id: "x".into(), reason: glovebox_proto::api::EndReason::Timeout });
        assert_eq!((gone.status, gone.detail.code), (StatusCode::GONE, ErrorCode::SandboxGone));
        assert_eq!(gone.detail.reason, Some(glovebox_proto::api::EndReason::Timeout));
        let internal = ApiError::from(Error::Internal("db path /secret".into()));
        assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!internal.detail.message.contains("/secret"), "details stay in the log");
        let missing = ApiError::from(Error::NotFound { what: "secret", name: "k".into() });
        assert_eq!((missing.status, missing.detail.code), (StatusCode::NOT_FOUND, ErrorCode::SecretNotFound));
        let file = ApiError::from(Error::File {
            code: glovebox_proto::agent::ErrorCode::NoSpace,
            message: "disk full".into(),
        });
        assert_eq!((file.status, file.detail.code), (StatusCode::INSUFFICIENT_STORAGE, ErrorCode::DiskFull));
    }
}
